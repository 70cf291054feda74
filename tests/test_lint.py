"""``make lint`` really checks types across modules and the layer contracts.

A copy of the package gets one planted cross-module type error in each of ``storage/``,
``connector/`` and ``pylog/``, plus imports that break two contracts; ``scripts/lint.py`` on
that copy must fail and name each of them.  (The tree itself passing is what ``make lint``,
run by ``make test`` before pytest, shows.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # scripts/lint.py, mypy and lint-imports

REPO = Path(__file__).resolve().parent.parent

PLANTED_TYPES = {
    # file -> (code appended, the line mypy must report)
    "storage/partition/log.py": (
        "\n\ndef _planted_storage() -> int:\n    return InvalidOffsetError('x')\n",
        'Incompatible return value type (got "InvalidOffsetError", expected "int")',
    ),
    "connector/options.py": (
        "\n\ndef _planted_connector() -> str:\n    return ConfigError('x')\n",
        'Incompatible return value type (got "ConfigError", expected "str")',
    ),
    "pylog/__init__.py": (
        "\n\ndef _planted_pylog() -> bytes:\n    return Root\n",
        'Incompatible return value type (got "type[Root]", expected "bytes")',
    ),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    if shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("import-linter is not installed in this environment (pip install -e '.[dev]')")
    copy = tmp_path_factory.mktemp("lint") / "repo"
    for name in ("storage", "connector", "pylog", "scripts"):
        shutil.copytree(REPO / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    for rel, (code, _) in PLANTED_TYPES.items():
        with open(copy / rel, "a") as f:
            f.write(code)
    # a codec module reaching up into maintenance, and storage importing pyspark
    with open(copy / "storage/codec/batch.py", "a") as f:
        f.write("\nfrom pylog.storage.maintenance import retention as _planted_upward  # noqa\n")
    with open(copy / "storage/partition/segment.py", "a") as f:
        f.write("\nimport pyspark as _planted_spark  # noqa\n")
    proc = subprocess.run(
        [sys.executable, str(copy / "scripts" / "lint.py"), "--root", str(copy)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_lint_fails_on_planted_errors(planted: tuple[int, str]) -> None:
    status, out = planted
    assert status != 0, out


@pytest.mark.parametrize("rel", sorted(PLANTED_TYPES))
def test_cross_module_type_error_is_reported(planted: tuple[int, str], rel: str) -> None:
    _, out = planted
    message = PLANTED_TYPES[rel][1]
    # reported at the source file's path, not at the generated tree's
    assert any(line.startswith(f"{rel}:") and message in line for line in out.splitlines()), out


@pytest.mark.parametrize(
    "contract, chain",
    [
        (
            "storage sub-packages depend only downward",
            "pylog.storage.codec.batch -> pylog.storage.maintenance",
        ),
        ("only the connector imports pyspark", "pylog.storage.partition.segment -> pyspark"),
    ],
)
def test_broken_layer_contract_is_reported(planted: tuple[int, str], contract: str, chain: str) -> None:
    _, out = planted
    assert f"{contract} BROKEN" in out, out
    assert chain in out, out
