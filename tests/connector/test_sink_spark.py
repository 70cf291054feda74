"""The pylog sink on a real local SparkSession: exactly-once under failures and replays,
concurrent queries, batch writes, and the round trip through the pylog source."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pylog.storage.codec.partitioner import partition_for_keys
from tests.conftest import Backend


def values_in(backend: Backend, topic: str = "t") -> list[bytes]:
    with backend.open(read_only=True) as r:
        return r.read_table(topic).column("value").to_pylist()


def write_memory_stream(
    spark: Any, backend: Backend, ck: Path, rows: list[tuple[str, str]], **opts: str
) -> None:
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
        .options(**backend.spark_options())
        .option("topic", "t")
        .option("checkpointLocation", str(ck))
        .options(**opts)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def test_batch_write_append_overwrite_and_modes(spark: Any, backend: Backend) -> None:
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(100)], "key string, value string")
    df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").option(
        "partitions", "3"
    ).mode("append").save()
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
        assert r.partitions("t") == 3
    assert sorted(t.column("value").to_pylist()) == sorted(f"v{i}".encode() for i in range(100))
    # keys land in Kafka's murmur2 partitions (as the Java producer would choose)
    assert t.column("partition").to_pylist() == partition_for_keys(t.column("key"), 3).tolist()
    df.limit(5).write.format("pylog").options(**backend.spark_options()).option("topic", "t").mode(
        "overwrite"
    ).save()
    assert len(values_in(backend)) == 5
    with pytest.raises(Exception, match=r"mode|UNSUPPORTED"):
        df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").save()


def test_bad_schema_fails_before_any_byte(spark: Any, backend: Backend) -> None:
    with backend.open() as r:
        r.create_topic("t")
    df = spark.createDataFrame([(1,)], "v int")
    with pytest.raises(Exception, match="value"):
        df.write.format("pylog").options(**backend.spark_options()).option("topic", "t").mode("append").save()
    with pytest.raises(Exception, match="does not exist"):
        spark.createDataFrame([("x",)], "value string").write.format("pylog").options(
            **backend.spark_options()
        ).option("topic", "missing").mode("append").save()
    assert values_in(backend) == []


def test_stream_restart_and_replayed_batch_is_skipped(spark: Any, backend: Backend, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    rows = [(f"k{i % 7}", f"v{i}") for i in range(50)]
    write_memory_stream(spark, backend, ck, rows, partitions="2")
    write_memory_stream(spark, backend, ck, [(f"k{i}", f"w{i}") for i in range(30)])
    assert len(values_in(backend)) == 80
    # (b) lose the last commit record: Spark replays that batch; the sink skips it
    commits = sorted((ck / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.parent / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    write_memory_stream(spark, backend, ck, [])
    vals = values_in(backend)
    assert len(vals) == len(set(vals)) == 80


def test_failed_task_leaves_nothing_and_the_retry_lands_once(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """(a) a task of the batch fails: the batch is not committed and nothing of it is visible;
    the restarted query runs it again and every row lands once."""
    ck = tmp_path / "ck"
    with backend.open() as r:
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
            .options(**backend.spark_options())
            .option("topic", "t")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(Exception):  # the injected failure, checked below
            q.awaitTermination(300)
        if attempt == 0:
            assert q.exception() is not None
            assert values_in(backend) == []
        else:
            assert q.exception() is None, q.exception()
    with backend.open(read_only=True) as r:  # staged files: partition files or objects beside them
        staged = [n for p in range(2) for n in r.storage.listdir_staged(f"t-{p}")]
    assert staged == []  # the failed attempt's leftovers were swept
    vals = values_in(backend)
    assert sorted(vals) == sorted(f"v{i}".encode() for i in range(40))


CRASH_QUERY = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    import json
    root, ck, src = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    df = spark.readStream.schema("key string, value string").parquet(src + "/*")
    q = (df.writeStream.format("pylog").options(**root).option("topic", "t").option("partitions", "2")
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(300)
    sys.exit(0 if q.exception() is None else 3)
""")


CRASH_STEPS = {  # the step of a sink commit just before / after its atomic record
    "before-record": {"local": "flushed", "s3": "uploaded"},  # data written, not yet recorded
    "after-record": {"local": "state-written", "s3": "manifest-created"},  # recorded, not cleaned up
}


