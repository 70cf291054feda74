"""The version lives in pyproject.toml only: ``pylog.__version__`` and ``pylog --version`` read it
from the installed package's metadata."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pylog
from pylog import cli

REPO = Path(__file__).resolve().parent.parent


def pyproject_version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version = "([^"]+)"$', project, flags=re.M)
    assert found, "pyproject.toml has no [project] version"
    return found.group(1)


def test_the_package_version_is_pyprojects() -> None:
    assert pylog.__version__ == pyproject_version(), "reinstall (make) after changing the version"


def test_the_cli_prints_the_same_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pylog {pylog.__version__}"
