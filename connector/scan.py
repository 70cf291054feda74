"""Reading one planned offset range into Arrow record batches: the executor's half of the source.

A :class:`ReadTask` carries everything ``read()`` needs (Spark pickles it into the input
partition; the reader instance on executors holds nothing else).  :func:`read_task` opens the
root read-only, checks the range against the log (data loss), decodes batch after batch and
yields ``pyarrow.RecordBatch``es in exactly the Arrow form of Spark's Kafka source schema,
built from the decoded columns with no Python object per row.

Gaps -- offsets removed by compaction, control records (transaction markers) -- are skipped
silently; a range with no visible record yields nothing.  Offsets below the log start offset
(retention) and a log that ends before the planned end (deleted and recreated, truncated) are
data loss: an error when ``failOnDataLoss`` is true, else a warning and the rows that are left,
never a row outside the planned range.  Reading a range again returns the same rows.  A
writer compacting, merging or removing segments while a task reads them changes none of this
(see "reading beside a writer" in :mod:`pylog.storage.partition.log`); only retention removing
offsets of the range before a slow task read them (after ``file.delete.delay.ms``) is data loss.

This module does not import pyspark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pylog.connector.offsets import OffsetRange, open_read_only, report_data_loss
from pylog.connector.options import SourceOptions
from pylog.storage.codec import records
from pylog.storage.errors import OffsetOutOfRangeError, PylogError
from pylog.storage.partition import producer_state
from pylog.storage.partition.log import Log
from pylog.storage.root.manager import Root
from pylog.storage.root.schema import kafka_columns

log = logging.getLogger("pylog.connector")

SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")
SPARK_HEADERS = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", SPARK_TIMESTAMP),
    pa.field("timestampType", pa.int32()),
]
MAX_TIMESTAMP_MS = (2**63 - 1) // 1000  # the largest millisecond value Spark's microseconds can hold
FETCH_BYTES = 8 << 20
_RETRIES = 3
Aborted = tuple[np.ndarray, np.ndarray, np.ndarray]  # producer ids, first and last offsets


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of the source schema (what Spark's ``to_arrow_schema`` gives for it)."""
    return pa.schema([*_FIELDS, pa.field("headers", SPARK_HEADERS)] if include_headers else _FIELDS)


@dataclass(frozen=True)
class ReadTask:
    """One Spark input partition: the offsets ``[start, end)`` of one topic-partition."""

    path: str
    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: str = "read_uncommitted"
    min_timestamp: int | None = None  # pushed-down filters: record timestamps in [min, max) ms
    max_timestamp: int | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials

    def describe(self) -> str:
        return f"{self.topic}-{self.partition} offsets [{self.start}, {self.end})"


def task_for(
    opts: SourceOptions,
    r: OffsetRange,
    min_timestamp: int | None = None,
    max_timestamp: int | None = None,
) -> ReadTask:
    """The task that reads the planned range ``r`` (with pushed-down timestamp bounds)."""
    return ReadTask(
        path=opts.path,
        topic=r.topic,
        partition=r.partition,
        start=r.start,
        end=r.end,
        fail_on_data_loss=opts.fail_on_data_loss,
        include_headers=opts.include_headers,
        isolation_level=opts.isolation_level,
        min_timestamp=min_timestamp,
        max_timestamp=max_timestamp,
        storage_options=opts.storage_options,
    )


