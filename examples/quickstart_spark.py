"""Quickstart: stream into pylog with Spark and stream back out, with no broker.

1. A streaming query writes keyed click events into the topic ``clicks`` (created on the first
   write with 4 partitions) with ``writeStream.format("pylog")``: exactly once per micro-batch.
   It runs three times with ``trigger(availableNow=True)``, as a scheduled job would, one
   micro-batch per run.
2. ``spark.readStream.format("pylog")`` reads the topic from the earliest offset into a memory
   table, at most 1200 records per micro-batch (``maxOffsetsPerTrigger``).
3. A pylog-to-pylog pipeline (clicks keyed by page into the topic ``pages``) runs; more clicks
   are appended with the Python API; the pipeline, restarted on its checkpoint, reads only those.
4. A batch read (``spark.read``) counts the pages, exactly once each; a batch write
   (``df.write``) stores the counts in a third topic;
5. which plain Python reads back without Spark: ``pylog.open(...).read_table(...)``.

    .venv/bin/python examples/quickstart_spark.py [DIR]      # default: demo-data/quickstart
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from _common import demo_dir, local_spark, pylog_command, shown

import pylog


def write_clicks(spark: Any, root: Path, checkpoints: Path) -> list[dict[str, Any]]:
    """Three runs of one streaming query (one micro-batch of 1000 events each)."""
    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1000)
        .option("startTimestamp", int(time.time() * 1000))  # event time: now (retention.ms counts from it)
        .option("advanceMillisPerBatch", 1000)
        .load()
        .selectExpr(
            "CONCAT('user-', CAST(value % 20 AS STRING)) AS key",
            "TO_JSON(NAMED_STRUCT('n', value, 'page', ELEMENT_AT(ARRAY('home', 'cart', 'pay'), "
            "CAST(value % 3 + 1 AS INT)))) AS value",
            "timestamp",
        )
    )
    progress = []
    for _ in range(3):
        query = (
            events.writeStream.format("pylog")
            .option("path", str(root))
            .option("topic", "clicks")
            .option("partitions", 4)  # create the topic on the first write
            .option("checkpointLocation", str(checkpoints / "write-clicks"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        progress += query.recentProgress
    return progress


def read_clicks(spark: Any, root: Path) -> list[dict[str, Any]]:
    """Read the topic into the memory table ``clicks_seen``; returns the query's progress."""
    query = (
        spark.readStream.format("pylog")
        .option("path", str(root))  # instead of kafka.bootstrap.servers
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 1200)
        .load()
        .writeStream.format("memory")
        .queryName("clicks_seen")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return list(query.recentProgress)


def count_pages(spark: Any, root: Path, checkpoints: Path) -> list[dict[str, Any]]:
    """A pylog-to-pylog pipeline: every click, keyed by its page, into the topic ``pages``.
    Restarted on its checkpoint, it continues where it stopped; its sink publishes each
    micro-batch exactly once."""
    query = (
        spark.readStream.format("pylog")
        .option("path", str(root))
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("get_json_object(CAST(value AS STRING), '$.page') AS key", "key AS value", "timestamp")
        .writeStream.format("pylog")
        .option("path", str(root))
        .option("topic", "pages")
        .option("partitions", 2)
        .option("checkpointLocation", str(checkpoints / "pages"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return list(query.recentProgress)


def show_progress(progress: list[dict[str, Any]], topic: str | None = None) -> None:
    for p in progress:
        if p["numInputRows"]:
            line = f"  batch {p['batchId']}: {p['numInputRows']:>5} records"
            if topic is not None:
                end = p["sources"][0]["endOffset"]
                end = json.loads(end) if isinstance(end, str) else end
                line += f", end offsets per partition {end[topic]}"
            print(line)


def main() -> None:
    base = demo_dir("quickstart", __doc__)
    root, checkpoints = base / "pylog-root", base / "spark-checkpoints"
    spark = local_spark("pylog-quickstart")

    print("1. writeStream.format('pylog'): three availableNow runs of one query")
    show_progress(write_clicks(spark, root, checkpoints))

    print("\n2. readStream.format('pylog') from the earliest offset, maxOffsetsPerTrigger=1200")
    show_progress(read_clicks(spark, root), "clicks")
    seen = spark.table("clicks_seen")
    print("  schema:", seen.schema.simpleString())
    seen.orderBy("partition", "offset").selectExpr(
        "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset", "timestamp"
    ).show(3, truncate=False)
    print(f"  {seen.count()} records in the memory table")

    print("3. a pylog-to-pylog streaming pipeline (clicks -> pages), run, fed, and run again")
    show_progress(count_pages(spark, root, checkpoints), "clicks")
    with pylog.open(root) as log_root:  # the Python API appends 500 more clicks
        keys = [b"user-%d" % (i % 20) for i in range(500)]
        values = [b'{"n": %d, "page": "home"}' % (3000 + i) for i in range(500)]
        log_root.append("clicks", pa.table({"key": keys, "value": values}))
    print("  appended 500 clicks with pylog.open(root).append(...); the restarted query reads only those:")
    show_progress(count_pages(spark, root, checkpoints), "clicks")

    print("\n4. spark.read (batch) and df.write (batch)")
    pages = spark.read.format("pylog").option("path", str(root)).option("subscribe", "pages").load()
    per_page = pages.groupBy(pages.key.cast("string").alias("page")).count().orderBy("page")
    per_page.show()
    total = pages.count()
    print(f"  {total} records in pages: every click exactly once")
    assert total == 3500, total
    (
        per_page.selectExpr("page AS key", "CAST(count AS STRING) AS value")
        .write.format("pylog")
        .mode("append")  # a Python data source takes append or overwrite, not Spark's default
        .option("path", str(root))
        .option("topic", "page-counts")
        .option("partitions", 1)
        .save()
    )
    spark.stop()

    print("5. the same root in plain Python, no Spark: pylog.open(root, read_only=True)")
    with pylog.open(root, read_only=True) as log_root:
        counts = log_root.read_table("page-counts").to_pydict()
        for k, v, off in zip(counts["key"], counts["value"], counts["offset"], strict=True):
            print(f"  page-counts offset {off}: {k.decode()} = {v.decode()}")
        for topic in log_root.topics():
            for p in range(log_root.partitions(topic)):
                lg = log_root.log(topic, p)
                print(f"  {topic}-{p}: offsets {lg.log_start_offset}..{lg.log_end_offset}, {lg.size:,} bytes")
    print(f"\nthe root is a Kafka log directory; inspect it with: {pylog_command()} describe {shown(root)}")


if __name__ == "__main__":
    main()
