"""The pylog sink: ``df.writeStream.format("pylog")`` (exactly-once) and ``df.write.format("pylog")``.

Column contract (Spark's Kafka sink): ``value`` (binary or string) is required; ``key``
(binary or string), ``topic`` (string), ``partition`` (int), ``headers``
(array<struct<key: string, value: binary>>) and ``timestamp`` (timestamp) are optional.  The
``topic`` option overrides the column.  A ``partition`` value must lie in the topic's
partitions (a negative or too large one fails the write, as Kafka's producer does).  Records
without a partition go to Kafka's murmur2 partition of their key; records with a null key are
spread like the Java producer's sticky partitioner: a task's null-key records fill one
partition for a record batch (``STICKY_SWITCH_BYTES``, Kafka's default ``batch.size``) and
then move on to the next partition.  As Kafka's broker does, topics with
``message.timestamp.type=LogAppendTime`` get the append time (the time the task encoded the
rows) and compacted topics refuse records with a null key.

Protocol (see ``storage/root/publish.py``): each executor task encodes its rows into record batches
and *stages* them next to the target logs, on a local disk as segments with their indexes; the
driver's ``commit(messages, batchId)`` links them into the logs in a deterministic order (each
batch's base offset patched, the files renamed: no record byte passes through the driver;
staged segments under 8 MiB are copied into the active segment) and atomically records
``(query, batchId)`` with the new high watermarks, so a replayed batch is skipped and a crash
mid-publish leaves nothing visible.

Identity: a streaming write is keyed by Spark's streaming query id, which Spark keeps in the
query's checkpoint (``metadata``) and gives every task as the local property
``sql.streaming.queryId``; the tasks carry it to the driver in their commit messages.  A query
restarted from its checkpoint (given by the ``checkpointLocation`` option or by
``spark.sql.streaming.checkpointLocation``) is the same query, and its replayed batches are
skipped; a deleted or new checkpoint is a new query, and all its batches are written.  The
record of a query that has not committed for ``queryRetentionMs`` (default 7 days) is dropped.
A query that last ran on a pylog keyed by its checkpoint location (state file version 1) is
recognized by that key on its first commit.  A batch write (``df.write``) is its own writer:
it is never taken for a replay and leaves no record.

Options: ``path`` (required), ``topic``, ``partitions`` (create missing topics with this many
partitions), any Kafka topic config by its name (``cleanup.policy``, ``segment.bytes``, ...: used
when a topic is created), ``compression.type`` (none, gzip, snappy, lz4, zstd; default: the
topic's), ``batch.size`` (target bytes per record batch, default 1 MiB), ``lockTimeoutMs``
(how long a commit waits for another writer, default 60000), ``maintenance`` (true/false,
default true) and ``maintenance.budgetMs`` (default 2000) for the compaction and retention that
run after each publish, ``queryRetentionMs`` (default 604800000 = 7 days) for how long the record
of a stopped streaming query is kept.  The options are parsed, and the columns checked, by
:mod:`.sink_options`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pylog.connector.sink_options import SinkOptions, check_schema, parse_sink_options
from pylog.connector.workers import on_task_start
from pylog.storage.backends.fs import Storage
from pylog.storage.backends.objectfs import ObjectStorage
from pylog.storage.codec import records
from pylog.storage.codec.partitioner import partition_for_keys
from pylog.storage.config import LogConfig
from pylog.storage.errors import ConfigError, StorageError
from pylog.storage.maintenance import merge
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.partition.log import check_keys, timestamp_type
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_root, open_staging
from pylog.storage.root.stage import Stager, open_stager

log = logging.getLogger("pylog.connector")

TopicMeta = dict[str, tuple[int, LogConfig]]
"""Partition count and config per topic, as the driver read them when it planned the write."""


def _topic_meta(root: Root) -> TopicMeta:
    return {t: (root.partitions(t), root.config(t)) for t in root.topics()}


def prepare_topics(opts: SinkOptions) -> TopicMeta:
    """Check (or, with the ``partitions`` option, create) the target topic on the driver, and
    return the root's topics as its tasks will stage for them.  Like a Kafka producer's
    metadata, this is as of the planning of the write (each micro-batch plans again)."""
    for trust_known in (True, False):  # a topic missing from a known state: ask the store
        try:
            root = _open(opts, read_only=True, trust_known=trust_known)
        except StorageError:
            root = None  # the root does not exist yet
        if root is not None:
            try:
                meta = _topic_meta(root)
            finally:
                root.close()
            if opts.topic is None or opts.topic in meta:
                return meta
    if opts.topic is None:
        return {}
    if opts.partitions is None:
        raise ConfigError(
            f"topic {opts.topic!r} does not exist in {opts.path}; create it (pylog create-topic) or set "
            f'.option("partitions", N) to create it on first write'
        )
    with _open(opts, read_only=False) as writer:
        writer.create_topic(opts.topic, opts.partitions, opts.topic_config, exist_ok=True)
        return _topic_meta(writer)


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
                self.root = _open(self.opts, read_only=True)
            meta = self.known[topic] = (self.root.partitions(topic), self.root.config(topic))
        return meta

    def close(self) -> None:
        if self.root is not None:
            self.root.close()


KNOWN_STATE_S = 30.0
"""On an object store, the planning of a micro-batch and its commit start from the root's state
this process confirmed newest at most this long ago (its previous commit, typically) instead of
asking the store: a Kafka producer's metadata is as old; a commit is conditional, and one that
meets a newer state re-bases or runs again there (whether the batch is already committed is
always decided on the newest state)."""


def _open(opts: SinkOptions, *, read_only: bool, trust_known: bool = False) -> Root:
    return open_root(
        opts.path,
        opts.storage_options or None,
        read_only=read_only,
        lock_timeout=opts.lock_timeout_s,
        trust_known_s=KNOWN_STATE_S if trust_known else 0.0,
    )


@dataclass
class PylogCommitMessage(WriterCommitMessage):
    staged: list[dict[str, object]]
    records: int
    query_id: str | None = None  # Spark's streaming query id (None: a batch write)


def _ms_timestamps(col: pa.Array | pa.ChunkedArray | None, n: int, now_ms: int) -> np.ndarray:
    if col is None:
        return np.full(n, now_ms, dtype=np.int64)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64())
    filled = pc.fill_null(col.cast(pa.int64()), now_ms)
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)


STICKY_SWITCH_BYTES = 16384
"""Null-key records fill one partition for this many bytes (Kafka producer's default
``batch.size``; smaller when the ``batch.size`` option is) before the task moves on to the
next partition: the Java producer's sticky partitioner, which switches partition per batch."""


