"""The pylog sink on the executors: each task encodes its rows into record batches and stages
them next to the target logs (Spark's Kafka writer does this in ``KafkaWriteTask``).

Nothing becomes visible here: a task's staged files are named by the writer, batch, task and
attempt, and travel to the driver's commit (:mod:`.sink_commit`) in a
:class:`~pylog.connector.sink_options.PylogCommitMessage`.  Rows are routed as Kafka's producer
routes them (:mod:`pylog.storage.root.routing`): the ``partition`` column, else murmur2 of the
key, else the sticky partitioner for null keys.

This module runs inside Spark tasks; it imports pyspark only for the task context.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from pylog.connector.sink_options import PylogCommitMessage, SinkOptions, TopicMeta, open_sink_root
from pylog.storage.backends.base import Storage
from pylog.storage.codec import records
from pylog.storage.codec.columns import RECORD_TIMESTAMP_RANGE, timestamps_ms
from pylog.storage.config import LogConfig
from pylog.storage.errors import ConfigError
from pylog.storage.partition.log import check_keys, timestamp_type
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_staging
from pylog.storage.root.routing import Sticky, assign_partitions
from pylog.storage.root.stage import Stager, open_stager

STICKY_SWITCH_BYTES = 16384
"""Null-key records fill one partition for this many bytes (Kafka producer's default
``batch.size``; smaller when the ``batch.size`` option is) before the task moves on to the
next partition: the Java producer's sticky partitioner, which switches partition per batch."""

STAGE_INLINE_BYTES = 4 << 20
"""On an object store, a task whose staged batches total at most this many bytes sends them to
the driver in its commit message instead of staging objects (small micro-batches: three
requests fewer per task and partition); larger stagings are written as objects."""

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark's StreamExecution for every task
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class _TaskTopics:
    """What a task needs of the root: each topic's partition count and config, taken from the
    driver's metadata; the root is opened only for a topic not in it (a ``topic`` column
    naming a topic created since the write was planned)."""

    def __init__(self, opts: SinkOptions, known: TopicMeta):
        self.opts = opts
        self.known = dict(known)
        self.root: Root | None = None

    def get(self, topic: str) -> tuple[int, LogConfig]:
        meta = self.known.get(topic)
        if meta is None:
            if self.root is None:
                self.root = open_sink_root(self.opts, read_only=True)
            meta = self.known[topic] = (self.root.partitions(topic), self.root.config(topic))
        return meta

    def close(self) -> None:
        if self.root is not None:
            self.root.close()


@dataclass
class _Task:
    """One task's staging: where it writes, under which name, and what it has opened so far."""

    opts: SinkOptions
    topics: _TaskTopics
    storage: Storage
    name: str  # of its staged files (writer, batch, task, attempt)
    task: int
    files: dict[tuple[str, int], Stager]
    sticky: dict[str, Sticky]  # per topic: where its null-key records go next

    def stager(self, topic: str, partition: int, config: LogConfig) -> Stager:
        f = self.files.get((topic, partition))
        if f is None:
            f = self.files[(topic, partition)] = open_stager(
                self.storage,
                topic,
                partition,
                self.name,
                config,
                _local_dir(),
                direct=self.opts.direct_writes,
            )
        return f


def stage_task(
    batches: Iterator[pa.RecordBatch],
    opts: SinkOptions,
    batch_id: int,
    task: int,
    attempt: int,
    query_id: str | None = None,
    topics: TopicMeta | None = None,
) -> PylogCommitMessage:
    """Encode and stage this task's rows; nothing becomes visible here.  ``query_id`` (Spark's
    streaming query id) names the staged files and travels to the driver in the commit
    message; without it (batch writes) the sink id does.  ``topics``: the driver's metadata
    (:func:`~pylog.connector.sink_commit.prepare_topics`); with it, the task reads nothing of
    the root (on an object store: no request before its uploads)."""
    writer_id = pub.validate_sink_id(query_id) if query_id else opts.sink_id
    state = _Task(
        opts,
        _TaskTopics(opts, topics or {}),
        open_staging(opts.path, opts.storage_options or None),
        pub.stage_name(writer_id, batch_id, task, attempt),
        task,
        {},
        {},
    )
    counts = 0
    ok = False
    try:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            counts += rb.num_rows
            _stage_batch(state, rb, int(time.time() * 1000))
        # object stores: a small staging travels in the commit message (no PUT, GET, DELETE)
        small = sum(f.size for f in state.files.values()) <= STAGE_INLINE_BYTES
        staged = [state.files[key].finish(inline=small).to_dict() for key in sorted(state.files)]
        ok = True
    finally:
        if not ok:  # a failed task leaves nothing behind
            for f in state.files.values():
                with contextlib.suppress(Exception):
                    f.abandon()
        state.topics.close()
    return PylogCommitMessage(staged=staged, records=counts, query_id=query_id)


