"""Locating the broker-written fixtures in ``../shared/fixtures/kafka`` (read in place).

``PYLOG_KAFKA_FIXTURES`` names another directory instead (a missing one shows how the suite runs
without the fixtures: every test that needs them skips, saying why)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(
    os.environ.get("PYLOG_KAFKA_FIXTURES")
    or Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kafka"
)
ABSENT = f"Kafka fixtures not present at {ROOT} (CI checks out ../shared beside the repo)"


def require_fixtures() -> Path:
    if not (ROOT / "MANIFEST.json").is_file():
        pytest.skip(ABSENT)
    return ROOT


def manifest_logs() -> list[dict[str, Any]]:
    """The MANIFEST entries, or [] when the fixtures are absent (tests then skip)."""
    path = ROOT / "MANIFEST.json"
    if not path.is_file():
        return []
    return list(json.loads(path.read_text())["logs"])


def manifest_params(entries: list[dict[str, Any]] | None = None) -> list[Any]:
    """``entries`` (default: every MANIFEST entry) as ``pytest.param``s for a parametrization,
    each with the fixture's path as its id; without the fixtures, one parameter that skips
    saying so (an empty parameter set would skip saying only "got empty parameter set")."""
    entries = manifest_logs() if entries is None else entries
    if not entries:
        return [pytest.param(None, id="absent", marks=pytest.mark.skip(reason=ABSENT))]
    return [pytest.param(e, id=e["log"]) for e in entries]


def expected_records(entry: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (ROOT / entry["expected"]).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def b64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)