def stage_task(
    batches: Iterator[pa.RecordBatch],
    opts: SinkOptions,
    batch_id: int,
    task: int,
    attempt: int,
    query_id: str | None = None,
    topics: TopicMeta | None = None,
) -> PylogCommitMessage:
    """Executor side: encode and stage this task's rows; nothing becomes visible here.
    ``query_id`` (Spark's streaming query id) names the staged files and travels to the
    driver in the commit message; without it (batch writes) the sink id does.  ``topics``:
    the driver's metadata (:func:`prepare_topics`); with it, the task reads nothing of the
    root (on an object store: no request before its uploads)."""
    writer_id = pub.validate_sink_id(query_id) if query_id else opts.sink_id
    storage = open_staging(opts.path, opts.storage_options or None)
    meta = _TaskTopics(opts, topics or {})
    files: dict[tuple[str, int], Stager] = {}
    counts = 0
    sticky: dict[str, list[int]] = {}
    ok = False
    try:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            counts += rb.num_rows
            _stage_batch(
                meta,
                storage,
                rb,
                opts,
                task,
                files,
                int(time.time() * 1000),
                batch_id,
                attempt,
                writer_id,
                sticky,
            )
        # object stores: a small staging travels in the commit message (no PUT, GET, DELETE)
        small = sum(f.size for f in files.values()) <= STAGE_INLINE_BYTES
        staged = [files[key].finish(inline=small).to_dict() for key in sorted(files)]
        ok = True
    finally:
        if not ok:  # a failed task leaves nothing behind
            for f in files.values():
                with contextlib.suppress(Exception):
                    f.abandon()
        meta.close()
    return PylogCommitMessage(staged=staged, records=counts, query_id=query_id)


