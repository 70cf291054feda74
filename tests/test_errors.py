"""The exception hierarchy callers match on: one module, every class exported from ``pylog``,
and the topic errors raised where users meet them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pyarrow as pa
import pytest

import pylog
from pylog.storage import errors

REPO = Path(__file__).resolve().parent.parent


def _error_classes() -> list[type[BaseException]]:
    return [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.PylogError) and c.__module__ == errors.__name__
    ]


def test_every_error_is_exported_from_pylog() -> None:
    missing = [c.__name__ for c in _error_classes() if getattr(pylog, c.__name__, None) is not c]
    assert missing == []
    assert set(c.__name__ for c in _error_classes()) <= set(pylog.__all__)


def test_errors_are_defined_in_one_module() -> None:
    """No PylogError subclass is defined outside pylog/storage/errors.py (storage/errors.py)."""
    names = {c.__name__ for c in _error_classes()}
    elsewhere = []
    for folder in ("storage", "connector", "pylog"):
        for path in (REPO / folder).rglob("*.py"):
            if path == REPO / "storage" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                    if bases & (names | {"Exception"}):
                        elsewhere.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    # a private class that never leaves its module (a parser's control flow) is no user's error
    assert all(e.split()[-1].startswith("_") for e in elsewhere), elsewhere


def test_topic_errors_are_their_own_classes(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "root") as root:
        root.create_topic("events", partitions=2)
        with pytest.raises(pylog.TopicExistsError, match="'events' already exists"):
            root.create_topic("events", partitions=2)
        with pytest.raises(pylog.UnknownTopicError, match=r"unknown topic 'nope'.*topics: events"):
            root.append("nope", pa.table({"value": [b"x"]}))
    reader = pylog.open(tmp_path / "root", read_only=True)
    with pytest.raises(pylog.UnknownTopicError):
        reader.read_table("nope")
    with pytest.raises(pylog.ReadOnlyError, match="read-only"):
        reader.create_topic("other")
    # still PylogErrors, and UnknownTopicError is a LookupError like a missing dict key
    assert issubclass(pylog.UnknownTopicError, (pylog.PylogError, LookupError))
    assert issubclass(pylog.TopicExistsError, pylog.PylogError)
