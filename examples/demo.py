"""pylog's main job on this machine: a Spark Structured Streaming pipeline that writes a
Kafka-format log, compacts it between micro-batches and reads it back as a stream.  No broker
and no server: everything lives in one directory (default ``./demo-data/demo``).

1. Sensor readings arrive as files in ``DIR/inbox``: 16 files of 5,000 readings from 1,000
   sensors, each reading keyed by its sensor.
2. The writing query streams them, one file per micro-batch, into the topic ``readings``
   with ``writeStream.format("pylog")``: 4 partitions (Kafka's partitioner places each sensor),
   ``cleanup.policy=compact`` and small segments (``segment.bytes`` 32 KiB).  After each
   micro-batch commit, the sink runs the log cleaner on the partitions it wrote (its embedded
   maintenance): older readings of a sensor are dropped, the latest one stays.
3. At the same time, a reading query streams the topic with ``readStream.format("pylog")`` into
   an aggregate per sensor (readings seen, latest reading) in a memory table.
4. A summary: records written, read and kept per partition, segments rolled and left after
   compaction, the exactly-once checks, where the files are and what to run next.

    make demo                       # or: .venv/bin/python examples/demo.py [DIR]

Progress is drawn live on a terminal; when the output is piped, one line per micro-batch is
printed instead.  A re-run starts over (it removes what an earlier run left in ``DIR``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import demo_dir, local_spark, pylog_command, shown
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import pylog
from pylog.storage.codec.partitioner import partition_for_keys

TOPIC = "readings"
PARTITIONS = 4
SENSORS = 1000
FILES = 16
PER_FILE = 5000
SEGMENT_BYTES = 32 * 1024
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": SEGMENT_BYTES}
GROUP = "demo-sensors"


# ============================================================================ input


@dataclass
class Events:
    """What was generated, for the checks: the sensor of every reading, in order."""

    sensor: np.ndarray  # sensor number of each reading; its index is the reading's seq

    @property
    def total(self) -> int:
        return int(self.sensor.shape[0])

    def keys(self) -> pa.Array:
        return pa.array([b"sensor-%04d" % s for s in range(SENSORS)], pa.binary())

    def per_partition(self) -> np.ndarray:
        """How many readings Kafka's partitioner sends to each partition."""
        partition_of_sensor = partition_for_keys(self.keys(), PARTITIONS)
        return np.bincount(partition_of_sensor[self.sensor], minlength=PARTITIONS)

    def latest_seq(self) -> np.ndarray:
        """The seq of each sensor's last reading: what a compacted topic must keep."""
        latest = np.full(SENSORS, -1, np.int64)
        np.maximum.at(latest, self.sensor, np.arange(self.total, dtype=np.int64))
        return latest


def write_inbox(inbox: Path) -> Events:
    """FILES Parquet files of PER_FILE readings each; seq numbers every reading."""
    rng = np.random.default_rng(17)
    n = FILES * PER_FILE
    seq = np.arange(n, dtype=np.int64)
    sensor = rng.integers(0, SENSORS, n)
    celsius = np.round(20 + 5 * np.sin(seq / 700.0) + (sensor % 7) - 3, 2)
    start_ms = int(time.time() * 1000) - n  # event time: one ms apart, ending now
    ts = pa.array(start_ms + seq, pa.timestamp("ms", tz="UTC"))
    inbox.mkdir(parents=True)
    first = time.time() - FILES
    for f in range(FILES):
        part = slice(f * PER_FILE, (f + 1) * PER_FILE)
        table = pa.table({"seq": seq[part], "sensor": sensor[part], "celsius": celsius[part], "ts": ts[part]})
        path = inbox / f"readings-{f:03d}.parquet"
        pq.write_table(table, path)
        # Spark's file source takes files in the order of their modification times (ms), and
        # files written within the same millisecond in any order: a second apart, they arrive
        # in the order written, which the checks below rely on (the latest reading last)
        os.utime(path, (first + f, first + f))
    return Events(sensor)


# ============================================================================ queries


