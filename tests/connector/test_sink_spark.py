"""The pylog sink on a real local SparkSession: exactly-once under failures and replays,
concurrent queries, batch writes, and the round trip through the pylog source."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pylog
from pylog.storage.partitioner import partition_for_keys


def values_in(root: Path, topic: str = "t") -> list[bytes]:
    with pylog.open(root, read_only=True) as r:
        return r.read_table(topic).column("value").to_pylist()


def write_memory_stream(spark: Any, root: Path, ck: Path, rows: list[tuple[str, str]], **opts: str) -> None:
    """Stream ``rows`` (key, value) through the pylog sink with an availableNow trigger."""
    src = ck.parent / f"{ck.name}-src"
    src.mkdir(parents=True, exist_ok=True)
    n = len(list(src.iterdir()))
    spark.createDataFrame(rows, "key string, value string").write.mode("overwrite").parquet(
        str(src / f"part{n}")
    )
    df = spark.readStream.schema("key string, value string").parquet(str(src / "*"))
    q = (
        df.writeStream.format("pylog")
        .option("path", str(root))
        .option("topic", "t")
        .option("checkpointLocation", str(ck))
        .options(**opts)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def test_batch_write_append_overwrite_and_modes(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(100)], "key string, value string")
    df.write.format("pylog").option("path", str(tmp_path)).option("topic", "t").option(
        "partitions", "3"
    ).mode("append").save()
    with pylog.open(tmp_path, read_only=True) as r:
        t = r.read_table("t")
        assert r.partitions("t") == 3
    assert sorted(t.column("value").to_pylist()) == sorted(f"v{i}".encode() for i in range(100))
    # keys land in Kafka's murmur2 partitions (as the Java producer would choose)
    assert t.column("partition").to_pylist() == partition_for_keys(t.column("key"), 3).tolist()
    df.limit(5).write.format("pylog").option("path", str(tmp_path)).option("topic", "t").mode(
        "overwrite"
    ).save()
    assert len(values_in(tmp_path)) == 5
    with pytest.raises(Exception, match=r"mode|UNSUPPORTED"):
        df.write.format("pylog").option("path", str(tmp_path)).option("topic", "t").save()


def test_bad_schema_fails_before_any_byte(spark: Any, tmp_path: Path) -> None:
    with pylog.open(tmp_path) as r:
        r.create_topic("t")
    df = spark.createDataFrame([(1,)], "v int")
    with pytest.raises(Exception, match="value"):
        df.write.format("pylog").option("path", str(tmp_path)).option("topic", "t").mode("append").save()
    with pytest.raises(Exception, match="does not exist"):
        spark.createDataFrame([("x",)], "value string").write.format("pylog").option(
            "path", str(tmp_path)
        ).option("topic", "missing").mode("append").save()
    assert values_in(tmp_path) == []


def test_stream_restart_and_replayed_batch_is_skipped(spark: Any, tmp_path: Path) -> None:
    root, ck = tmp_path / "root", tmp_path / "ck"
    rows = [(f"k{i % 7}", f"v{i}") for i in range(50)]
    write_memory_stream(spark, root, ck, rows, partitions="2")
    write_memory_stream(spark, root, ck, [(f"k{i}", f"w{i}") for i in range(30)])
    assert len(values_in(root)) == 80
    # (b) lose the last commit record: Spark replays that batch; the sink skips it
    commits = sorted((ck / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.parent / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    write_memory_stream(spark, root, ck, [])
    vals = values_in(root)
    assert len(vals) == len(set(vals)) == 80


def test_failed_task_leaves_nothing_and_the_retry_lands_once(spark: Any, tmp_path: Path) -> None:
    """(a) a task of the batch fails: the batch is not committed and nothing of it is visible;
    the restarted query runs it again and every row lands once."""
    root, ck = tmp_path / "root", tmp_path / "ck"
    with pylog.open(root) as r:
        r.create_topic("t", 2)
    marker = tmp_path / "fail-once"
    marker.write_text("x")
    src = tmp_path / "src"
    spark.createDataFrame([(f"v{i}",) for i in range(40)], "value string").repartition(2).write.parquet(
        str(src / "p0")
    )

    def fail_once(it: Any) -> Any:
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1 and os.path.exists(str(marker)):
            os.unlink(str(marker))
            raise RuntimeError("injected task failure")
        yield from it

    df = spark.readStream.schema("value string").parquet(str(src / "*"))
    df = df.mapInArrow(fail_once, df.schema)
    for attempt in range(2):
        q = (
            df.writeStream.format("pylog")
            .option("path", str(root))
            .option("topic", "t")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(Exception):  # the injected failure, checked below
            q.awaitTermination(300)
        if attempt == 0:
            assert q.exception() is not None
            assert values_in(root) == []
        else:
            assert q.exception() is None, q.exception()
    staged = [p.name for d in root.glob("t-*") for p in d.iterdir() if p.name.startswith(".pylog-stage")]
    assert staged == []  # the failed attempt's leftovers were swept
    vals = values_in(root)
    assert sorted(vals) == sorted(f"v{i}".encode() for i in range(40))


CRASH_QUERY = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    root, ck, src = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    df = spark.readStream.schema("key string, value string").parquet(src + "/*")
    q = (df.writeStream.format("pylog").option("path", root).option("topic", "t").option("partitions", "2")
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(300)
    sys.exit(0 if q.exception() is None else 3)
""")


