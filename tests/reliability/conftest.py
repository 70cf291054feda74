"""Budgets of the reliability tests.

The default test run executes a bounded campaign; ``PYLOG_RELIABILITY_SCALE`` multiplies its
sizes (power cuts, kills, stateful examples) and ``PYLOG_FUZZ_SECONDS`` sets the fuzzing time
per target.  ``python -m tests.reliability.campaign --long`` runs the long campaign
(docs/reliability.md).
"""

from __future__ import annotations

import logging
import os

import pytest

FUZZ_TARGETS = 5
DEFAULT_FUZZ_SECONDS = 13.0  # x 5 targets = 65 s of fuzzing in the default run


def scale() -> float:
    return max(0.05, float(os.environ.get("PYLOG_RELIABILITY_SCALE", "1")))


def fuzz_seconds() -> float:
    return max(0.5, float(os.environ.get("PYLOG_FUZZ_SECONDS", str(DEFAULT_FUZZ_SECONDS))))


@pytest.fixture(autouse=True)
def _quiet_recovery_warnings() -> None:
    """Recovery reports every truncation as a warning; thousands of them are expected here."""
    logging.getLogger("pylog.storage").setLevel(logging.ERROR)
