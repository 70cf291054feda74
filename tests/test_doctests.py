"""The examples in the Python API's docstrings run, and print what they show.

The examples make their roots under ``tempfile.mkdtemp()``; here that is pytest's temporary
directory, so nothing is left behind.
"""

from __future__ import annotations

import doctest
import importlib
import tempfile
from pathlib import Path

import pytest

MODULES = ["pylog.storage.root.manager", "pylog.storage.root.reading"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True, verbose=False)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
