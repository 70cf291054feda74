"""The maintenance job beside a streaming sink, shared by the local[2] test and the
``local-cluster`` run (``python -m tests.connector.maintenance_helpers RUNS_JSON``, RUNS_JSON a
list of ``[url, storage options, checkpoint directory]``; prints one JSON line of results)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pyarrow as pa

import pylog
from pylog.connector import maintenance

KEYS = 20
PAD = b"." * 700  # 8 records a commit: over 4 KiB, so each commit seals its segment on S3
STREAM_ROWS = 40  # per micro-batch

Row = tuple[int, int, bytes, bytes]  # partition, offset, key, value


def fill(root: Any, rounds: int) -> None:
    """``rounds`` appends of 8 records to each of the 3 partitions of topic ``c``, over
    :data:`KEYS` keys per partition (so most records are superseded)."""
    for i in range(rounds):
        for p in range(3):
            keys = [b"k%d-%d" % (p, (i * 8 + j) % KEYS) for j in range(8)]
            root.append(
                "c", pa.table({"key": keys, "value": [b"r%d-%s" % (i, k) + PAD for k in keys]}), partition=p
            )


def rows_of(t: pa.Table) -> list[Row]:
    return list(
        zip(
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )


def check_compacted(history: list[Row], rows: list[Row]) -> None:
    """``rows`` keep what ``history`` had at each offset they hold, in order without repeats,
    with the latest value of every key of ``history``."""
    by_offset = {(p, o): (k, v) for p, o, k, v in history}
    for p, o, k, v in rows:
        if (p, o) in by_offset:
            assert by_offset[(p, o)] == (k, v), (p, o)
    latest = {k: v for _, (k, v) in sorted(by_offset.items())}
    kept = {k: v for _, _, k, v in rows}
    assert all(kept[k] == v for k, v in latest.items())
    for p in {p for p, _, _, _ in rows}:
        offs = [o for q, o, _, _ in rows if q == p]
        assert offs == sorted(set(offs))


def job_beside_stream(
    spark: Any, url: str, options: dict[str, str], checkpoint: str
) -> maintenance.MaintenanceSummary:
    """A streaming query (``rate-micro-batch``, unique keys ``live-<n>``, the sink's own
    compactor off) writes into a compacted topic prefilled with superseded values while
    ``maintenance.run(force=True)`` cleans it.  Checks that every streamed row is there exactly
    once and the prefilled part is compacted to the latest value per key."""
    with pylog.open(url, options or None) as root:
        root.create_topic("c", 3, {"cleanup.policy": "compact", "segment.bytes": "16384"})
        fill(root, 12)
        history = rows_of(root.read_table("c"))
    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", STREAM_ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "concat('live-', cast(value as string)) AS key", "concat('v', cast(value as string)) AS value"
        )
        .writeStream.format("pylog")
        .option("path", url)
        .options(**{f"storage.{k}": v for k, v in options.items()})
        .option("topic", "c")
        .option("maintenance", "false")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 180
        while (stream.lastProgress or {}).get("batchId", -1) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the sink is committing before the job starts
        first = stream.lastProgress["batchId"]
        summary = maintenance.run(
            spark, url, storage_options=options or None, force=True, now=int(time.time() * 1000)
        )
        during = stream.lastProgress["batchId"] - first
        time.sleep(1)
    finally:
        stream.stop()
    assert stream.exception() is None, stream.exception()
    assert not summary.errors and summary.partitions_cleaned == 3, summary.describe()
    assert summary.records_removed > 0 and during >= 0
    with pylog.open(url, options or None, read_only=True) as r:
        rows = rows_of(r.read_table("c"))
        (query,) = r._state.queries
        written = r.last_committed_batch(query)
    live = sorted(int(v[1:]) for _, _, k, v in rows if k.startswith(b"live-"))
    assert written is not None and live == list(range(STREAM_ROWS * (written + 1)))  # every row, once
    check_compacted(history, rows)
    assert sum(1 for _, _, k, _ in rows if not k.startswith(b"live-")) < len(history)  # compacted
    return summary


def _local_cluster_runs(runs: list[tuple[str, dict[str, str], str]]) -> list[dict[str, Any]]:
    from pyspark.sql import SparkSession

    from pylog.connector import DefaultSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("pylog-maintenance-local-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(DefaultSource)
        out = []
        for url, options, checkpoint in runs:
            summary = job_beside_stream(spark, url, options, checkpoint)
            infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
            out.append(
                {
                    "master": spark.sparkContext.master,
                    "executors": len(infos) - 1,  # the driver is listed too
                    "partitions_cleaned": summary.partitions_cleaned,
                    "task_pids": len({p.worker for p in summary.partitions}),
                    "summary": summary.describe(),
                }
            )
        return out
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(_local_cluster_runs(json.loads(sys.argv[1]))))
