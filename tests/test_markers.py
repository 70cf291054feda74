"""The markers ``make unit`` selects by cannot fall behind the tests (tests/conftest.py): a test
that starts a process without the ``subprocess`` marker fails at teardown naming what it
started, a marked one passes, and ``spark`` / ``s3`` follow from the fixtures a test uses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # a pytest run of its own over planted tests

REPO = Path(__file__).resolve().parent.parent

PLANTED = """
import subprocess
import sys

import pytest


def test_spawns_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.subprocess
def test_spawns_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.fixture
def spark():
    return None


def test_uses_spark(spark):
    pass


@pytest.mark.parametrize("backend", ["local", "s3"], indirect=True)
def test_on_each_backend(backend):
    pass
"""


def run_pytest(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rE", *args, str(where)],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    markers = ["spark", "s3", "subprocess", "slow"]
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    " + "\n    ".join(markers) + "\n"
    )
    (tmp_path / "test_planted.py").write_text(PLANTED)
    return tmp_path


def test_a_process_started_without_the_marker_fails_the_test(planted: Path) -> None:
    proc = run_pytest(planted, "-k", "spawns")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert out.rstrip().splitlines()[-1].startswith("2 passed, 3 deselected, 1 error"), out
    assert "ERROR test_planted.py::test_spawns_unmarked" in out, out
    assert "test_spawns_unmarked subprocess.Popen" in out and "is not marked `subprocess`" in out, out
    assert "ERROR test_planted.py::test_spawns_marked" not in out, out


def test_spark_and_s3_follow_from_the_fixtures(planted: Path) -> None:
    unit = run_pytest(planted, "--collect-only", "-m", "not spark and not s3 and not subprocess")
    assert unit.returncode == 0, unit.stdout + unit.stderr
    listed = [line for line in unit.stdout.splitlines() if "::" in line]
    assert listed == ["test_planted.py::test_spawns_unmarked", "test_planted.py::test_on_each_backend[local]"]