def _local_dir() -> str | None:
    """The executor's first local directory (``spark.local.dir``, which Spark hands its Python
    workers as ``SPARK_LOCAL_DIRS``): where a task stages segments for an object store."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return first if first and os.path.isdir(first) else None


def _sticky_partitions(sizes: np.ndarray, num: int, state: list[int], switch_bytes: int) -> np.ndarray:
    """Partitions of null-key records of ``sizes`` bytes: consecutive records fill the current
    partition up to ``switch_bytes``, then the next one takes over.  ``state`` is
    [partition, bytes already in it], carried across the task's Arrow batches."""
    part, used = state
    starts = used + np.cumsum(sizes) - sizes  # bytes before each record, from the switch point
    chunk = starts // switch_bytes
    end = used + int(sizes.sum())
    state[0] = (part + end // switch_bytes) % num
    state[1] = end % switch_bytes
    return np.asarray((part + chunk) % num, dtype=np.int64)


def _stage_batch(
    meta: _TaskTopics,
    storage: Storage,
    rb: pa.RecordBatch,
    opts: SinkOptions,
    task: int,
    files: dict[tuple[str, int], Stager],
    now_ms: int,
    batch_id: int,
    attempt: int,
    writer_id: str,
    sticky: dict[str, list[int]],
) -> None:
    names = rb.schema.names
    col = {n: rb.column(n) for n in names}
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
    ts = _ms_timestamps(col.get("timestamp"), n, now_ms)
    headers = col.get("headers")
    inputs = records.EncodeInput.of(value, key, ts, headers)  # parsed once for every topic and partition
    for topic in distinct:
        if topic_col is None or len(distinct) == 1:
            sel = np.arange(n)
        else:
            sel = np.nonzero(pc.equal(topic_col, topic).to_numpy(zero_copy_only=False))[0]
        num, config = meta.get(topic)  # unknown topic: a clear error from the root
        topic_key = None if key is None else (key if len(distinct) == 1 else key.take(pa.array(sel)))
        check_keys(config, topic_key, f"topic {topic!r}")  # the broker's check of a compacted topic
        if "partition" in col:
            given = col["partition"] if len(distinct) == 1 else col["partition"].take(pa.array(sel))
            bad = pc.and_kleene(pc.is_valid(given), pc.or_(pc.less(given, 0), pc.greater_equal(given, num)))
            if pc.any(bad).as_py():
                v = given.filter(bad)[0].as_py()
                raise ConfigError(
                    f"Invalid partition given with record: {v} is not in the range [0...{num}) of "
                    f"topic {topic!r} ({num} partitions)"
                )
            parts = np.array(
                pc.fill_null(given.cast(pa.int64()), -1).to_numpy(zero_copy_only=False), np.int64
            )
        else:
            parts = np.full(sel.shape[0], -1, dtype=np.int64)
        need = parts < 0
        if need.any() and topic_key is not None:
            has_key = np.asarray(topic_key.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            keyed = need & has_key
            if keyed.any():
                parts[keyed] = partition_for_keys(topic_key.filter(pa.array(keyed)), num).astype(np.int64)
            need = need & ~has_key
        if need.any():  # null keys: sticky, switching partition per record batch
            sizes = np.maximum(inputs.v_len[sel[need]], 0)  # value bytes (null: 0)
            state = sticky.setdefault(topic, [task % num, 0])
            parts[need] = _sticky_partitions(sizes, num, state, min(STICKY_SWITCH_BYTES, opts.batch_bytes))
        ts_type = timestamp_type(config)
        topic_input = inputs.with_timestamps(now_ms) if ts_type == 1 else inputs
        counts = np.bincount(parts, minlength=num)
        for p in np.flatnonzero(counts).tolist():
            if (topic, p) not in files:
                name = pub.stage_name(writer_id, batch_id, task, attempt)
                files[(topic, p)] = open_stager(
                    storage, topic, p, name, config, _local_dir(), direct=opts.direct_writes
                )
        routed = np.full(n, -1, np.int64)  # rows of other topics go nowhere
        routed[sel] = parts
        bases = np.array([files[(topic, p)].next_offset if counts[p] else 0 for p in range(num)], np.int64)
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
            f = files[(topic, p)]
            f.write(enc.buffer, enc.batches)


def _topic_codec(config: LogConfig) -> str:
    ct = config.compression_type
    return "none" if ct in ("producer", "uncompressed") else ct


QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark's StreamExecution for every task
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _task_ids() -> tuple[int, int, int | None, str | None]:
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


STAGE_INLINE_BYTES = 4 << 20
"""On an object store, a task whose staged batches total at most this many bytes sends them to
the driver in its commit message instead of staging objects (small micro-batches: three
requests fewer per task and partition); larger stagings are written as objects."""

CRASH_ENV = "PYLOG_TEST_CRASH_AT_STEP"
"""Testing hook: when set to a publish step name ("appended", "flushed", "state-written"; on an
object store also the manifest commit's "uploaded", "manifest-created", "committed"), the process
exits abruptly at that step of a sink commit (crash-point tests of the exactly-once protocol).
Never set it in production."""


def publish(
    opts: SinkOptions,
    messages: list[Any],
    batch_id: int,
    *,
    overwrite: bool = False,
    streaming: bool = True,
    now: int | None = None,
) -> None:
    """Driver side: publish every staged file of ``batch_id`` exactly once.

    A streaming batch is keyed by the query id its tasks sent (see the module docstring); a
    batch write (``streaming=False``) is published unconditionally and leaves no record."""
    messages = [m for m in messages if m is not None]
    staged = [pub.StagedFile.from_dict(d) for m in messages for d in m.staged]
    queries = {q for m in messages if (q := getattr(m, "query_id", None))}
    if len(queries) > 1:
        raise RuntimeError(
            f"pylog sink: the tasks of batch {batch_id} name several queries {sorted(queries)}"
        )
    writer_id = next(iter(queries)) if queries else opts.sink_id
    exactly_once = streaming
    legacy = opts.sink_id if queries else None
    now = int(time.time() * 1000) if now is None else now
    # an overwrite decides what to hide from the partitions it sees: from the newest state
    with _open(opts, read_only=False, trust_known=not overwrite) as root:
        crash_at = os.environ.get(CRASH_ENV)
        if crash_at:

            def crash(step: str) -> None:
                if step == crash_at:
                    os._exit(137)

            root.step_hook = crash
            if isinstance(root.storage, ObjectStorage):  # the steps of its manifest commit
                root.storage.step_hook = crash

        def commit() -> None:
            # a replayed batch publishes nothing, so it must not truncate either
            if overwrite and (not exactly_once or batch_id > root.last_committed_batch(writer_id, legacy)):
                _truncate_topics(root, {f.topic for f in staged} | ({opts.topic} if opts.topic else set()))
            root.publish(
                writer_id,
                batch_id,
                staged,
                exactly_once=exactly_once,
                legacy_sink=legacy,
                now=now,
                retention_ms=opts.query_retention_ms,
            )

        # one atomic change on an object store: the truncation of an overwrite and the publish
        # are committed (or, after losing a race to another writer, run again) together
        root.transaction(commit)
        if opts.maintenance:
            _maintain(root, {(f.topic, f.partition) for f in staged}, opts.maintenance_budget_ms)


def _truncate_topics(root: Root, topics: set[str]) -> None:
    """Overwrite semantics: every existing record of the topics becomes unreadable (the log
    start offset moves to the end); offsets keep growing, as readers expect of a log."""
    for topic in sorted(topics):
        for p in range(root.partitions(topic)):
            lg = root.writable_log(topic, p)
            lg.delete_segments(list(lg.segments))


def _maintain(root: Root, touched: set[tuple[str, int]], budget_ms: int) -> None:
    """Retention and compaction of the partitions just written, within a time budget; never
    fails the commit (the data is already durable and recorded)."""
    try:
        report = maintenance.maintain(
            root,
            now=int(time.time() * 1000),
            budget_s=budget_ms / 1000.0,
            partitions=sorted(touched),
            merge_below=merge.COMMIT_SMALL_MAX,  # larger segments: a maintenance run of their own
        )
        if report.budget_exhausted:  # the rest waits for the next commits, or a job of its own
            log.warning(
                "%s: maintenance after this commit used up its budget (maintenance.budgetMs=%d) with "
                "work left: it goes on after the next commits; for a backlog, run "
                "pylog.connector.maintenance.run(spark, path) or pylog compact (pylog describe shows "
                "the compaction backlog)",
                root.storage.describe(),
                budget_ms,
            )
    except Exception as e:  # maintenance must not fail a durable commit
        log.warning("maintenance after publish failed: %s", e)


def discard(opts: SinkOptions, messages: list[Any]) -> None:
    """abort: remove what the tasks staged."""
    root = _open(opts, read_only=True)
    try:
        for m in messages:
            for d in getattr(m, "staged", None) or []:
                for path in pub.StagedFile.from_dict(d).paths():  # none: carried in the message
                    root.storage.delete(path)
    finally:
        root.close()


class PylogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, overwrite: bool, topics: TopicMeta | None = None):
        self.opts = opts
        self.overwrite = overwrite
        self.topics = topics or {}  # pickled to the tasks: they need not open the root

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PylogCommitMessage:
        task, attempt, batch, query = _task_ids()
        if batch is None:
            raise RuntimeError("pylog sink: no streaming batch id in the task context")
        on_task_start()
        return stage_task(iterator, self.opts, batch, task, attempt, query, self.topics)

    def commit(self, messages: list[Any], batchId: int) -> None:
        publish(self.opts, messages, batchId, overwrite=self.overwrite)

    def abort(self, messages: list[Any], batchId: int) -> None:
        discard(self.opts, messages)


class PylogBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, overwrite: bool, topics: TopicMeta | None = None):
        self.opts = opts
        self.overwrite = overwrite
        self.topics = topics or {}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PylogCommitMessage:
        task, attempt, _, _ = _task_ids()
        on_task_start()
        return stage_task(iterator, self.opts, 0, task, attempt, topics=self.topics)

    def commit(self, messages: list[Any]) -> None:
        publish(self.opts, messages, 0, overwrite=self.overwrite, streaming=False)

    def abort(self, messages: list[Any]) -> None:
        discard(self.opts, messages)


@overload
def make_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: Literal[False]
) -> PylogBatchWriter: ...
@overload
def make_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: Literal[True]
) -> PylogStreamWriter: ...
@overload
def make_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: bool
) -> PylogBatchWriter | PylogStreamWriter: ...
def make_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: bool
) -> PylogBatchWriter | PylogStreamWriter:
    """The writer of ``DataSource.writer`` / ``streamWriter``: options and columns are checked,
    and the target topic created if asked for, on the driver before any task runs."""
    opts = parse_sink_options(options, streaming=streaming)
    check_schema(schema, opts)
    topics = prepare_topics(opts)
    if streaming:
        return PylogStreamWriter(opts, overwrite, topics)
    return PylogBatchWriter(opts, overwrite, topics)
