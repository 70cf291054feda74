"""A table appended through the Python API (``pylog.open(...).append``)
is read back identically by the Spark source, on local disk and on S3."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pyarrow as pa

from tests.conftest import Backend

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def test_api_appended_table_reads_back_identically_through_spark(spark: Any, backend: Backend) -> None:
    n = 300
    base = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    table = pa.table(
        {
            "key": pa.array([None if i % 17 == 0 else b"key-%d" % (i % 23) for i in range(n)], pa.binary()),
            "value": pa.array([None if i % 29 == 0 else f"v{i}".encode() * (i % 5) for i in range(n)]),
            "timestamp": pa.array(
                [base + dt.timedelta(milliseconds=7 * i) for i in range(n)], pa.timestamp("ms")
            ),
            "headers": pa.array(
                [[{"key": "h", "value": b"%d" % i}] * (i % 3) for i in range(n)], type=HEADERS
            ),
        }
    )
    with backend.open() as root:
        root.create_topic("api", 3)
        root.append("api", table.slice(0, 120))
        root.append("api", table.slice(120), codec="zstd")
        expected = root.read_table("api")
    assert expected.num_rows == n
    df = (
        spark.read.format("pylog")
        .options(**backend.spark_options())
        .option("subscribe", "api")
        .option("includeHeaders", "true")
        .load()
    )
    got = pa.Table.from_pylist(
        [r.asDict(recursive=True) for r in df.orderBy("partition", "offset").collect()]
    )
    rows = sorted(expected.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    spark_rows = got.to_pylist()
    assert len(spark_rows) == n
    for want, have in zip(rows, spark_rows, strict=True):
        assert have["key"] == want["key"] and have["value"] == want["value"]
        assert (have["topic"], have["partition"], have["offset"]) == (
            want["topic"],
            want["partition"],
            want["offset"],
        )
        assert have["timestamp"].timestamp() == want["timestamp"].timestamp()  # same instant, ms
        assert have["timestampType"] == want["timestampType"]
        assert [(h["key"], h["value"]) for h in have["headers"] or []] == [
            (h["key"], h["value"]) for h in want["headers"] or []
        ]
    # every appended record is there once, with its key, value, timestamp and headers
    src = Counter(
        (
            r["key"],
            r["value"],
            r["timestamp"].replace(tzinfo=dt.UTC),
            tuple((h["key"], h["value"]) for h in r["headers"]),
        )
        for r in table.to_pylist()
    )
    read = Counter(
        (r["key"], r["value"], r["timestamp"], tuple((h["key"], h["value"]) for h in r["headers"] or []))
        for r in rows
    )
    assert src == read
