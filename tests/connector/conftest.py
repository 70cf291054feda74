"""Shared fixtures of the connector tests: one local SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession on loopback with the UI off and few shuffle partitions.

    Spark registers ``format("pylog")`` by finding the top-level module ``pyspark_pylog`` with
    ``pkgutil.iter_modules`` in its Python workers; an editable install (``pip install -e``)
    hides the module from that scan, so the module's directory is put on the workers' path
    here, as a regular install puts it in site-packages."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    shim = tmp_path_factory.mktemp("pyspark-modules")
    (shim / "pyspark_pylog.py").symlink_to(REPO / "pyspark_pylog.py")
    paths = [str(shim), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pylog-connector-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
