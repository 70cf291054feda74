"""The sink's ``timestamp`` column: a timestamp before 1970 is refused as ``Root.append`` and
Kafka's producer refuse it, naming the column and the value, and nothing is published; a null
one is the time of the write."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pylog
from pylog.connector import sink
from pylog.connector.sink_options import parse_sink_options
from pylog.storage.errors import ConfigError

REFUSED = (
    r"column 'timestamp': -60000 \(1969-12-31 23:59:00.000 UTC\) is before 1970-01-01: a record timestamp is"
)
UTC = datetime.timezone.utc


@pytest.mark.parametrize(
    "column",
    [
        pa.array([0, -60_000, 5], pa.int64()),  # a long column: epoch milliseconds
        pa.array(  # Spark's TimestampType: microseconds, UTC
            [datetime.datetime(1969, 12, 31, 23, 59, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")
        ),
    ],
)
def test_a_timestamp_before_1970_is_refused_naming_the_column(tmp_path: Path, column: pa.Array) -> None:
    o = parse_sink_options({"path": str(tmp_path), "topic": "t", "partitions": "1"}, streaming=False)
    sink.prepare_topics(o)
    rb = pa.record_batch({"value": pa.array([b"v"] * len(column)), "timestamp": column})
    with pytest.raises(ConfigError, match=REFUSED + ".*Kafka's producer refuses negative timestamps"):
        sink.stage_task(iter([rb]), o, 0, 0, 0)
    good = pa.record_batch({"value": [b"a", b"b"], "timestamp": pa.array([0, None], pa.int64())})
    before = int(datetime.datetime.now(UTC).timestamp() * 1000)
    sink.publish(o, [sink.stage_task(iter([good]), o, 0, 0, 0)], 0)
    with pylog.open(tmp_path, read_only=True) as r:
        got = r.read_table("t").column("timestamp").cast(pa.int64()).to_pylist()
    assert got[0] == 0 and got[1] >= before  # 0 is a timestamp; a null is the time of the write


def test_spark_write_of_a_timestamp_before_1970_fails_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    df = spark.sql("SELECT 'v' AS value, TIMESTAMP '1969-12-31 23:59:00 UTC' AS timestamp")
    with pytest.raises(Exception, match=REFUSED):
        df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "t").option(
            "partitions", 1
        ).save()
    with pylog.open(tmp_path, read_only=True) as r:
        assert r.read_table("t").num_rows == 0