@pytest.mark.parametrize("when", sorted(CRASH_STEPS))
def test_crash_inside_commit_at_each_step(spark: Any, backend: Backend, tmp_path: Path, when: str) -> None:
    """(c) the process running the commit dies at each step of the publish (on local disk the
    state file replacement is the atomic record, on an object store the manifest creation);
    after restart every input row is readable exactly once."""
    step = CRASH_STEPS[when][backend.name]
    ck, src = tmp_path / "ck", tmp_path / "src"
    spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(60)], "key string, value string").write.parquet(
        str(src / "p0")
    )
    env = {**os.environ, "PYLOG_TEST_CRASH_AT_STEP": step}
    first = subprocess.run(
        [sys.executable, "-c", CRASH_QUERY, json.dumps(backend.spark_options()), str(ck), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode != 0, first.stderr[-3000:]  # the commit died
    # ... at that step: before the atomic record nothing of the batch is visible, after it all is
    assert len(values_in(backend)) == (0 if when == "before-record" else 60)
    # restart (in this process's session: a fresh JVM was only needed for the crash)
    df = spark.readStream.schema("key string, value string").parquet(str(src / "*"))
    q = (
        df.writeStream.format("pylog")
        .options(**backend.spark_options())
        .option("topic", "t")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    vals = values_in(backend)
    assert sorted(vals) == sorted(f"v{i}".encode() for i in range(60))


def test_two_concurrent_queries_same_topic(spark: Any, backend: Backend, tmp_path: Path) -> None:
    """(d) two queries write the same topic at once: all rows of both, none twice, offsets
    strictly increasing per partition (on local disk the writers take turns with the lock; on
    an object store the loser of a manifest race runs its publish again)."""
    with backend.open() as r:
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
            .options(**backend.spark_options())
            .option("topic", "t")
            .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
            .trigger(availableNow=True)
            .start()
        )
    for q in queries:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
    vals = values_in(backend)
    assert len(vals) == len(set(vals)) == 2 * 3 * 30
    with backend.open(read_only=True) as r:
        for p in range(2):
            offs = r.read_table("t", [p]).column("offset").to_pylist()
            assert offs == list(range(len(offs)))


def test_round_trip_through_the_pylog_source(spark: Any, backend: Backend, tmp_path: Path) -> None:
    rows = [(f"key-{i % 13}", f"value-{i}") for i in range(200)]
    write_memory_stream(spark, backend, tmp_path / "ck", rows, partitions="4")
    back = spark.read.format("pylog").options(**backend.spark_options()).option("subscribe", "t").load()
    got = back.selectExpr("cast(key as string) k", "cast(value as string) v", "partition").collect()
    assert sorted((r.k, r.v) for r in got) == sorted(rows)
    keys = pa.array([r.k.encode() for r in got])
    assert [r.partition for r in got] == partition_for_keys(keys, 4).tolist()
    shutil.rmtree(tmp_path / "ck-src", ignore_errors=True)


def test_embedded_compaction_between_micro_batches(spark: Any, backend: Backend, tmp_path: Path) -> None:
    """A keyed stream with overwrites and tombstones into a compacted
    topic with small segments: compaction runs after the publishes, a streaming reader running
    at the same time never fails and ends with every key's latest value, and the log stays
    bounded."""
    src = tmp_path / "src"
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
        for f in (src / f"p{b}").iterdir():  # the file source's order: by modification time
            os.utime(f, (time.time() - 8 + b,) * 2)
    with backend.open() as r:
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
        .options(**backend.spark_options())
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
        .options(**backend.spark_options())
        .option("topic", "kv")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    w.awaitTermination(300)
    assert w.exception() is None, w.exception()
    with backend.open(read_only=True) as r:
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
    with backend.open(read_only=True) as r:
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


@pytest.mark.parametrize("direct", ["true", "false"])
def test_large_write_is_linked_not_copied_by_the_driver(spark: Any, tmp_path: Path, direct: str) -> None:
    """On a local disk each task stages segments with their indexes and the driver's commit
    links them (patching base offsets, renaming): the rows of two 15 MiB tasks become two segments
    of the log (copied, they would fill one 32 MiB segment), with consecutive offsets, valid
    indexes and no staged file left; staged around the page cache or through it (directWrites)."""
    import pylog
    from pylog.tools.inspect import verify

    root = tmp_path / "root"
    df = spark.range(0, 30_000, numPartitions=2).selectExpr(
        "cast(id as string) as key", "concat(lpad(cast(id as string), 8, '0'), repeat('x', 1000)) as value"
    )
    (
        df.write.format("pylog")
        .option("path", str(root))
        .option("topic", "big")
        .option("partitions", "1")
        .option("segment.bytes", str(32 << 20))
        .option("directWrites", direct)
        .mode("append")
        .save()
    )
    d = root / "big-0"
    assert not [p.name for p in d.iterdir() if p.name.startswith(".pylog")]
    assert sorted(p.name for p in d.glob("*.log")) == [f"{0:020d}.log", f"{15_000:020d}.log"]
    with pylog.open(root, read_only=True) as r:
        t = r.read_table("big")
        assert t["offset"].to_pylist() == list(range(30_000))
        assert [v[:8] for v in t["value"].to_pylist()] == [b"%08d" % i for i in range(30_000)]
        problems, _ = verify(r)
        assert not problems, problems
