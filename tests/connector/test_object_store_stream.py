"""Spark sink -> S3 -> Spark source over 200 small micro-batches, with
the embedded maintenance (compaction, merging of small segments, deletion of superseded
objects) between micro-batches: every record arrives, keys keep their latest values, and the
number of objects under the root stays bounded instead of growing with the batches."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import Backend

BATCHES = 200
ROWS = 20
KEYS = 40
PARTITIONS = 2
OBJECT_BOUND = 60
"""Objects under the root at any time, whatever the number of micro-batches: per partition
fewer than 8 small segments plus the merged ones, a few manifests and superseded objects
within the (1 s) delete delay, staged objects of the batch in flight."""


def test_streaming_round_trip_on_s3_keeps_the_object_count_bounded(
    spark: Any, s3_backend: Backend, tmp_path: Path
) -> None:
    assert s3_backend.server is not None
    backend = Backend(
        "s3", s3_backend.url, {**s3_backend.options, "pylog.file_delete_delay_ms": "1000"}, s3_backend.server
    )
    src = tmp_path / "src"
    src.mkdir()
    latest: dict[str, str] = {}
    for b in range(BATCHES):
        keys = [f"k{(b * ROWS + j) % KEYS}" for j in range(ROWS)]
        vals = [f"b{b}-{j}" for j in range(ROWS)]
        latest.update(zip(keys, vals, strict=True))
        pq.write_table(pa.table({"key": keys, "value": vals}), src / f"{b:04d}.parquet")
        # Spark's file source orders files by modification time (ms; ties in any order): a
        # second apart, they are written to the topic in this order, the latest value last
        os.utime(src / f"{b:04d}.parquet", (time.time() - BATCHES + b,) * 2)
    with backend.open() as r:
        r.create_topic(
            "kv",
            PARTITIONS,
            config={"cleanup.policy": "compact", "segment.bytes": 64 << 10, "min.cleanable.dirty.ratio": 0.2},
        )

    fs = backend.server.filesystem()
    prefix = backend.url[len("s3://") :]
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            counts.append(len(fs.find(prefix)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    q = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src))
        .writeStream.format("pylog")
        .options(**backend.spark_options())
        .option("topic", "kv")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(900)
    assert q.exception() is None, q.exception()
    batches = q.lastProgress["batchId"] + 1
    elapsed = time.monotonic() - t0
    done.set()
    sampler.join()
    final = len(fs.find(prefix))
    print(f"\n{BATCHES} micro-batches in {elapsed:.0f}s: objects max {max(counts)} final {final}")
    assert batches == BATCHES  # one micro-batch per file
    assert max([*counts, final]) <= OBJECT_BOUND, (max(counts), final)

    with backend.open(read_only=True) as r:
        segments = sum(len(r.log("kv", p).segments) for p in range(PARTITIONS))
        assert segments <= PARTITIONS * 12, segments  # merged: not one segment per micro-batch
        assert r.last_committed_batch(_sink_id(r)) == BATCHES - 1

    # the Spark source reads it back: every key's latest value (older ones compacted or not)
    out = (
        spark.read.format("pylog")
        .options(**backend.spark_options())
        .option("subscribe", "kv")
        .load()
        .selectExpr("cast(key as string) key", "cast(value as string) value", "partition", "offset")
        .collect()
    )
    got: dict[str, str] = {}
    last: dict[int, int] = {}
    for row in sorted(out, key=lambda r: (r.partition, r.offset)):
        assert row.offset > last.get(row.partition, -1)  # in order, no duplicates
        last[row.partition] = row.offset
        got[row.key] = row.value
    assert got == latest
    assert len(out) >= KEYS


def _sink_id(root: Any) -> str:
    queries = root._state.queries  # keyed by the streaming query's id
    assert len(queries) == 1, queries
    return str(next(iter(queries)))


def test_a_large_write_to_s3_is_adopted_by_the_commit_and_reads_back(spark: Any, s3_backend: Backend) -> None:
    """A batch write whose tasks stage more than the 4 MiB that travel in commit messages: the
    tasks upload staged segments and the commit adopts them (their base offsets an overlay in
    the state), and Spark's source reads every row back, in order, once."""
    rows = 48_000  # 2 tasks of ~6 MiB each
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "cast(id as string) as key", "concat(lpad(cast(id as string), 8, '0'), repeat('x', 250)) as value"
    )
    (
        df.write.format("pylog")
        .options(**s3_backend.spark_options())
        .option("topic", "big")
        .option("partitions", "1")
        .mode("append")
        .save()
    )
    with s3_backend.open(read_only=True) as r:
        adopted = [p for p, ref in r.storage.snapshot.files.items() if ref.patch is not None]
        assert adopted and all(p.startswith("big-0/") and p.endswith(".log") for p in adopted)
    got = (
        spark.read.format("pylog")
        .options(**s3_backend.spark_options())
        .option("subscribe", "big")
        .load()
        .selectExpr("offset", "cast(value as string) v")
        .orderBy("offset")
        .collect()
    )
    assert [r.offset for r in got] == list(range(rows))
    assert sorted(int(r.v[:8]) for r in got) == list(range(rows))  # every row once