def start_writer(spark: Any, inbox: Path, root: Path, checkpoints: Path) -> Any:
    from pyspark.sql import functions as F

    readings = (
        spark.readStream.schema("seq LONG, sensor LONG, celsius DOUBLE, ts TIMESTAMP")
        .option("maxFilesPerTrigger", 1)  # one file per micro-batch
        .parquet(str(inbox))
        .select(
            F.format_string("sensor-%04d", "sensor").alias("key"),
            F.to_json(F.struct("sensor", "seq", "celsius")).alias("value"),
            F.col("ts").alias("timestamp"),
        )
    )
    return (
        readings.writeStream.format("pylog")
        .option("path", str(root))
        .option("topic", TOPIC)
        .option("batch.size", 16 * 1024)  # record batches smaller than a segment
        .option("maintenance", "true")  # the default: compaction after each commit
        # ... run to its end: with the default budget (2 s) a compaction that takes longer, as the
        # first ones can on a busy machine, leaves the rest to the next commits, with a warning
        .option("maintenance.budgetMs", 60_000)
        .option("checkpointLocation", str(checkpoints / "write-readings"))
        .trigger(availableNow=True)  # everything in the inbox, then stop
        .start()
    )


def start_reader(spark: Any, root: Path, checkpoints: Path) -> Any:
    from pyspark.sql import functions as F

    reading = F.from_json(F.col("value").cast("string"), "sensor INT, seq LONG, celsius DOUBLE")
    return (
        spark.readStream.format("pylog")
        .option("path", str(root))
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("groupId", GROUP)  # the consumer group `pylog describe` shows it under
        .load()
        .select("partition", "offset", F.col("key").cast("string").alias("sensor"), reading.alias("r"))
        .groupBy("partition", "sensor")
        .agg(
            F.count("*").alias("readings"),
            F.max_by("r.seq", "offset").alias("latest_seq"),
            F.max_by("r.celsius", "offset").alias("celsius"),
        )
        .writeStream.format("memory")
        .queryName("sensors")
        .outputMode("complete")
        .option("checkpointLocation", str(checkpoints / "read-readings"))
        .trigger(processingTime="2 seconds")
        .start()
    )


# ============================================================================ watching


@dataclass
class Segments:
    """The topic's segment files, sampled every 0.1 s while the queries run: ``rolled`` holds
    the base offset of every segment seen, ``now`` counts those on disk.  A segment lives at
    least from the commit that rolls it until that commit's compaction replaces it (as
    ``.log.deleted`` until the commit ends), which the sampling sees: on this data, the segments
    seen are the 169 that the same stream leaves with ``maintenance=false``."""

    root: Path
    rolled: list[set[int]] = field(default_factory=lambda: [set() for _ in range(PARTITIONS)])
    now: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    bytes: int = 0

    def sample(self) -> None:
        total = 0
        for p in range(PARTITIONS):
            live = 0
            try:
                entries = list(os.scandir(self.root / f"{TOPIC}-{p}"))
            except FileNotFoundError:
                continue
            for e in entries:
                base, _, suffix = e.name.partition(".")
                if suffix in ("log", "log.deleted") and base.isdigit():
                    self.rolled[p].add(int(base))
                if suffix == "log":
                    live += 1
                    with contextlib.suppress(FileNotFoundError):  # replaced meanwhile
                        total += e.stat().st_size
            self.now[p] = live
        self.bytes = total


RECENT_PROGRESS = 1000
"""Progress events a query keeps (``spark.sql.streaming.numRecentProgressUpdates``, default 100):
the ticks take them every 0.1 s, so that none is dropped before it was counted."""


@dataclass
class Progress:
    """The queries' micro-batches as reported by Spark (``query.recentProgress``).

    A trigger that finds no new data reports progress too (at most every
    ``spark.sql.streaming.noDataProgressEventInterval``, 10 s: a reading query that waits that
    long for the writer, under load), with no rows and the id of the batch that runs *next*: a
    batch id is counted once it came with rows, never when an idle trigger reported it first."""

    batches: int = 0
    rows: int = 0
    rate: float = 0.0
    end_offsets: dict[int, int] | None = None
    seen: set[int] = field(default_factory=set)
    last: str = ""  # the timestamp of the newest event taken
    dropped: bool = False  # events may have left recentProgress before they were taken

    def update(self, query: Any) -> list[dict[str, Any]]:
        """Takes the new micro-batches of ``query``; returns those that had rows."""
        new = []
        recent = query.recentProgress
        if len(recent) >= RECENT_PROGRESS and recent[0]["timestamp"] > self.last:
            self.dropped = True  # (the counts below would be short: the check says so)
        for p in recent:
            self.last = max(self.last, p["timestamp"])
            if not p["numInputRows"] or p["batchId"] in self.seen:
                continue
            self.seen.add(p["batchId"])
            self.batches += 1
            self.rows += p["numInputRows"]
            self.rate = p["processedRowsPerSecond"]
            end = p["sources"][0]["endOffset"]
            end = json.loads(end) if isinstance(end, str) else end
            if isinstance(end, dict) and TOPIC in end:
                self.end_offsets = {int(k): int(v) for k, v in end[TOPIC].items()}
            new.append(p)
        return new


