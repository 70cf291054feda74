"""What the examples share: their working directory and the local SparkSession they reuse.

Not an example itself (``tests/test_examples.py`` runs every ``examples/*.py`` not starting
with ``_``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

LOG4J2 = Path(__file__).resolve().with_name("log4j2.properties")

OWNED = ("pylog-root", "spark-checkpoints", "kafka-log-dir", "inbox")
"""The only names an example creates (and, on a re-run, removes) inside its directory."""


def demo_dir(name: str, doc: str | None) -> Path:
    """The example's directory: the first argument, or ``demo-data/<name>`` (what ``make clean``
    removes).  Anything an earlier run of an example left there is removed; a directory holding
    other files is refused rather than touched."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("dir", nargs="?", default=f"demo-data/{name}", help="working directory (created)")
    base = Path(parser.parse_args().dir)
    if base.exists():
        foreign = sorted(p.name for p in base.iterdir() if p.name not in OWNED)
        if foreign:
            listed = ", ".join(foreign[:5])
            sys.exit(f"{base} holds files this example did not create ({listed}); choose another directory")
        for owned in OWNED:
            shutil.rmtree(base / owned, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    return base


def local_spark(app: str) -> Any:
    """A local SparkSession for the examples: 2 cores, loopback only, no UI, quiet logs, and
    ``format("pylog")`` registered.

    Spark finds the ``pylog`` data source by itself in a regular install (the top-level module
    ``pyspark_pylog``), and in the venv ``make`` creates (``scripts/spark_discovery.py``); it is
    registered explicitly here as well, which is harmless, for an editable install made by hand.
    Python workers must run this interpreter, which has pylog and pyarrow: ``PYSPARK_PYTHON``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only (and no warning about it)
    from pyspark.sql import SparkSession

    from pylog.connector import DefaultSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # short local runs: the JVM's quick compiler and a simple GC start faster on few cores;
        # Spark logs errors only (examples/log4j2.properties)
        .config(
            "spark.driver.extraJavaOptions",
            f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile={LOG4J2.as_uri()}",
        )
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DefaultSource)
    return spark


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def pylog_command() -> str:
    """How to run the ``pylog`` command from the working directory: the one installed beside
    this Python (``.venv/bin/pylog`` from the repository root), else ``pylog`` on the PATH."""
    beside = Path(sys.executable).parent / "pylog"
    return shown(beside) if beside.exists() else "pylog"
