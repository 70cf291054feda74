"""A pylog root: a Kafka log directory holding topics (Kafka's ``LogManager``).

    <root>/
      .lock                                writer lock (one writer process at a time)
      .kafka_cleanshutdown                 present only after a clean close
      recovery-point-offset-checkpoint     log-start-offset-checkpoint   cleaner-offset-checkpoint
      pylog-topics.json                    pylog's topic metadata (partition count, configs)
      pylog-state.json                     high watermarks and the sinks' committed batches
      <topic>-<partition>/                 one Kafka partition directory each

Any number of readers may open a root; the first mutating call (create_topic, append, ...)
takes the writer lock, consumes the clean-shutdown marker and recovers the logs as Kafka does
at broker start.  ``close()`` flushes, writes the checkpoints and the clean-shutdown marker.

:class:`Root` ties together the parts of the root, each in its own module:
:mod:`~pylog.storage.root.metadata` (the topics, ``pylog-topics.json``),
:mod:`~pylog.storage.root.writer` (the writer lock, recovery, checkpoints),
:mod:`~pylog.storage.root.repair` (repairing damaged partitions: the ``Repairs`` mixin),
:mod:`~pylog.storage.root.routing` (the partition of each appended record),
:mod:`~pylog.storage.root.publish` (acknowledgement and exactly-once publishing),
:mod:`~pylog.storage.root.txn` (transactions on object stores: the ``Transactions`` mixin) and
:mod:`~pylog.storage.root.reading` (reading ranges, as :mod:`~pylog.storage.root.schema`'s table:
the ``TableReading`` mixin).  :mod:`~pylog.storage.root.opening` opens a root from a local path
or an fsspec URL.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pylog.storage.backends.base import Storage, join
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.config import LogConfig, validate_topic_name
from pylog.storage.errors import ConfigError, PylogError, ReadOnlyError, TopicExistsError
from pylog.storage.faults import Faults
from pylog.storage.partition.listing import first_base_offset
from pylog.storage.partition.loader import Recovery
from pylog.storage.partition.log import AppendInfo, Log
from pylog.storage.root import publish as pub
from pylog.storage.root import topics, writer
from pylog.storage.root.metadata import MAX_PARTITIONS, partition_count, partition_dir
from pylog.storage.root.reading import TableReading
from pylog.storage.root.repair import Repairs
from pylog.storage.root.routing import Router
from pylog.storage.root.schema import TABLE_SCHEMA
from pylog.storage.root.txn import Transactions, mutation
from pylog.storage.root.writer import CLEAN_SHUTDOWN

_logger = logging.getLogger("pylog.storage")

__all__ = ["CLEAN_SHUTDOWN", "TABLE_SCHEMA", "Root", "partition_dir"]


class Root(Transactions, TableReading, Repairs):
    """Topics under one directory.  Use :func:`pylog.open`."""

    def __init__(self, storage: Storage, *, read_only: bool = False, lock_timeout: float = 0.0):
        self.storage = storage
        self.read_only = read_only
        self.lock_timeout = lock_timeout
        self._logs: dict[tuple[str, int], Log] = {}
        self._writer: contextlib.ExitStack | None = None
        self._had_clean_shutdown = False
        self._recovery_points: dict[tuple[str, int], int] = {}
        self.recoveries: list[Recovery] = []
        # readers honour the log start offsets too: retention checkpoints the new start before it
        # renames segments, so a reader never sees retention half done (test_crash_points.py)
        self._read_root()
        self.faults = Faults()
        """The named steps of its changes and its logs', for fault injection (pylog.storage.faults)."""
        self._failed: BaseException | None = None
        self._router = Router()
        self._txn_depth = 0
        self.commits = 0
        """Manifests this root published (object stores)."""

    # ------------------------------------------------------------------ topics

    def topics(self) -> list[str]:
        return self._meta.names()

    def partitions(self, topic: str) -> int:
        return self._meta.partitions(topic)

    def config(self, topic: str) -> LogConfig:
        return self._meta.config(topic)

    def _topic(self, topic: str) -> dict[str, Any]:
        return self._meta.entry(topic)

    @mutation
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, Any] | None = None,
        *,
        exist_ok: bool = False,
    ) -> None:
        """Create a topic with ``partitions`` partitions and Kafka topic configs.

        >>> import pylog, tempfile
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("events", partitions=4, config={"retention.ms": 86_400_000})
        >>> root.topics(), root.partitions("events"), root.config("events").retention_ms
        (['events'], 4, 86400000)
        >>> root.close()
        """
        validate_topic_name(name)
        partition_count(partitions)
        cfg = LogConfig.from_dict(config or {})
        self._ensure_writer()
        topics.finish_delete(self, name)  # a deletion of the name that failed midway
        if name in self._meta:
            if exist_ok:
                return
            raise TopicExistsError(f"topic {name!r} already exists in {self.storage.describe()}")
        # metadata first: a crash before the directories exist leaves a complete topic (the
        # writer creates missing directories), never a topic inferred from a partial set of
        # directories with default configs (test_crash_points.py)
        self._meta.add_topic(name, partitions, cfg)
        try:
            for p in range(partitions):
                self.storage.makedirs(partition_dir(name, p))
            self.storage.fsync_dir("")  # the directories' names are durable before any append
            for p in range(partitions):
                lg = self.log(name, p)
                lg.high_watermark = self._state.high_watermarks[(name, p)] = lg.log_end_offset
            pub.write_state(self.storage, self._state)
        except BaseException:
            # all or nothing: a failure (too many open files, a full disk) leaves no topic behind
            # (on an object store, the transaction is rolled back instead)
            if not isinstance(self.storage, ObjectStorage):
                self._undo_create_topic(name, partitions)
            raise

    def _undo_create_topic(self, name: str, partitions: int) -> None:
        """Remove what a failed :meth:`create_topic` made: its logs, directories, high
        watermarks and metadata entry (best effort: the cause may still be there)."""
        for p in range(partitions):
            lg = self._logs.pop((name, p), None)
            if lg is not None:
                with contextlib.suppress(Exception):
                    lg.close()
            self._state.high_watermarks.pop((name, p), None)
        try:
            for p in range(partitions):
                directory = partition_dir(name, p)
                for f in self.storage.listdir(directory):
                    self.storage.delete(join(directory, f))
                if self.storage.isdir(directory):
                    self.storage.rmdir(directory)
            self._meta.remove_topic(name)
            pub.write_state(self.storage, self._state)
        except Exception as e:
            _logger.warning(
                "%s: could not remove the topic %r whose creation failed: %s", self.storage, name, e
            )

    @mutation
    def add_partitions(self, topic: str, count: int) -> int:
        """Add ``count`` partitions to ``topic`` (Kafka's ``CreatePartitions``; partitions are
        never removed, and keys may map to other partitions afterwards).  Returns the new total."""
        partition_count(count, "count")
        self._ensure_writer()
        old = self.partitions(topic)
        if old + count > MAX_PARTITIONS:
            raise ConfigError(
                f"topic {topic!r} has {old} partitions: adding {count} would exceed the limit of "
                f"{MAX_PARTITIONS}"
            )
        for p in range(old, old + count):
            self.storage.makedirs(partition_dir(topic, p))
        self.storage.fsync_dir("")  # the directories' names are durable before any append
        self._meta.set_partitions(topic, old + count)
        for p in range(old, old + count):
            lg = self.log(topic, p)
            lg.high_watermark = self._state.high_watermarks[(topic, p)] = lg.log_end_offset
        pub.write_state(self.storage, self._state)
        return old + count

    def delete_topic(self, name: str, *, if_exists: bool = False) -> bool:
        """Delete a topic, its data and the consumer groups' offsets of its partitions (Kafka's
        ``DeleteTopics``): readers see it whole or gone, a crash midway is completed by the next
        writer; one transaction on an object store (:mod:`~pylog.storage.root.topics`).  An
        unknown topic raises :class:`UnknownTopicError`, or returns False with ``if_exists``.

        >>> import pylog, tempfile
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("events", partitions=2)
        >>> root.delete_topic("events"), root.topics(), root.delete_topic("events", if_exists=True)
        (True, [], False)
        >>> root.close()
        """
        return topics.delete_topic(self, name, if_exists=if_exists)

    @mutation
    def alter_config(self, topic: str, config: Mapping[str, Any]) -> None:
        """Merge Kafka topic configs into ``topic``'s configuration."""
        self._ensure_writer()
        cfg = self._meta.merge_config(topic, config)
        for (t, _), lg in self._logs.items():
            if t == topic:
                lg.config = cfg

    # ------------------------------------------------------------------ logs

    def _ensure_writer(self) -> None:
        if self._failed is not None:
            raise PylogError(
                f"{self.storage.describe()}: an earlier append or publish failed ({self._failed}); close "
                "and reopen the root (its recovery removes what that call wrote)"
            ) from self._failed
        if self._writer is None:
            self._open_for_writing()

    def _open_for_writing(self) -> None:
        """Become the writer of this root at its first change; the steps, in order (the whole
        sequence of opening a root for writing: :mod:`~pylog.storage.root.writer`)."""
        if self.read_only:
            raise ReadOnlyError(f"{self.storage.describe()} was opened read-only")
        start = writer.become_writer(self.storage, self.lock_timeout)  # lock, marker, checkpoints, state
        self._had_clean_shutdown, self._state = start.had_clean_shutdown, start.state
        self._recovery_points, self._start_offsets = start.recovery_points, start.start_offsets
        self._close_logs()  # logs opened by a reader are reopened as the writer
        self._writer = start.lock
        topics.finish_deletes(self)  # deletions a crash interrupted

    def _close_logs(self) -> None:
        for lg in self._logs.values():
            lg.close()
        self._logs.clear()

    def _partition_key(self, topic: str, partition: int) -> tuple[str, int]:
        n = self.partitions(topic)
        if not isinstance(partition, int | np.integer) or not 0 <= partition < n:
            raise ConfigError(f"partition {partition!r} is out of range for topic {topic!r} (0..{n - 1})")
        return topic, int(partition)

    def log(self, topic: str, partition: int) -> Log:
        """The log of one partition (recovered first when this root is the writer)."""
        key = self._partition_key(topic, partition)
        lg = self._logs.get(key)
        if lg is None:
            lg, _ = writer.open_log(
                self.storage,
                *key,
                self.config(topic),
                writer=self._writer is not None,
                had_clean_shutdown=self._had_clean_shutdown,
                recovery_point=self._recovery_points.get(key, 0),
                log_start_offset=self._start_offsets.get(key, 0),
                high_watermark=self.high_watermark(*key),
                faults=self.faults,  # the root's hook sees the steps of its logs too
                recoveries=self.recoveries,
            )
            self._logs[key] = lg
        return lg

    def log_start_offset(self, topic: str, partition: int) -> int:
        """The log start offset of a partition, as :meth:`log` would open it, without opening
        it when it is not open yet: the checkpointed start and the first segment's name (no
        segment file is read, so a planner that only needs the start stays cheap)."""
        key = self._partition_key(topic, partition)
        lg = self._logs.get(key)
        if lg is not None:
            return lg.log_start_offset
        start = self._start_offsets.get(key, 0)
        first = first_base_offset(self.storage, partition_dir(*key))
        start = start if first is None else max(start, first)
        hw = self.high_watermark(*key)
        if hw is not None and start > hw:  # damaged: the opened log records it, and reads report it
            return self.log(*key).log_start_offset
        return start

    def high_watermark(self, topic: str, partition: int) -> int | None:
        """The end of acknowledged data of a partition as this root last read or wrote it
        (None: no record, e.g. a Kafka log directory); a reader never reads at or beyond it."""
        return self._state.high_watermarks.get((topic, int(partition)))

    def become_writer(self) -> None:
        """Take the writer lock now (on local disk, waiting up to ``lock_timeout``) instead of
        at the first write; the recovery of the logs still happens as each is opened."""
        self._ensure_writer()

    def writable_log(self, topic: str, partition: int) -> Log:
        self._ensure_writer()
        return self.log(topic, partition)

    # ------------------------------------------------------------------ data

    @mutation
    def append(
        self,
        topic: str,
        data: pa.Table | Any,
        *,
        key: Any = None,
        timestamp: Any = None,
        headers: Any = None,
        partition: int | None = None,
        codec: str | int | None = None,
    ) -> dict[int, AppendInfo]:
        """Append records to ``topic``; returns what was written per partition.

        ``data`` is a ``pyarrow.Table`` (or record batch, dict of columns, pandas DataFrame) with a
        ``value`` column (and optionally ``key``, ``timestamp``, ``headers``, ``partition``), or
        a list (or Arrow array) of the values themselves.  Records go to
        ``partition`` if given, else to their ``partition`` column, else to Kafka's murmur2
        partition of their key; records without a key share one partition chosen round robin.

        >>> import pylog, tempfile, pyarrow as pa
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("events", partitions=2)
        >>> events = pa.table({"key": [b"k1", b"k2", b"k3"], "value": [b"a", b"b", b"c"]})
        >>> written = root.append("events", events)        # partitions: murmur2 of the keys
        >>> {p: (w.first_offset, w.last_offset) for p, w in sorted(written.items())}
        {0: (0, 0), 1: (0, 1)}
        >>> root.append("events", [b"d"], partition=0)[0].first_offset
        1
        >>> root.close()
        """
        self._ensure_writer()
        routed = self._router.route(
            topic,
            self.partitions(topic),
            data,
            key=key,
            timestamp=timestamp,
            headers=headers,
            partition=partition,
        )
        keys = [(topic, p) for p in routed]
        self._ensure_high_watermarks(keys)
        out: dict[int, AppendInfo] = {}
        with self._fail_stop(keys):
            for p, rows in routed.items():
                out[p] = self.writable_log(topic, p).append(
                    rows.value, rows.key, rows.timestamp, rows.headers, codec=codec
                )
            self._acknowledge([(topic, p) for p in out])
        return out

    @mutation
    def append_batches(
        self, batches: Mapping[tuple[str, int], bytes | memoryview], *, now: int | None = None
    ) -> dict[tuple[str, int], AppendInfo]:
        """Append encoded record batches (v2, CRCs checked, compressed batches kept as they are)
        to several partitions as one acknowledgement: one fsync per log and one state write (on an
        object store, one commit).  Offsets are assigned from each log end, as a partition leader
        does; a batch that fails its checks raises before anything is written."""
        self._ensure_writer()
        keys = [self._partition_key(t, p) for t, p in batches]
        self._ensure_high_watermarks(keys)
        out: dict[tuple[str, int], AppendInfo] = {}
        with self._fail_stop(keys):
            for key, data in zip(keys, batches.values(), strict=True):
                out[key] = self.writable_log(*key).append_batches(data, now=now)
            self._acknowledge(keys)
        return out

    @contextlib.contextmanager
    def _fail_stop(self, keys: list[tuple[str, int]]) -> Iterator[None]:
        """An error after bytes were appended to the logs of ``keys`` leaves unacknowledged
        bytes there (and maybe an unknown state file): the root then refuses further writes
        until it is reopened, whose recovery truncates them.  Otherwise the next
        acknowledgement of the same log would publish them, and a retry would duplicate them
        (tests/reliability/test_io_errors.py).  An error before any byte was written (a rejected append)
        leaves the root usable."""
        before = {key: self.writable_log(*key).log_end_offset for key in keys}
        try:
            yield
        except Exception as e:
            logs = [self._logs[key] for key in keys if key in self._logs]
            if any(lg._failed is not None for lg in logs) or any(
                self._logs[key].log_end_offset != leo for key, leo in before.items() if key in self._logs
            ):
                self._failed = e
            raise

    def _ensure_high_watermarks(self, keys: list[tuple[str, int]]) -> None:
        """Give partitions without a high watermark (a Kafka log directory, or a topic whose
        creation a crash interrupted) one at their log end *before* anything is appended to
        them: otherwise readers see an append before it is acknowledged, and a crash in the
        middle of it leaves part of it visible (tests/reliability/test_power_loss.py)."""
        missing = [key for key in keys if key not in self._state.high_watermarks]
        if missing:
            for key in missing:
                lg = self.writable_log(*key)
                lg.high_watermark = self._state.high_watermarks[key] = lg.log_end_offset
            pub.write_state(self.storage, self._state)

    def _acknowledge(self, keys: list[tuple[str, int]], sink: pub.BatchCommit | None = None) -> None:
        """Make appended data durable and visible: fsync, then move the high watermarks (and
        record a sink's batch) in one atomic replacement of the state file."""
        for key in keys:
            self._logs[key].flush()
        self.faults.step("flushed")
        for key in keys:
            lg = self._logs[key]
            # the log's own high watermark moves too: maintenance and the last stable offset of
            # a writer that stays open read it (retention and cleaning stop at it)
            lg.high_watermark = self._state.high_watermarks[key] = lg.log_end_offset
        if sink is not None:
            self._state.record(sink)
        pub.write_state(self.storage, self._state)
        self.faults.step("state-written")

    # ------------------------------------------------------------------ exactly-once publish

    def last_committed_batch(self, sink_id: str) -> int:
        """The last batch id the writer ``sink_id`` (a streaming query id) published (-1 if
        none)."""
        return pub.read_state(self.storage).last_batch(pub.validate_sink_id(sink_id))

    @mutation
    def publish(
        self,
        sink_id: str,
        batch_id: int,
        staged: list[pub.StagedFile],
        *,
        exactly_once: bool = True,
        now: int | None = None,
        retention_ms: int = pub.DEFAULT_QUERY_RETENTION_MS,
        copy_below: int = pub.COPY_BELOW_BYTES,
    ) -> dict[tuple[str, int], AppendInfo] | None:
        """Publish staged batches as batch ``batch_id`` of the writer ``sink_id`` (a streaming
        query id), exactly once.

        Returns what was appended per (topic, partition), or None when this batch (or a later
        one) was already published by this writer: a replay, which is skipped.  Staged files
        of this writer up to ``batch_id`` are removed either way.  Files are appended in a
        deterministic order (topic, partition, file name), offsets assigned by each log.
        Without ``exactly_once`` (batch writes: each is its own writer) nothing is checked or
        recorded.  ``now`` (ms, default: the clock) dates the writer's record; records of
        writers not seen for ``retention_ms`` are dropped.  Staged segments of at least
        ``copy_below`` bytes are linked into the logs rather than copied (see :mod:`publish`)."""
        pub.validate_sink_id(sink_id)
        self._ensure_writer()
        self._state = pub.read_state(self.storage)
        topics = sorted({f.topic for f in staged})
        if exactly_once and batch_id <= self._state.last_batch(sink_id):
            self._remove_staged(staged, sink_id, batch_id, topics)
            return None
        now = int(time.time() * 1000) if now is None else now
        record = None
        if exactly_once:
            record = pub.BatchCommit(sink_id, batch_id, now, retention_ms)
        out: dict[tuple[str, int], AppendInfo] = {}
        groups = pub.group_staged(staged)
        self._ensure_high_watermarks(list(groups))
        with self._fail_stop(list(groups)):
            for (topic, p), files in groups.items():
                info = pub.append_staged(
                    self.storage, self.writable_log(topic, p), files, copy_below=copy_below
                )
                if info is not None:
                    out[(topic, p)] = info
                self.faults.step("appended")
            self._acknowledge(list(out), sink=record)
        self._remove_staged(staged, sink_id, batch_id, topics, now=now, max_age_ms=retention_ms)
        return out

    def _remove_staged(
        self,
        staged: Sequence[pub.StagedFile],
        sink_id: str,
        batch_id: int,
        topics: list[str],
        *,
        now: int | None = None,
        max_age_ms: int | None = None,
    ) -> None:
        """After a publish (or a skipped replay): remove its staged files and sweep abandoned
        ones.  On an object store the publish's own are deleted by name and the sweep, which
        LISTs the staged objects, runs at most once per :data:`publish.STAGED_SWEEP_INTERVAL_S`
        per root and process (a commit then needs no LIST)."""
        if self.transactional:
            for f in staged:
                for path in f.paths():
                    self.storage.delete(path)
            if not pub.staged_sweep_due(self.storage.describe()):
                return
        self.sweep_staged(sink_id, batch_id, topics, now=now, max_age_ms=max_age_ms)

    def sweep_staged(
        self,
        sink_id: str,
        up_to_batch: int,
        topics: list[str] | None = None,
        *,
        now: int | None = None,
        max_age_ms: int | None = None,
    ) -> int:
        """Delete staged files that no commit will publish (see :func:`publish.sweep_staged`):
        of ``sink_id`` for batches <= ``up_to_batch``, of other queries for batches they
        published, and, with ``now`` and ``max_age_ms``, of any writer when older than that."""
        partitions = [
            (topic, p)
            for topic in (self.topics() if topics is None else topics)
            for p in range(self.partitions(topic))
        ]
        return pub.sweep_staged(
            self.storage, sink_id, up_to_batch, partitions, state=self._state, now=now, max_age_ms=max_age_ms
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        for lg in self._logs.values():
            if not lg.read_only:
                lg.flush()
        self.checkpoint()

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoints and fold the state's
        journal into the state file (writer only)."""
        if self._writer is None:
            return
        writer.write_checkpoints(
            self.storage, self._logs, self._recovery_points, self._start_offsets, self.faults.step
        )
        pub.fold_state(self.storage, self._state)

    def close(self) -> None:
        """Flush, write checkpoints and (as the writer) the clean-shutdown marker."""
        if isinstance(self.storage, ObjectStorage):
            # every change was committed by its own operation; anything else (Log-level writes
            # outside :meth:`transaction`) was never acknowledged and is dropped
            if self._writer is not None:
                self._end_transaction(self.storage, refresh=False)  # closes the logs too
            for lg in self._logs.values():
                lg.close()
            self._logs.clear()
            return
        if self._writer is not None and self._failed is not None:
            for lg in self._logs.values():  # no flush, no checkpoint, no clean-shutdown marker
                lg._failed = lg._failed or self._failed
                lg.close()
            self._writer.close()
            self._writer = None
        elif self._writer is not None:
            for lg in self._logs.values():
                lg.close()
            self.faults.step("logs-closed")
            self.checkpoint()
            writer.mark_clean_shutdown(self.storage)
            self.faults.step("clean-shutdown-written")
            self._writer.close()
            self._writer = None
        else:
            for lg in self._logs.values():
                lg.close()
        self._logs.clear()

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"pylog.Root({self.storage.describe()!r}, topics={self.topics()})"