def view(write: Progress, read: Progress, segs: Segments) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        "write",
        ProgressBar(total=FILES, completed=write.batches, width=28),
        f"{write.batches}/{FILES} micro-batches  {write.rows:>7,} rows  {write.rate:>7,.0f} rows/s",
    )
    grid.add_row(
        "read ",
        ProgressBar(total=None, width=28),
        f"{read.batches} micro-batches  {read.rows:>7,} rows  {read.rate:>7,.0f} rows/s",
    )
    grid.add_row(
        "topic",
        "",
        f"{TOPIC}: {sum(segs.now)} segments now, {sum(map(len, segs.rolled))} rolled, "
        f"{segs.bytes / 1024:,.0f} KiB on disk",
    )
    return grid


def run_pipeline(spark: Any, base: Path, console: Console) -> tuple[Progress, Progress, Segments]:
    root, checkpoints = base / "pylog-root", base / "spark-checkpoints"
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", RECENT_PROGRESS)
    writer = start_writer(spark, base / "inbox", root, checkpoints)
    reader = start_reader(spark, root, checkpoints)
    write, read, segs = Progress(), Progress(), Segments(root)
    say = Say(console)

    def tick(live: Live | None) -> None:
        segs.sample()
        for p in write.update(writer):
            say(
                f"  write batch {p['batchId']:>2}: {p['numInputRows']:,} rows, "
                f"{p['processedRowsPerSecond']:>7,.0f} rows/s | {TOPIC}: {sum(segs.now):>2} segments now, "
                f"{sum(map(len, segs.rolled)):>3} rolled, {segs.bytes / 1024:>5,.0f} KiB"
            )
        for p in read.update(reader):
            say(
                f"  read  batch {p['batchId']:>2}: {p['numInputRows']:,} rows, "
                f"{p['processedRowsPerSecond']:>7,.0f} rows/s"
            )
        if live is not None:
            live.update(view(write, read, segs))

    live = None
    if console.is_terminal:  # drawn live on a terminal; in a pipe, the lines above are the progress
        live = Live(view(write, read, segs), console=console, refresh_per_second=8, transient=True)
    try:
        if live is not None:
            live.start()
        while writer.isActive:  # availableNow: it stops once the inbox is written
            tick(live)
            time.sleep(0.1)
        writer.awaitTermination()  # raises the query's error, if any
        tick(live)
        with pylog.open(root, read_only=True) as r:
            ends = {p: r.log(TOPIC, p).log_end_offset for p in range(PARTITIONS)}
        deadline = time.monotonic() + 120
        while read.end_offsets != ends or reader.status["isTriggerActive"]:  # until it has read it all
            if not reader.isActive or time.monotonic() > deadline:
                reader.awaitTermination(1)  # raises the query's error, if any
                raise SystemExit(f"the reading query stopped at {read.end_offsets}, not at {ends}")
            time.sleep(0.1)
            tick(live)
        reader.stop()
        tick(live)
    finally:
        if live is not None:
            live.stop()
        for q in (writer, reader):
            if q.isActive:
                q.stop()
    return write, read, segs


class Say:
    """One line on the console, never wrapped or styled (the same text on a terminal and in a pipe)."""

    def __init__(self, console: Console):
        self.console = console

    def __call__(self, text: str = "") -> None:
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)


# ============================================================================ summary


