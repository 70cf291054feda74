"""Per-trigger cost of the streaming source against the partition count.

    python bench/spark_triggers.py [--quick] [--s3-only]

One-record micro-batches (``maxOffsetsPerTrigger=1``, ``trigger(availableNow=True)``, into
Spark's ``noop`` sink) from a topic of 1, 16 and 128 partitions: 40 records to read, all in
partition 0, read from the earliest; every other partition holds 1,000 records and is read
from the latest (so it has data, segments and indexes, but nothing new), against a storage-free Python
source with the same partitions and offsets in the same SparkSession (what any Python source
costs per micro-batch: Spark's planning, one task, the offset and commit logs).

Then the requests of an idle stream on S3 (moto's server on 127.0.0.1): a stream over a topic of
16 partitions with nothing new, triggered every 200 ms for 10 s; every request the server
receives is counted (driver and tasks alike), and divided by the triggers (elapsed / interval).

Prints a table and, as its last line, JSON with the milliseconds per micro-batch of each and
their ratio, and the S3 requests per idle trigger.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
from _spark import local_spark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

import pylog
from pylog.connector.datasource import spark_schema
from pylog.connector.scan import arrow_schema

RECORDS = 40
T0 = 1_700_000_000_000


def counts_for(partitions: int) -> list[int]:
    # every record in partition 0 (with records in k partitions, Kafka's rate limit admits one
    # from each per trigger: k-record micro-batches); the other partitions are empty
    return [RECORDS] + [0] * (partitions - 1)


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per partition as pylog's; each micro-batch admits ``limit`` more rows."""

    def __init__(self, counts: list[int]):
        self.counts = counts

    def initialOffset(self) -> dict[str, Any]:
        return {"t": {str(p): 0 for p in range(len(self.counts))}}

    def getDefaultReadLimit(self) -> ReadMaxRows:
        return ReadMaxRows(1)

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the offsets never move

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        left = limit.max_rows if isinstance(limit, ReadMaxRows) else sum(self.counts)
        end = {}
        for p, n in enumerate(self.counts):
            s = int(start["t"][str(p)])
            take = min(n - s, left)
            left -= take
            end[str(p)] = s + take
        return {"t": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        s, e = start["t"], end["t"]
        return [
            InputPartition((int(p), int(s[p]), int(e[p])))
            for p in sorted(e, key=int)
            if int(e[p]) > int(s[p])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        p, lo, hi = partition.value
        n = hi - lo
        yield pa.record_batch(
            {
                "key": pa.array([b"k"] * n),
                "value": pa.array([b"v"] * n),
                "topic": pa.array(["t"] * n),
                "partition": pa.array([p] * n, pa.int32()),
                "offset": pa.array(range(lo, hi), pa.int64()),
                "timestamp": pa.array([T0 * 1000] * n, pa.timestamp("us", tz="UTC")),
                "timestampType": pa.array([0] * n, pa.int32()),
            },
            schema=arrow_schema(False),
        )


class FreeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_storage_free"

    def schema(self) -> Any:
        return spark_schema(False)

    def streamReader(self, schema: Any) -> _Reader:
        return _Reader([int(c) for c in self.options["counts"].split(",")])


def ms_per_batch(spark: SparkSession, df: Any, ck: Path) -> float:
    shutil.rmtree(ck, ignore_errors=True)
    t0 = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    secs = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    batches = sum(1 for p in q.recentProgress if p["numInputRows"])
    if rows != RECORDS or batches != RECORDS:
        raise RuntimeError(
            f"read {rows} rows in {batches} micro-batches, expected {RECORDS} in {RECORDS}: "
            + str([(p["batchId"], p["numInputRows"]) for p in q.recentProgress])
        )
    return secs * 1000 / batches


def idle_s3_requests(
    spark: SparkSession, tmp: Path, seconds: float = 10.0, interval_ms: int = 200
) -> dict[str, Any]:
    """S3 requests per trigger of a stream with nothing new to read (see the module doc)."""
    import collections

    from object_store import BUCKET, filesystem, start_server
    from werkzeug.serving import WSGIRequestHandler

    seen: collections.Counter[str] = collections.Counter()
    log_request = WSGIRequestHandler.log_request

    def counting(self: Any, code: Any = "-", size: Any = "-") -> None:
        kind = "LIST" if "list-type=" in self.path else self.command
        seen[kind] += 1
        log_request(self, code, size)

    WSGIRequestHandler.log_request = counting  # type: ignore[method-assign]
    server, opts = start_server()
    try:
        filesystem(opts).mkdir(BUCKET)
        url = f"s3://{BUCKET}/triggers"
        with pylog.open(url, opts) as root:
            root.create_topic("t", 16)
            for p in range(16):
                root.append("t", [b"old-%d" % i for i in range(100)], partition=p)
        reader = spark.readStream.format("pylog").option("path", url).option("subscribe", "t")
        for k, v in opts.items():
            reader = reader.option(f"storage.{k}", v)
        q = (
            reader.option("startingOffsets", "latest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp / "idle-s3"))
            .trigger(processingTime=f"{interval_ms} milliseconds")
            .start()
        )
        time.sleep(5)  # started: batch 0 planned, Python workers up
        seen.clear()
        t0 = time.perf_counter()
        time.sleep(seconds)
        counted = dict(seen)
        elapsed = time.perf_counter() - t0
        q.stop()
    finally:
        WSGIRequestHandler.log_request = log_request  # type: ignore[method-assign]
        server.stop()
    triggers = elapsed * 1000 / interval_ms
    total = sum(counted.values())
    return {
        "triggers": round(triggers),
        "requests": counted,
        "requests_per_trigger": round(total / triggers, 2),
        "lists_per_trigger": round(counted.get("LIST", 0) / triggers, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 and 16 partitions only")
    ap.add_argument("--s3-only", action="store_true", help="only the idle-trigger requests on S3")
    args = ap.parse_args()
    sizes = (1, 16) if args.quick else (1, 16, 128)
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-triggers-"))
    spark = local_spark("pylog-bench-triggers", FreeSource, spark__sql__shuffle__partitions="1")
    results: dict[str, dict[str, float]] = {}
    try:
        s3 = idle_s3_requests(spark, tmp)
        print(
            f"idle stream on S3, 16 partitions: {s3['requests_per_trigger']} requests per trigger "
            f"({s3['lists_per_trigger']} LIST) over ~{s3['triggers']} triggers: {s3['requests']}",
            flush=True,
        )
        for n in () if args.s3_only else sizes:
            counts = counts_for(n)
            path = tmp / f"root{n}"
            with pylog.open(path) as root:
                root.create_topic("t", n)
                root.append("t", [b"v%d" % i for i in range(RECORDS)], partition=0)
                for p in range(1, n):
                    root.append("t", [b"old-%d" % i for i in range(1000)], partition=p)
            starting = json.dumps({"t": {str(p): -2 if p == 0 else -1 for p in range(n)}})
            pylog_df = (
                spark.readStream.format("pylog")
                .option("path", str(path))
                .option("subscribe", "t")
                .option("startingOffsets", starting)
                .option("maxOffsetsPerTrigger", 1)
                .load()
            )
            free_df = (
                spark.readStream.format("bench_storage_free")
                .option("counts", ",".join(map(str, counts)))
                .load()
            )
            ms_per_batch(spark, free_df, tmp / "warm")  # warm up (JVM, Python workers)
            ms_per_batch(spark, pylog_df, tmp / "warm")
            free = ms_per_batch(spark, free_df, tmp / f"free{n}")
            mine = ms_per_batch(spark, pylog_df, tmp / f"pylog{n}")
            results[str(n)] = {
                "pylog_ms": round(mine, 1),
                "free_ms": round(free, 1),
                "ratio": round(mine / free, 2),
            }
            print(
                f"{n:>4} partitions: pylog {mine:7.1f} ms, storage-free {free:7.1f} ms per micro-batch "
                f"({mine / free:.2f}x)",
                flush=True,
            )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        json.dumps(
            {"bench": "spark_triggers", "records": RECORDS, "partitions": results, "idle_s3": s3},
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
