"""Helpers of the source tests: writing logs with pylog.storage, running streaming queries.

The Spark helpers take the root as a :class:`~tests.conftest.Backend` (local disk or S3) or a
local path.  The writing helpers take an open Root; their writes below its public methods
(``writable_log(...).append_batches``, ``_acknowledge``) run inside ``root.transaction``: on an
object store that is what commits them (one manifest each)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pylog.storage.codec import records
from pylog.storage.root.manager import Root, partition_dir

if TYPE_CHECKING:
    from tests.conftest import Backend

T0 = 1_700_000_000_000  # record timestamps start here (ms)
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def value(topic: str, partition: int, i: int) -> bytes:
    return f"{topic}/{partition}/{i}".encode()


def append(
    root: Root,
    topic: str,
    partition: int,
    n: int,
    *,
    ts: Iterable[int] | None = None,
    chunk: int | None = None,
    visible: bool = True,
) -> list[bytes]:
    """Append ``n`` records to one partition (in appends of ``chunk`` records, each at least one
    batch, each one commit on an object store); values name topic, partition and offset,
    timestamps default to T0 + offset.  With ``visible=False`` readers do not see them until
    :func:`publish` (the high watermark); on an object store that is only possible inside one
    ``root.transaction`` holding both (there, nothing is appended but not acknowledged)."""
    start = root.writable_log(topic, partition).log_end_offset
    vals = [value(topic, partition, start + i) for i in range(n)]
    stamps = (
        np.array(list(ts), np.int64) if ts is not None else T0 + np.arange(start, start + n, dtype=np.int64)
    )
    step = chunk or max(n, 1)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        if not visible:
            root.writable_log(topic, partition).append(
                pa.array(vals[lo:hi]), pa.array([b"k%d" % (i % 7) for i in range(lo, hi)]), stamps[lo:hi]
            )
            continue
        root.append(
            topic,
            pa.table(
                {
                    "key": pa.array([b"k%d" % (i % 7) for i in range(lo, hi)]),
                    "value": pa.array(vals[lo:hi]),
                    "timestamp": pa.array(stamps[lo:hi], pa.timestamp("ms")),
                }
            ),
            partition=partition,
        )
    return vals


def publish(root: Root, topic: str, partition: int) -> None:
    """Make appended records visible to readers (move the high watermark)."""

    def ack() -> None:
        root.writable_log(topic, partition)
        root._acknowledge([(topic, partition)])

    root.transaction(ack)


def append_at(root: Root, topic: str, partition: int, offsets: list[int], **encode: Any) -> None:
    """Append one batch per contiguous run of ``offsets`` at exactly those offsets (gaps as a
    compacted log has them); one commit on an object store."""

    def write() -> None:
        lg = root.writable_log(topic, partition)
        runs: list[list[int]] = []
        for o in offsets:
            if runs and runs[-1][-1] + 1 == o:
                runs[-1].append(o)
            else:
                runs.append([o])
        for run in runs:
            enc = records.encode(
                pa.array([value(topic, partition, o) for o in run]),
                key=pa.array([b"k%d" % o for o in run]),
                timestamp=T0 + np.array(run, np.int64),
                base_offset=run[0],
                **encode,
            )
            lg.append_batches(enc.tobytes(), assign_offsets=False)
        publish(root, topic, partition)

    root.transaction(write)


def control_batch(
    root: Root, topic: str, partition: int, offset: int, *, producer_id: int, commit: bool
) -> None:
    """A transaction marker (COMMIT or ABORT control record) at ``offset``."""

    def write() -> None:
        enc = records.encode(
            pa.array([b"\x00\x00\x00\x00\x00\x00"]),
            key=pa.array([b"\x00\x00\x00\x01" if commit else b"\x00\x00\x00\x00"]),
            timestamp=np.array([T0 + offset]),
            base_offset=offset,
            is_control=True,
            is_transactional=True,
            producer_id=producer_id,
            producer_epoch=0,
        )
        root.writable_log(topic, partition).append_batches(enc.tobytes(), assign_offsets=False)
        publish(root, topic, partition)

    root.transaction(write)


def remove_partition(root: Root, topic: str, partition: int) -> None:
    """Remove a partition's files and directory as another tool would, leaving the topic's
    metadata (one commit on an object store); ``root`` must have no log open."""

    def drop() -> None:
        _remove_dir(root, partition_dir(topic, partition))

    root.transaction(drop)


def delete_topic(root: Root, topic: str) -> None:
    """Delete a topic as ``pylog delete-topic`` does (:meth:`Root.delete_topic`: one commit on
    an object store); on local disk no other writer may be open."""
    root.delete_topic(topic)


def _remove_dir(root: Root, d: str) -> None:
    st = root.storage
    for name in st.listdir(d):
        st.delete(f"{d}/{name}")
    if st.isdir(d):
        st.rmdir(d)


class Collector:
    """A foreachBatch sink keeping every attempt of every batch (replays included)."""

    def __init__(self, columns: tuple[str, ...] = ("topic", "partition", "offset", "value")):
        self.columns = columns
        self.attempts: dict[int, list[list[tuple[Any, ...]]]] = {}
        self.lock = threading.Lock()
        self.hook: Any = None

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in df.select(*self.columns).collect()]
        with self.lock:
            self.attempts.setdefault(batch_id, []).append(rows)
        if self.hook is not None:
            self.hook(batch_id, rows)

    def rows(self) -> list[tuple[Any, ...]]:
        """Rows of the last attempt of each batch (what an idempotent sink keeps)."""
        with self.lock:
            return [r for b in sorted(self.attempts) for r in self.attempts[b][-1]]

    def values(self) -> list[bytes]:
        i = self.columns.index("value")
        return [bytes(r[i]) for r in self.rows()]

    def batch_sizes(self) -> list[int]:
        with self.lock:
            return [len(self.attempts[b][-1]) for b in sorted(self.attempts)]


def spark_options(where: Backend | Path) -> dict[str, str]:
    """``path`` (and the ``storage.*`` options) of a root given as a Backend or a local path."""
    if isinstance(where, Path):
        return {"path": str(where)}
    return where.spark_options()


def reader(spark: Any, where: Backend | Path, *, stream: bool = True, **options: str) -> Any:
    r = spark.readStream if stream else spark.read
    return r.format("pylog").options(**spark_options(where)).options(**options).load()


def run_available_now(
    spark: Any,
    where: Backend | Path,
    checkpoint: Path,
    collector: Collector,
    timeout: float = 120,
    **options: str,
) -> Any:
    """Run a query with Trigger.AvailableNow to its end; raises the query's exception."""
    q = (
        reader(spark, where, **options)
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(timeout)
    finally:
        if q.isActive:
            q.stop()
    if q.exception() is not None:
        raise q.exception()  # type: ignore[misc]
    return q


def start_stream(
    spark: Any, where: Backend | Path, checkpoint: Path, collector: Collector, **options: str
) -> Any:
    """Start a query with a short processing-time trigger (use processAllAvailable / stop)."""
    return (
        reader(spark, where, **options)
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="50 milliseconds")
        .start()
    )


def forget_batch(checkpoint: Path, batch_id: int, *, keep_offsets: bool = True) -> None:
    """Simulate a crash after batch ``batch_id`` ran but before Spark recorded it as committed
    (and drop every later batch), so that a restart replays it (SPARK-24156)."""
    for sub in ("commits", "offsets"):
        for f in (checkpoint / sub).iterdir():
            name = f.name.lstrip(".").split(".")[0]
            if not name.isdigit():
                continue
            n = int(name)
            if n > batch_id or (n == batch_id and (sub == "commits" or not keep_offsets)):
                f.unlink()
