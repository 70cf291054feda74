"""The local SparkSession every Spark benchmark runs in (2 cores, loopback, quiet)."""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession


def local_spark(app: str, *sources: Any, **conf: str) -> SparkSession:
    """``local[2]`` on 127.0.0.1 without UI or progress bars, with ``conf`` (Spark keys with
    dots written as ``__``: ``spark__sql__shuffle__partitions="2"``) and the data ``sources``
    registered."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for source in sources:
        spark.dataSource.register(source)
    return spark
