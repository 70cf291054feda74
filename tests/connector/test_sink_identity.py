"""The sink on a real SparkSession (local disk and S3): exactly-once keyed by Spark's streaming
query id, and Kafka's producer and broker rules on the sink path (partition column, null-key
spreading, LogAppendTime, compacted topics)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from pylog.storage.root import publish as pub
from tests.conftest import Backend
from tests.connector.test_sink_spark import values_in, write_memory_stream


def _drop_last_commit(ck: Path) -> None:
    """Lose the record of the last completed batch: Spark runs that batch again."""
    commits = sorted((ck / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.parent / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()


def _query_id(ck: Path) -> str:
    return str(json.loads((ck / "metadata").read_text())["id"])


def test_reset_checkpoint_is_a_new_query_and_all_its_rows_land(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    write_memory_stream(spark, backend, ck, [(f"k{i}", f"a{i}") for i in range(40)], partitions="2")
    write_memory_stream(spark, backend, ck, [(f"k{i}", f"b{i}") for i in range(40)])
    first = _query_id(ck)
    # start over: a fresh checkpoint (and source) at the same location; its batches 0, 1 are new
    shutil.rmtree(ck)
    shutil.rmtree(tmp_path / "ck-src")
    write_memory_stream(spark, backend, ck, [(f"k{i}", f"c{i}") for i in range(30)])
    write_memory_stream(spark, backend, ck, [(f"k{i}", f"d{i}") for i in range(30)])
    assert _query_id(ck) != first
    vals = values_in(backend)
    assert len(vals) == len(set(vals)) == 140
    with backend.open(read_only=True) as r:
        state = pub.read_state(r.storage)
    assert {q: rec.batch for q, rec in state.queries.items()} == {first: 1, _query_id(ck): 1}


def test_checkpoint_from_the_session_conf_dedupes_a_replay(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """No ``checkpointLocation`` option: Spark puts the checkpoint under
    ``spark.sql.streaming.checkpointLocation``/<queryName>; the restarted query is the same
    query, and its replayed batch is skipped."""
    src = tmp_path / "src"
    with backend.open() as r:
        r.create_topic("t", 2)

    def run(part: int, n: int) -> None:
        if n:
            spark.createDataFrame([(f"v{part}-{i}",) for i in range(n)], "value string").write.parquet(
                str(src / f"p{part}")
            )
        df = spark.readStream.schema("value string").parquet(str(src / "*"))
        q = (
            df.writeStream.format("pylog")
            .options(**backend.spark_options())
            .option("topic", "t")
            .queryName("conf_ck_query")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()

    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "cks"))
    try:
        run(0, 50)
        run(1, 30)
        ck = tmp_path / "cks" / "conf_ck_query"
        assert (ck / "commits").is_dir()
        _drop_last_commit(ck)
        run(2, 0)  # the replay of batch 1
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    vals = values_in(backend)
    assert len(vals) == len(set(vals)) == 80


def test_null_keys_of_a_one_task_micro_batch_spread_over_partitions(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    with backend.open() as r:
        r.create_topic("t", 4)
    src = tmp_path / "src"
    # one file, one task; 100 KiB of null-key records: several record batches of Kafka's size
    spark.createDataFrame([("x" * 100 + str(i),) for i in range(1000)], "value string").coalesce(
        1
    ).write.parquet(str(src / "p0"))
    df = spark.readStream.schema("value string").parquet(str(src / "*"))
    q = (
        df.writeStream.format("pylog")
        .options(**backend.spark_options())
        .option("topic", "t")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    assert t.num_rows == 1000
    per_partition = [t.column("partition").to_pylist().count(p) for p in range(4)]
    assert sum(1 for c in per_partition if c) >= 3, per_partition  # sticky, not all on one
    assert max(per_partition) < 600, per_partition


def test_partition_column_rules(spark: Any, backend: Backend) -> None:
    with backend.open() as r:
        r.create_topic("t", 3)

    def write(df: Any) -> None:
        df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").mode("append").save()

    with pytest.raises(Exception, match=r"-1 is not in the range \[0\.\.\.3\)"):
        write(spark.createDataFrame([("a", 0), ("b", -1)], "value string, partition int"))
    with pytest.raises(Exception, match=r"3 is not in the range \[0\.\.\.3\)"):
        write(spark.createDataFrame([("a", 3)], "value string, partition int"))
    with pytest.raises(Exception, match="column 'partition' must be int"):
        write(spark.createDataFrame([("a", 1)], "value string, partition long"))
    assert values_in(backend) == []
    write(spark.createDataFrame([("a", 2), ("b", None)], "value string, partition int"))
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    got = dict(zip(t.column("value").to_pylist(), t.column("partition").to_pylist(), strict=True))
    assert got[b"a"] == 2 and len(got) == 2


def test_log_append_time_topic_gets_the_append_time(spark: Any, backend: Backend) -> None:
    with backend.open() as r:
        r.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    old = dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
    spark.createDataFrame([("a", old), ("b", old)], "value string, timestamp timestamp").write.format(
        "pylog"
    ).options(**backend.spark_options()).option("topic", "t").mode("append").save()
    after = int(time.time() * 1000)
    back = spark.read.format("pylog").options(**backend.spark_options()).option("subscribe", "t").load()
    rows = back.selectExpr("cast(timestamp as long) * 1000 as ts", "timestampType").collect()
    assert len(rows) == 2
    assert all(r.timestampType == 1 for r in rows)
    assert all(before // 1000 * 1000 <= r.ts <= after for r in rows), (before, after, rows)


def test_compacted_topic_refuses_null_keys(spark: Any, backend: Backend) -> None:
    with backend.open() as r:
        r.create_topic("t", 2, {"cleanup.policy": "compact"})

    def write(df: Any) -> None:
        df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").mode("append").save()

    with pytest.raises(Exception, match="compacted topic"):
        write(spark.createDataFrame([("k", "a"), (None, "b")], "key string, value string"))
    with pytest.raises(Exception, match="compacted topic"):
        write(spark.createDataFrame([("a",)], "value string"))
    assert values_in(backend) == []
    write(spark.createDataFrame([("k", "a")], "key string, value string"))
    assert values_in(backend) == [b"a"]


def test_batch_writes_are_never_skipped_and_leave_no_record(spark: Any, backend: Backend) -> None:
    df = spark.createDataFrame([("a",), ("b",)], "value string")
    for _ in range(3):
        df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").option(
            "partitions", "1"
        ).mode("append").save()
    assert sorted(values_in(backend)) == [b"a", b"a", b"a", b"b", b"b", b"b"]
    with backend.open(read_only=True) as r:
        state = pub.read_state(r.storage)
    assert state.queries == {}