@pytest.mark.parametrize("step", ["flushed", "state-written"])  # before / after the atomic record
def test_crash_inside_commit_at_each_step(spark: Any, tmp_path: Path, step: str) -> None:
    """(c) the process running the commit dies at each step of the publish; after restart
    every input row is readable exactly once."""
    root, ck, src = tmp_path / "root", tmp_path / "ck", tmp_path / "src"
    spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(60)], "key string, value string").write.parquet(
        str(src / "p0")
    )
    env = {**os.environ, "PYLOG_TEST_CRASH_AT_STEP": step}
    first = subprocess.run(
        [sys.executable, "-c", CRASH_QUERY, str(root), str(ck), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode != 0  # the commit died
    # restart (in this process's session: a fresh JVM was only needed for the crash)
    df = spark.readStream.schema("key string, value string").parquet(str(src / "*"))
    q = (
        df.writeStream.format("pylog")
        .option("path", str(root))
        .option("topic", "t")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    vals = values_in(root)
    assert sorted(vals) == sorted(f"v{i}".encode() for i in range(60))


def test_two_concurrent_queries_same_topic(spark: Any, tmp_path: Path) -> None:
    """(d) two queries write the same topic at once: all rows of both, none twice, offsets
    strictly increasing per partition."""
    root = tmp_path / "root"
    with pylog.open(root) as r:
        r.create_topic("t", 2)
    queries = []
    for name in ("a", "b"):
        src = tmp_path / f"src-{name}"
        for part in range(3):
            spark.createDataFrame([(f"{name}{part}-{i}",) for i in range(30)], "value string").write.parquet(
                str(src / f"p{part}")
            )
        df = spark.readStream.schema("value string").option("maxFilesPerTrigger", 1).parquet(str(src / "*"))
        queries.append(
            df.writeStream.format("pylog")
            .option("path", str(root))
            .option("topic", "t")
            .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
            .trigger(availableNow=True)
            .start()
        )
    for q in queries:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
    vals = values_in(root)
    assert len(vals) == len(set(vals)) == 2 * 3 * 30
    with pylog.open(root, read_only=True) as r:
        for p in range(2):
            offs = r.read_table("t", [p]).column("offset").to_pylist()
            assert offs == list(range(len(offs)))


def test_round_trip_through_the_pylog_source(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    rows = [(f"key-{i % 13}", f"value-{i}") for i in range(200)]
    write_memory_stream(spark, root, tmp_path / "ck", rows, partitions="4")
    back = spark.read.format("pylog").option("path", str(root)).option("subscribe", "t").load()
    got = back.selectExpr("cast(key as string) k", "cast(value as string) v", "partition").collect()
    assert sorted((r.k, r.v) for r in got) == sorted(rows)
    keys = pa.array([r.k.encode() for r in got])
    assert [r.partition for r in got] == partition_for_keys(keys, 4).tolist()
    shutil.rmtree(tmp_path / "ck-src", ignore_errors=True)


def test_embedded_compaction_between_micro_batches(spark: Any, tmp_path: Path) -> None:
    """Issue #6 acceptance 3: a keyed stream with overwrites and tombstones into a compacted
    topic with small segments: compaction runs after the publishes, a streaming reader running
    at the same time never fails and ends with every key's latest value, and the log stays
    bounded."""
    root, src = tmp_path / "root", tmp_path / "src"
    keys = [f"k{i}" for i in range(10)]
    latest: dict[str, str | None] = {}
    for b in range(8):
        rows = []
        for j in range(60):
            k = keys[j % 10]
            v = None if (b == 5 and k == "k3") else f"b{b}-{j}"
            rows.append((k, v))
            latest[k] = v
        spark.createDataFrame(rows, "key string, value string").coalesce(1).write.parquet(str(src / f"p{b}"))
    with pylog.open(root) as r:
        r.create_topic(
            "kv",
            1,
            config={
                "cleanup.policy": "compact",
                "segment.bytes": 1500,
                "min.cleanable.dirty.ratio": 0.01,
                "delete.retention.ms": 3_600_000,
            },
        )
    reader = (
        spark.readStream.format("pylog")
        .option("path", str(root))
        .option("subscribe", "kv")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("cast(key as string) key", "cast(value as string) value", "offset")
        .writeStream.format("memory")
        .queryName("kv_reader")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    df = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src / "*"))
    )
    w = (
        df.writeStream.format("pylog")
        .option("path", str(root))
        .option("topic", "kv")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    w.awaitTermination(300)
    assert w.exception() is None, w.exception()
    with pylog.open(root, read_only=True) as r:
        end = r.log("kv", 0).log_end_offset
    for _ in range(300):
        seen = spark.sql("select max(offset) m from kv_reader").collect()[0].m
        if seen is not None and seen >= end - 1:
            break
        reader.awaitTermination(0.2)
    assert reader.exception() is None, reader.exception()
    reader.stop()
    # the reader saw, for every key, its latest value last (compaction never removes a latest value)
    got = {r.key: r.value for r in spark.sql("select * from kv_reader order by offset").collect()}
    assert got == latest
    with pylog.open(root, read_only=True) as r:
        t = r.read_table("kv")
        size = r.log("kv", 0).size
    assert t.num_rows < 8 * 60 / 2  # compacted while the stream ran
    assert {
        k: v.decode() if v is not None else None
        for k, v in zip(
            [x.decode() for x in t.column("key").to_pylist()], t.column("value").to_pylist(), strict=True
        )
    } == latest
    assert size < 8 * 60 * 30  # bounded: far below the bytes written (~8 x 60 records)
