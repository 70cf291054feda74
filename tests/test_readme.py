"""The README's Quickstart runs as written.

Its ```python blocks are read from README.md here, so they cannot drift from what the test runs,
and each is run by the venv's interpreter in a subprocess whose working directory is outside the
repository, on a fresh path: only ``/data/logs`` and ``/data/checkpoints`` are replaced by
temporary directories.  The Spark block gets what the README leaves to the reader (a session,
``events_df`` and ``static_df``) from a prelude, and no register call: Spark must find
``format("pylog")`` by itself from that directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # the README's blocks run in a fresh interpreter

REPO = Path(__file__).resolve().parents[1]


def quickstart_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def _run(code: str, tmp_path: Path, timeout: float) -> str:
    code = code.replace("/data/logs", str(tmp_path / "data" / "logs"))
    code = code.replace("/data/checkpoints", str(tmp_path / "data" / "checkpoints"))
    work = tmp_path / "cwd"  # outside the repository
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    return proc.stdout


def test_quickstart_blocks_found() -> None:
    blocks = quickstart_blocks()
    assert len(blocks) >= 2
    assert "pylog.open(" in blocks[0]
    assert 'writeStream.format("pylog")' in blocks[1]


def test_python_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    code = quickstart_blocks()[0] + textwrap.dedent(
        """
        print("rows", events.num_rows, len(df), recent.num_rows)
        """
    )
    assert "rows 2 2 2" in _run(code, tmp_path, timeout=120)  # the time range holds today's records


SPARK_PRELUDE = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable     # the README: workers run an interpreter with pylog
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
events_df = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
             .selectExpr("CAST(value % 5 AS STRING) AS user", "value"))
static_df = spark.createDataFrame([("user-9", "static")], "key string, value string")
"""

# the reading query starts at once, as the block leaves it, before the sink may have created the
# root: it reads the records once they are there (the rate source always has new rows, so the
# writing query is stopped after its first micro-batch with rows, not when nothing is new)
SPARK_POSTLUDE = """
import time
reading = clicks.writeStream.format("memory").queryName("clicks").start()
deadline = time.monotonic() + 400
while not any(p["numInputRows"] for p in query.recentProgress):
    assert query.isActive and time.monotonic() < deadline, query.exception()
    time.sleep(0.2)
query.stop()
reading.processAllAvailable()
reading.stop()
print("read", spark.table("clicks").count() > 1)
print("static", spark.read.format("pylog").option("path", "/data/logs").option("subscribe", "events")
      .load().where("value = CAST('static' AS BINARY)").count())
spark.stop()
"""


def test_spark_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    scan = "import pkgutil; print([m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_pylog'])"
    seen = subprocess.run([sys.executable, "-c", scan], cwd="/", capture_output=True, text=True, timeout=60)
    assert "pyspark_pylog" in seen.stdout, (
        "Spark's module scan does not see pyspark_pylog outside the clone: run make (it runs "
        f"scripts/spark_discovery.py for the editable install) {seen.stderr[-2000:]}"
    )
    code = SPARK_PRELUDE + quickstart_blocks()[1] + SPARK_POSTLUDE
    out = _run(code, tmp_path, timeout=600)  # a first micro-batch can take a minute on a busy machine
    assert "read True" in out and "static 1" in out, out
