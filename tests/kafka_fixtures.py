"""Locating the broker-written fixtures in ``../shared/fixtures/kafka`` (read in place)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kafka"


def require_fixtures() -> Path:
    if not (ROOT / "MANIFEST.json").is_file():
        pytest.skip(f"Kafka fixtures not present at {ROOT} (CI checks out ../shared beside the repo)")
    return ROOT


def manifest_logs() -> list[dict[str, Any]]:
    """The MANIFEST entries, or [] when the fixtures are absent (tests then skip)."""
    path = ROOT / "MANIFEST.json"
    if not path.is_file():
        return []
    return list(json.loads(path.read_text())["logs"])


def expected_records(entry: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (ROOT / entry["expected"]).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def b64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)
