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
A batch write (``df.write``) is its own writer: it is never taken for a replay and leaves no
record.

Options: ``path`` (required), ``topic``, ``partitions`` (create missing topics with this many
partitions), any Kafka topic config by its name (``cleanup.policy``, ``segment.bytes``, ...: used
when a topic is created), ``compression.type`` (none, gzip, snappy, lz4, zstd; default: the
topic's), ``batch.size`` (target bytes per record batch, default 1 MiB), ``lockTimeoutMs``
(how long a commit waits for another writer, default 60000), ``maintenance`` (true/false,
default true) and ``maintenance.budgetMs`` (default 2000) for the compaction and retention that
run after each publish, ``queryRetentionMs`` (default 604800000 = 7 days) for how long the record
of a stopped streaming query is kept.  The options are parsed, and the columns checked, by
:mod:`.sink_options`.

Modules, as Spark splits its Kafka writer: this one holds the writers Spark calls
(:class:`PylogStreamWriter`, :class:`PylogBatchWriter`) and :func:`make_writer`; their ``write``
runs on the executors (:mod:`.sink_task`: encode and stage), their ``commit`` and ``abort`` on
the driver (:mod:`.sink_commit`: publish, discard).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, overload

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from pylog.connector.sink_commit import discard, prepare_topics, publish
from pylog.connector.sink_options import (
    PylogCommitMessage,
    SinkOptions,
    TopicMeta,
    check_schema,
    parse_sink_options,
)
from pylog.connector.sink_task import stage_task, task_ids
from pylog.connector.workers import on_task_start

__all__ = [
    "PylogBatchWriter",
    "PylogStreamWriter",
    "discard",
    "make_writer",
    "prepare_topics",
    "publish",
    "stage_task",
]


class PylogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, overwrite: bool, topics: TopicMeta | None = None):
        self.opts = opts
        self.overwrite = overwrite
        self.topics = topics or {}  # pickled to the tasks: they need not open the root

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PylogCommitMessage:
        task, attempt, batch, query = task_ids()
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
        task, attempt, _, _ = task_ids()
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