def _local_dir() -> str | None:
    """The executor's first local directory (``spark.local.dir``, which Spark hands its Python
    workers as ``SPARK_LOCAL_DIRS``): where a task stages segments for an object store."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return first if first and os.path.isdir(first) else None


def record_timestamps(column: pa.Array | None, n: int, now_ms: int) -> np.ndarray:
    """The ``timestamp`` column as epoch milliseconds (null or absent: ``now_ms``), refusing one
    before 1970 as Kafka's producer and ``Root.append`` do (-1 means "no timestamp" only in the
    old message formats, never in a record a producer sends)."""
    ts = timestamps_ms(column, n, now_ms=now_ms)
    if ts.size and int(ts.min()) < 0:
        bad = int(ts.min())
        when = np.datetime64(bad, "ms").astype(str).replace("T", " ")
        raise ConfigError(
            f"column 'timestamp': {bad} ({when} UTC) is before 1970-01-01: a record timestamp is "
            f"{RECORD_TIMESTAMP_RANGE} (Kafka's producer refuses negative timestamps)"
        )
    return ts


def _stage_batch(state: _Task, rb: pa.RecordBatch, now_ms: int) -> None:
    """Encode one Arrow batch into the staged files of the partitions its rows go to."""
    opts = state.opts
    col = {n: rb.column(n) for n in rb.schema.names}
    n = rb.num_rows
    topic_col = None
    if opts.topic is not None:
        distinct = [opts.topic]
    else:
        topic_col = col["topic"]
        if topic_col.null_count:
            raise ConfigError("column 'topic' has null values and no topic option is set")
        distinct = sorted(pc.unique(topic_col).to_pylist())
    value = col["value"].cast(pa.binary()) if pa.types.is_string(col["value"].type) else col["value"]
    key = col.get("key")
    if key is not None and pa.types.is_string(key.type):
        key = key.cast(pa.binary())
    ts = record_timestamps(col.get("timestamp"), n, now_ms)
    inputs = records.EncodeInput.of(value, key, ts, col.get("headers"))  # parsed once for every topic
    for topic in distinct:
        one = topic_col is None or len(distinct) == 1
        sel = (
            np.arange(n) if one else np.nonzero(pc.equal(topic_col, topic).to_numpy(zero_copy_only=False))[0]
        )
        num, config = state.topics.get(topic)  # unknown topic: a clear error from the root
        topic_key = None if key is None else (key if one else key.take(pa.array(sel)))
        check_keys(config, topic_key, f"topic {topic!r}")  # the broker's check of a compacted topic
        given = _given_partitions(col.get("partition"), sel, one, num, topic)
        sticky = state.sticky.get(topic)
        if sticky is None:
            sticky = state.sticky[topic] = Sticky(
                state.task % num, min(STICKY_SWITCH_BYTES, opts.batch_bytes)
            )
        sizes = inputs.v_len if one else inputs.v_len[sel]  # value bytes, for the sticky partitioner
        parts = assign_partitions(num, given, topic_key, sticky, sizes)
        ts_type = timestamp_type(config)
        topic_input = inputs.with_timestamps(now_ms) if ts_type == 1 else inputs
        counts = np.bincount(parts, minlength=num)
        for p in np.flatnonzero(counts).tolist():
            state.stager(topic, p, config)
        routed = np.full(n, -1, np.int64)  # rows of other topics go nowhere
        routed[sel] = parts
        bases = np.array(
            [state.files[(topic, p)].next_offset if counts[p] else 0 for p in range(num)], np.int64
        )
        # every partition's batches in one pass over the Arrow batch, straight from its buffers
        encoded = records.encode_partitioned(
            topic_input,
            routed,
            bases,
            codec=opts.codec or _topic_codec(config),
            batch_bytes=min(opts.batch_bytes, config.max_message_bytes - 12),
            timestamp_type=ts_type,
        )
        for p, enc in sorted(encoded.items()):
            state.files[(topic, p)].write(enc.buffer, enc.batches)


def _given_partitions(
    column: pa.Array | None, sel: np.ndarray, one: bool, num: int, topic: str
) -> np.ndarray:
    """The ``partition`` column of the rows ``sel`` (-1 where null or absent); a partition
    outside the topic fails the write, as Kafka's producer does."""
    if column is None:
        return np.full(sel.shape[0], -1, dtype=np.int64)
    given = column if one else column.take(pa.array(sel))
    bad = pc.and_kleene(pc.is_valid(given), pc.or_(pc.less(given, 0), pc.greater_equal(given, num)))
    if pc.any(bad).as_py():
        v = given.filter(bad)[0].as_py()
        raise ConfigError(
            f"Invalid partition given with record: {v} is not in the range [0...{num}) of "
            f"topic {topic!r} ({num} partitions)"
        )
    return np.array(pc.fill_null(given.cast(pa.int64()), -1).to_numpy(zero_copy_only=False), np.int64)


def _topic_codec(config: LogConfig) -> str:
    ct = config.compression_type
    return "none" if ct in ("producer", "uncompressed") else ct


def task_ids() -> tuple[int, int, int | None, str | None]:
    """(partition id, attempt, streaming batch id, streaming query id) of the running task.

    The attempt names this task's staged files, so it is unique to this run of the task:
    Spark's attempt number starts from 0 again when a failed query is restarted, and a task
    of the failed run may still be running then (a zombie, e.g. one still starting up).  Had
    both runs the same file names, the zombie could write into the files of the new run, even
    after its commit linked them into the log.  Spark's task attempt id (unique in its
    SparkContext) with random digits (unique across SparkContexts) keeps them apart; what a
    zombie leaves is never in a commit message, and is swept after the batch commits."""
    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only inside a Spark task
        return 0, 0, None, None
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    attempt = ctx.taskAttemptId() * 10**12 + secrets.randbelow(10**12)
    return ctx.partitionId(), attempt, None if batch is None else int(batch), query or None