def summarize(
    spark: Any, base: Path, events: Events, write: Progress, read: Progress, segs: Segments, say: Say
) -> bool:
    root = base / "pylog-root"
    sensors = spark.table("sensors").toArrow()
    spark.stop()
    read_per_partition = np.bincount(
        sensors.column("partition").to_numpy(),
        weights=sensors.column("readings").to_numpy(),
        minlength=PARTITIONS,
    ).astype(np.int64)
    with pylog.open(root, read_only=True) as r:
        logs = [r.log(TOPIC, p) for p in range(PARTITIONS)]
        written = np.array([lg.log_end_offset - lg.log_start_offset for lg in logs])
        kept = np.bincount(r.read_table(TOPIC).column("partition").to_numpy(), minlength=PARTITIONS)
        now = [len(lg.segments) for lg in logs]
        size = sum(lg.size for lg in logs)
    expected = events.per_partition()

    say(f"\n{events.total:,} readings streamed into {TOPIC!r} and read back, {PARTITIONS} partitions:")
    say(f"  {'partition':>9} {'written':>9} {'read':>9} {'kept':>9}   segments rolled -> now")
    for p in range(PARTITIONS):
        say(
            f"  {p:>9} {written[p]:>9,} {read_per_partition[p]:>9,} {kept[p]:>9,}   "
            f"{len(segs.rolled[p]):>15} -> {now[p]}"
        )
    say(
        f"  {'total':>9} {written.sum():>9,} {read_per_partition.sum():>9,} {kept.sum():>9,}   "
        f"{sum(map(len, segs.rolled)):>15} -> {sum(now)}  ({size / 1024:,.0f} KiB on disk)"
    )
    say("  read: by the reading query; compaction may drop a sensor's older readings before it reads them")
    say("  kept: on disk now: each sensor's latest reading, and the newest segments not yet compacted")

    latest = dict(
        zip(sensors.column("sensor").to_pylist(), sensors.column("latest_seq").to_pylist(), strict=True)
    )
    want = events.latest_seq()
    keys = [k.decode() for k in events.keys().to_pylist()]
    stale = [k for k, s in zip(keys, want.tolist(), strict=True) if latest.get(k) != s]
    checks = [
        (
            f"every reading written once: {events.total:,} in, {written.sum():,} offsets, in each "
            "partition as many as Kafka's partitioner sends there",
            written.tolist() == expected.tolist() and write.rows == events.total,
        ),
        (
            f"the reading query read every partition to its end and counted each record once "
            f"({read.rows:,} rows read, {read_per_partition.sum():,} counted)"
            + (" (progress events were dropped before they were counted)" if read.dropped else ""),
            read.end_offsets == {p: int(logs[p].log_end_offset) for p in range(PARTITIONS)}
            and read.rows == int(read_per_partition.sum())
            and not read.dropped,
        ),
        (
            f"the aggregate holds the latest reading of all {len(latest):,} sensors"
            + (f" (wrong for {len(stale)}: {stale[:3]})" if stale else ""),
            not stale and len(latest) == SENSORS,
        ),
    ]
    say("\nexactly-once checks:")
    for text, ok in checks:
        say(f"  {'OK  ' if ok else 'FAIL'} {text}")
    first = sensors.sort_by("sensor").slice(0, 3).to_pylist()
    say("\nthe aggregate (memory table 'sensors'), first rows:")
    for row in first:
        say(
            f"  {row['sensor']}  partition {row['partition']}  {row['readings']:>3} readings read, "
            f"latest: seq {row['latest_seq']}, {row['celsius']} °C"
        )

    pylog_cmd = pylog_command()
    segment = root / f"{TOPIC}-0" / f"{0:020d}.log"
    say("\nfiles:")
    say(f"  {shown(root)}/  the topic, a Kafka log directory: {TOPIC}-0/ ... {TOPIC}-{PARTITIONS - 1}/")
    say(f"  {shown(base / 'spark-checkpoints')}/  the Spark checkpoints: write-readings/, read-readings/")
    say(f"  {shown(base / 'inbox')}/  the input files")
    say("next:")
    say(
        f"  {pylog_cmd} describe {shown(root)}   # the reading query's group {GROUP}: "
        "its last micro-batch shows as lag (Spark commits a batch when it plans the next)"
    )
    say(f"  {pylog_cmd} dump --files {shown(segment)} --print-data-log | head")
    say(f"  {pylog_cmd} verify {shown(root)}")
    return all(ok for _, ok in checks)


def main() -> None:
    t0 = time.monotonic()
    base = demo_dir("demo", __doc__)
    console = Console()
    say = Say(console)
    events = write_inbox(base / "inbox")
    with pylog.open(base / "pylog-root") as root:
        root.create_topic(TOPIC, partitions=PARTITIONS, config=TOPIC_CONFIG)
    say(
        f"{FILES} files of {PER_FILE:,} sensor readings in {shown(base / 'inbox')}; topic {TOPIC!r}: "
        f"{PARTITIONS} partitions, cleanup.policy=compact, segment.bytes={SEGMENT_BYTES:,}"
    )
    say("starting Spark (local[2]) ...")
    spark = local_spark("pylog-demo")
    say(
        "streaming: inbox -> writeStream.format('pylog') -> topic, compacted after each micro-batch; "
        "readStream.format('pylog') -> aggregate per sensor"
    )
    write, read, segs = run_pipeline(spark, base, console)
    ok = summarize(spark, base, events, write, read, segs, say)
    say(f"\ndone in {time.monotonic() - t0:.0f} s")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