def read_task(task: ReadTask, *, fetch_bytes: int = FETCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The rows of ``task`` as record batches of :func:`arrow_schema`."""
    schema = arrow_schema(task.include_headers)
    start, end = task.start, task.end
    attempt = 0
    while start < end:
        root = open_read_only(task.path, task.storage_options)
        try:
            lg = _log(root, task)
            if lg is None:
                return
            start, end = _check_range(lg, task, start, end)
            if start >= end:  # e.g. retention removed the whole range (failOnDataLoss=false)
                return
            aborted = _aborted(lg, task, start, end)
            for rs in lg.iter_record_sets(start, end, max_bytes=fetch_bytes):
                last = int(rs.batches.last_offset[-1])
                batch = _convert(rs, task, start, end, schema, aborted)
                start = max(start, last + 1)
                if batch is not None:
                    yield batch
            return
        except OffsetOutOfRangeError as e:
            # retention removed offsets of the range while they were read, and their files are
            # gone (a read slower than file.delete.delay.ms): data loss, reported as planned
            # ranges below the log start are, by _check_range on the reopened log.  (A segment
            # replaced or removed under the read is not an error: the log reads on.)
            attempt += 1
            if attempt > _RETRIES:
                raise
            log.info("%s: %s; reopening the log at offset %d", task.describe(), e, start)
        finally:
            root.close()


def _log(root: Root, task: ReadTask) -> Log | None:
    t, p = task.topic, task.partition
    if t not in root.topics() or p >= root.partitions(t):
        report_data_loss(
            f"{t}-{p} does not exist any more in {task.path}, so offsets [{task.start}, {task.end}) "
            "could not be read.",
            task.fail_on_data_loss,
        )
        return None
    lg: Log = root.log(t, p)
    return lg


def _check_range(lg: Log, task: ReadTask, start: int, end: int) -> tuple[int, int]:
    first, leo = lg.log_start_offset, lg.log_end_offset
    where = f"{task.topic}-{task.partition}"
    if start < first:
        report_data_loss(
            f"{where}: offsets [{start}, {min(first, end)}) of the planned range [{task.start}, {task.end}) "
            f"are gone: the log starts at offset {first} now (retention removed them).",
            task.fail_on_data_loss,
        )
        start = min(first, end)
    if end > leo:
        report_data_loss(
            f"{where}: the range [{task.start}, {task.end}) was planned but the log now ends at offset "
            f"{leo}: it was truncated, or deleted and recreated.",
            task.fail_on_data_loss,
        )
        end = max(start, leo)
    return start, end


def _aborted(lg: Log, task: ReadTask, start: int, end: int) -> Aborted | None:
    if task.isolation_level != "read_committed" or start >= end:
        return None
    # every segment's .txnindex: on a list the writer did not change meanwhile
    return lg.read_consistently(lambda _: producer_state.aborted_transactions(lg, start, end))


def _convert(
    rs: records.RecordSet, task: ReadTask, lo: int, hi: int, schema: pa.Schema, aborted: Aborted | None = None
) -> pa.RecordBatch | None:
    """One decoded record set as a record batch: data records only (under read_committed, not
    those of aborted transactions either), offsets in [lo, hi), timestamps within the
    pushed-down bounds, in Spark's Arrow types."""
    if aborted is None:
        t = rs.data_records()
    else:
        drop = rs.batches.is_control | producer_state.aborted_batches(rs.batches, aborted)
        t = rs.records.filter(pa.array(~drop[rs.batch_index])) if drop.any() else rs.records
    if t.num_rows == 0:
        return None
    off = t.column("offset")
    if int(off[0].as_py()) < lo or int(off[-1].as_py()) >= hi:
        t = t.filter(pc.and_(pc.greater_equal(off, lo), pc.less(off, hi)))
    if task.min_timestamp is not None or task.max_timestamp is not None:
        ts = t.column("timestamp")
        keep = pa.chunked_array([pa.array(np.ones(t.num_rows, bool))])
        if task.min_timestamp is not None:
            keep = pc.and_(keep, pc.greater_equal(ts, task.min_timestamp))
        if task.max_timestamp is not None:
            keep = pc.and_(keep, pc.less(ts, task.max_timestamp))
        t = t.filter(keep)
    if t.num_rows == 0:
        return None
    _check_timestamps(t, task)
    k = kafka_columns(t, task.topic, task.partition)
    if not task.include_headers:
        k = k.drop_columns(["headers"])
    return k.cast(schema).combine_chunks().to_batches()[0]


def _check_timestamps(t: pa.Table, task: ReadTask) -> None:
    lo, hi = pc.min_max(t.column("timestamp")).values()
    if lo.as_py() >= -MAX_TIMESTAMP_MS and hi.as_py() <= MAX_TIMESTAMP_MS:
        return
    ts = t.column("timestamp").to_numpy()
    i = int(np.argmax((ts > MAX_TIMESTAMP_MS) | (ts < -MAX_TIMESTAMP_MS)))
    raise PylogError(
        f"{task.topic}-{task.partition} offset {t.column('offset')[i].as_py()}: "
        f"record timestamp {int(ts[i])} "
        "is out of the range Spark's timestamp type can hold (about ±292,000 years in milliseconds): "
        "the producer probably wrote microseconds or nanoseconds where Kafka expects milliseconds"
    )
