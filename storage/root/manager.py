"""A pylog root: a Kafka log directory holding topics (Kafka's ``LogManager``).

    <root>/
      .lock                                writer lock (one writer process at a time)
      .kafka_cleanshutdown                 present only after a clean close
      recovery-point-offset-checkpoint     log-start-offset-checkpoint   cleaner-offset-checkpoint
      pylog-topics.json                    pylog's topic metadata (partition count, configs)
      <topic>-<partition>/                 one Kafka partition directory each

Topic metadata lives in a *file*, which Kafka never mistakes for a partition (it only loads
directories).  A Kafka log directory without ``pylog-topics.json`` (copied from a broker)
opens with its topics and partitions inferred from the directory names.

Any number of readers may open a root; the first mutating call (create_topic, append, ...)
takes the writer lock, consumes the clean-shutdown marker and recovers the logs as Kafka does
at broker start.  ``close()`` flushes, writes the checkpoints and the clean-shutdown marker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pylog.storage.backends.fs import LocalStorage, Storage
from pylog.storage.backends.objectfs import ObjectStorage
from pylog.storage.backends.objectstore import is_object_url
from pylog.storage.codec import records
from pylog.storage.codec.partitioner import partition_for_keys
from pylog.storage.config import LogConfig, validate_topic_name
from pylog.storage.errors import (
    ConfigError,
    CorruptCheckpointError,
    CorruptMetadataError,
    LogLockedError,
    PylogError,
    ReadOnlyError,
    TopicExistsError,
    UnknownTopicError,
)
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.loader import Recovery, load_log
from pylog.storage.partition.log import AppendInfo, Log
from pylog.storage.root import publish as pub
from pylog.storage.root.txn import CLEAN_SHUTDOWN, CLEAN_SHUTDOWN_CONTENT, Transactions, mutation

log = logging.getLogger("pylog.storage")

TOPICS_FILE = "pylog-topics.json"
LOCK_FILE = ".lock"
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
TABLE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field("headers", records.RECORD_SCHEMA.field("headers").type),
    ]
)
"""Columns of :meth:`Root.read_table`: those of Spark's Kafka source, in its order."""


def partition_dir(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def kafka_columns(t: pa.Table, topic: str, partition: int) -> pa.Table:
    """Decoded records of one partition (``records.RECORD_SCHEMA``) as Spark's Kafka source
    columns (:data:`TABLE_SCHEMA`), without a Python object per row (the Spark source uses it too)."""
    n = t.num_rows
    return pa.Table.from_arrays(
        [
            t.column("key"),
            t.column("value"),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            t.column("offset"),
            t.column("timestamp").cast(TIMESTAMP_TYPE),
            t.column("timestampType"),
            t.column("headers"),
        ],
        schema=TABLE_SCHEMA,
    )


class Root(Transactions):
    """Topics under one directory.  Use :func:`pylog.open`."""

    def __init__(self, storage: Storage, *, read_only: bool = False, lock_timeout: float = 0.0):
        self.storage = storage
        self.read_only = read_only
        self.lock_timeout = lock_timeout
        self._logs: dict[tuple[str, int], Log] = {}
        self._writer: contextlib.ExitStack | None = None
        self._had_clean_shutdown = False
        self._recovery_points: dict[tuple[str, int], int] = {}
        # readers honour the log start offsets too: retention checkpoints the new start before it
        # renames segments, so a reader never sees retention half done (crash-point campaign)
        self._start_offsets: dict[tuple[str, int], int] = {}
        # a damaged checkpoint: a reader goes on (``pylog verify`` reports it), the writer refuses it
        with contextlib.suppress(CorruptCheckpointError):
            self._start_offsets = ckpt.read_offsets(storage, ckpt.LOG_START_OFFSET)
        self.recoveries: list[Recovery] = []
        self._meta = self._read_meta()
        self._state = pub.read_state(storage)
        self.step_hook: Callable[[str], None] | None = None
        """Called with the name of each step of a publish (crash-point tests)."""
        self._failed: BaseException | None = None
        self._round_robin = 0
        self._txn_depth = 0
        self.commits = 0
        """Manifests this root published (object stores)."""

    # ------------------------------------------------------------------ metadata

    def _read_meta(self) -> dict[str, dict[str, Any]]:
        if self.storage.exists(TOPICS_FILE):
            path = f"{self.storage.describe()}/{TOPICS_FILE}"
            try:
                doc = json.loads(self.storage.read(TOPICS_FILE))
                topics = doc["topics"]
                if doc.get("version") != 1 or not isinstance(topics, dict):
                    raise ValueError(f"unsupported version {doc.get('version')!r}")
                return {str(k): dict(v) for k, v in topics.items()}
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptMetadataError(f"{path}: not a pylog topic metadata file: {e}") from e
        inferred: dict[str, int] = {}
        for name in self.storage.listdir(""):
            m = _PARTITION_DIR.match(name)
            if m and self.storage.isdir(name):
                inferred[m.group(1)] = max(inferred.get(m.group(1), 0), int(m.group(2)) + 1)
        return {t: {"partitions": n, "config": {}} for t, n in inferred.items()}

    def _write_meta(self) -> None:
        doc = {"version": 1, "topics": self._meta}
        self.storage.write_atomic(TOPICS_FILE, json.dumps(doc, indent=1, sort_keys=True).encode())

    def topics(self) -> list[str]:
        return sorted(self._meta)

    def partitions(self, topic: str) -> int:
        return int(self._topic(topic)["partitions"])

    def config(self, topic: str) -> LogConfig:
        return LogConfig.from_dict(self._topic(topic).get("config") or {})

    def _topic(self, topic: str) -> dict[str, Any]:
        try:
            return self._meta[topic]
        except KeyError:
            raise UnknownTopicError(
                f"unknown topic {topic!r} in {self.storage.describe()}; "
                f"topics: {', '.join(self.topics()) or 'none'}"
            ) from None

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
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ConfigError(f"partitions must be a positive integer, got {partitions!r}")
        cfg = LogConfig.from_dict(config or {})
        self._ensure_writer()
        if name in self._meta:
            if exist_ok:
                return
            raise TopicExistsError(f"topic {name!r} already exists in {self.storage.describe()}")
        # metadata first: a crash before the directories exist leaves a complete topic (the
        # writer creates missing directories), never a topic inferred from a partial set of
        # directories with default configs (crash-point campaign)
        self._meta[name] = {"partitions": partitions, "config": _explicit(cfg)}
        self._write_meta()
        for p in range(partitions):
            self.storage.makedirs(partition_dir(name, p))
        for p in range(partitions):
            self._state.high_watermarks[(name, p)] = self.log(name, p).log_end_offset
        pub.write_state(self.storage, self._state)

    @mutation
    def add_partitions(self, topic: str, count: int) -> int:
        """Add ``count`` partitions to ``topic`` (Kafka's ``CreatePartitions``; partitions are
        never removed, and keys may map to other partitions afterwards).  Returns the new total."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigError(f"count must be a positive integer, got {count!r}")
        self._ensure_writer()
        old = self.partitions(topic)
        for p in range(old, old + count):
            self.storage.makedirs(partition_dir(topic, p))
        self._topic(topic)["partitions"] = old + count
        self._write_meta()
        for p in range(old, old + count):
            self._state.high_watermarks[(topic, p)] = self.log(topic, p).log_end_offset
        pub.write_state(self.storage, self._state)
        return old + count

    @mutation
    def alter_config(self, topic: str, config: Mapping[str, Any]) -> None:
        """Merge Kafka topic configs into ``topic``'s configuration."""
        self._ensure_writer()
        merged = dict(self._topic(topic).get("config") or {})
        merged.update({k: str(v) for k, v in config.items()})
        cfg = LogConfig.from_dict(merged)
        self._topic(topic)["config"] = _explicit(cfg)
        self._write_meta()
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
        if self._writer is not None:
            return
        if self.read_only:
            raise ReadOnlyError(f"{self.storage.describe()} was opened read-only")
        stack = contextlib.ExitStack()
        deadline = time.monotonic() + self.lock_timeout
        while True:  # writers (e.g. two streaming queries) take turns; wait up to lock_timeout
            try:
                stack.enter_context(self.storage.lock(LOCK_FILE))
                break
            except LogLockedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
        self._had_clean_shutdown = self.storage.exists(CLEAN_SHUTDOWN)
        self.storage.delete(CLEAN_SHUTDOWN)  # a crash from here on is an unclean shutdown
        self.storage.fsync_dir("")
        self._recovery_points = ckpt.read_offsets(self.storage, ckpt.RECOVERY_POINT)
        self._start_offsets = ckpt.read_offsets(self.storage, ckpt.LOG_START_OFFSET)
        self._state = pub.read_state(self.storage)
        for lg in self._logs.values():  # logs opened by a reader are reopened as the writer
            lg.close()
        self._logs.clear()
        self._writer = stack

    def log(self, topic: str, partition: int) -> Log:
        """The log of one partition (recovered first when this root is the writer)."""
        n = self.partitions(topic)
        if not isinstance(partition, int | np.integer) or not 0 <= partition < n:
            raise ConfigError(f"partition {partition!r} is out of range for topic {topic!r} (0..{n - 1})")
        key = (topic, int(partition))
        lg = self._logs.get(key)
        if lg is None:
            writer = self._writer is not None
            result = load_log(
                self.storage,
                partition_dir(topic, int(partition)),
                self.config(topic),
                recovery_point=self._recovery_points.get(key, 0),
                log_start_offset=self._start_offsets.get(key, 0),
                had_clean_shutdown=self._had_clean_shutdown or not writer,
                read_only=not writer,
            )
            lg = result.log
            lg.high_watermark = self._state.high_watermarks.get(key)
            lg.step_hook = self._step  # the root's hook sees the steps of its logs too
            if writer:
                hw = lg.high_watermark
                if hw is not None and lg.log_end_offset > hw:
                    # written by a publish that never completed: never visible, so roll it back
                    result.recovery.unpublished_bytes = lg.truncate_to(hw)
                    log.warning(
                        "%s: removed %d unacknowledged bytes past the high watermark %d",
                        lg.directory,
                        result.recovery.unpublished_bytes,
                        hw,
                    )
                self.recoveries.append(result.recovery)
            self._logs[key] = lg
        return lg

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

        ``data`` is a ``pyarrow.Table`` with a ``value`` column (and optionally ``key``,
        ``timestamp``, ``headers``, ``partition``) or the values themselves.  Records go to
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
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        if isinstance(data, pa.Table):
            cols = set(data.column_names)
            if "value" not in cols:
                raise ConfigError(f"the table needs a 'value' column; it has {sorted(cols)}")
            value = data.column("value")
            key = data.column("key") if "key" in cols else key
            timestamp = data.column("timestamp") if "timestamp" in cols else timestamp
            headers = data.column("headers") if "headers" in cols else headers
            if partition is None and "partition" in cols:
                pcol = data.column("partition").to_numpy(zero_copy_only=False)
                parts: np.ndarray | None = np.asarray(pcol, dtype=np.int64)
            else:
                parts = None
        else:
            value, parts = data, None
        values = records._to_arrow(value, "value")
        n_rows = len(values)
        num = self.partitions(topic)
        if partition is not None:
            parts = np.full(n_rows, partition, dtype=np.int64)
        elif parts is None:
            parts = (
                np.full(n_rows, -1, np.int64)
                if key is None
                else partition_for_keys(records._to_arrow(key, "key"), num).astype(np.int64)
            )
            nulls = parts < 0
            if nulls.any():
                parts[nulls] = self._round_robin % num
                self._round_robin += 1
        bad = (parts < 0) | (parts >= num)
        if bad.any():
            raise ConfigError(
                f"partition {int(parts[np.argmax(bad)])} is out of range for topic {topic!r} (0..{num - 1})"
            )
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        keys = [(topic, int(p)) for p in np.unique(sorted_parts).tolist()]
        self._ensure_high_watermarks(keys)
        out: dict[int, AppendInfo] = {}
        take = pa.array(order)
        columns: dict[str, Any] = {"value": values, "key": key, "timestamp": timestamp, "headers": headers}
        arrays = {k: _take(v, take, n_rows) for k, v in columns.items()}
        with self._fail_stop(keys):
            for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [n_rows]]), strict=True):
                if hi <= lo:
                    continue
                p = int(sorted_parts[lo])
                sl = {
                    k: (v if v is None or isinstance(v, int | np.integer) else v[int(lo) : int(hi)])
                    for k, v in arrays.items()
                }
                out[p] = self.writable_log(topic, p).append(
                    sl["value"], sl["key"], sl["timestamp"], sl["headers"], codec=codec
                )
            self._acknowledge([(topic, p) for p in out])
        return out

    @contextlib.contextmanager
    def _fail_stop(self, keys: list[tuple[str, int]]) -> Iterator[None]:
        """An error after bytes were appended to the logs of ``keys`` leaves unacknowledged
        bytes there (and maybe an unknown state file): the root then refuses further writes
        until it is reopened, whose recovery truncates them.  Otherwise the next
        acknowledgement of the same log would publish them, and a retry would duplicate them
        (reliability campaign).  An error before any byte was written (a rejected append)
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
        middle of it leaves part of it visible (found by the power-cut campaign)."""
        missing = [key for key in keys if key not in self._state.high_watermarks]
        if missing:
            for key in missing:
                lg = self.writable_log(*key)
                lg.high_watermark = self._state.high_watermarks[key] = lg.log_end_offset
            pub.write_state(self.storage, self._state)

    def _acknowledge(self, keys: list[tuple[str, int]], sink: tuple[str, int] | None = None) -> None:
        """Make appended data durable and visible: fsync, then move the high watermarks (and
        record a sink's batch) in one atomic replacement of the state file."""
        for key in keys:
            self._logs[key].flush()
        self._step("flushed")
        for key in keys:
            self._state.high_watermarks[key] = self._logs[key].log_end_offset
        if sink is not None:
            self._state.sinks[sink[0]] = sink[1]
        pub.write_state(self.storage, self._state)
        self._step("state-written")

    def _step(self, name: str) -> None:
        if self.step_hook is not None:
            self.step_hook(name)

    # ------------------------------------------------------------------ exactly-once publish

    def last_committed_batch(self, sink_id: str) -> int:
        """The last batch id ``sink_id`` published (-1 if none)."""
        return pub.read_state(self.storage).sinks.get(pub.validate_sink_id(sink_id), -1)

    @mutation
    def publish(
        self, sink_id: str, batch_id: int, staged: list[pub.StagedFile]
    ) -> dict[tuple[str, int], AppendInfo] | None:
        """Publish staged batches as batch ``batch_id`` of ``sink_id``, exactly once.

        Returns what was appended per (topic, partition), or None when this batch (or a later
        one) was already published by this sink: a replay, which is skipped.  Staged files of
        this sink up to ``batch_id`` are removed either way.  Files are appended in a
        deterministic order (topic, partition, file name), offsets assigned by each log."""
        pub.validate_sink_id(sink_id)
        self._ensure_writer()
        self._state = pub.read_state(self.storage)
        topics = sorted({f.topic for f in staged})
        if batch_id <= self._state.sinks.get(sink_id, -1):
            self.sweep_staged(sink_id, batch_id, topics)
            return None
        out: dict[tuple[str, int], AppendInfo] = {}
        groups: dict[tuple[str, int], list[pub.StagedFile]] = {}
        for f in sorted(staged, key=lambda f: (f.topic, f.partition, f.name)):
            groups.setdefault((f.topic, f.partition), []).append(f)
        self._ensure_high_watermarks(list(groups))
        with self._fail_stop(list(groups)):
            for (topic, p), files in groups.items():
                data = b"".join(
                    f.data if f.data is not None else self.storage.read(f"{partition_dir(topic, p)}/{f.name}")
                    for f in files
                )
                if data:
                    out[(topic, p)] = self.writable_log(topic, p).append_batches(data, assign_offsets=True)
                self._step("appended")
            self._acknowledge(list(out), sink=(sink_id, batch_id))
        self.sweep_staged(sink_id, batch_id, topics)
        return out

    def sweep_staged(self, sink_id: str, up_to_batch: int, topics: list[str] | None = None) -> int:
        """Delete staged files of ``sink_id`` for batches <= ``up_to_batch`` (committed,
        replayed or abandoned attempts); returns how many were removed."""
        removed = 0
        for topic in self.topics() if topics is None else topics:
            for p in range(self.partitions(topic)):
                d = partition_dir(topic, p)
                for name in self.storage.listdir(d):
                    parsed = pub.parse_stage_name(name)
                    if parsed and parsed[0] == sink_id and parsed[1] <= up_to_batch:
                        self.storage.delete(f"{d}/{name}")
                        removed += 1
        return removed

    def read_table(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_timestamp: Any = None,
        end_timestamp: Any = None,
        include_headers: bool = True,
    ) -> pa.Table:
        """Records of ``topic`` as a table with Spark's Kafka source columns (:data:`TABLE_SCHEMA`).

        ``partitions`` (default all) are read one after the other, each in offset order, from
        ``start_offset`` or ``start_timestamp`` (the first offset whose timestamp is >= it, as
        Spark's ``startingTimestamp``) to ``end_offset`` or ``end_timestamp`` (exclusive: up to
        the first offset whose timestamp is >= it); timestamps are milliseconds since the epoch,
        ``datetime`` (naive: UTC) or ``numpy.datetime64``.  A partition with no record at or after
        ``start_timestamp`` gives no rows; a ``start_offset`` beyond a partition's log end offset is
        an :class:`OffsetOutOfRangeError`.  See :mod:`pylog.storage.root.reading`; :meth:`read_batches`
        streams the same rows.

        >>> import pylog, tempfile
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("clicks")
        >>> _ = root.append("clicks", [b"a", b"b", b"c", b"d"], timestamp=[1000, 2000, 3000, 4000])
        >>> root.read_table("clicks").column_names
        ['key', 'value', 'topic', 'partition', 'offset', 'timestamp', 'timestampType', 'headers']
        >>> root.read_table("clicks", start_offset=1, end_offset=3).column("value").to_pylist()
        [b'b', b'c']
        >>> root.read_table("clicks", start_timestamp=2000, end_timestamp=4000).column("offset").to_pylist()
        [1, 2]
        >>> from datetime import datetime, timezone
        >>> three_s = datetime(1970, 1, 1, 0, 0, 3, tzinfo=timezone.utc)
        >>> root.read_table("clicks", start_timestamp=three_s).num_rows
        2
        >>> root.close()
        """
        from pylog.storage.root import reading

        return reading.read_table(
            self,
            topic,
            partitions,
            start_offset=start_offset,
            end_offset=end_offset,
            start_timestamp=start_timestamp,
            end_timestamp=end_timestamp,
            include_headers=include_headers,
        )

    def read_batches(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_timestamp: Any = None,
        end_timestamp: Any = None,
        max_records: int = 65_536,
        include_headers: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """The rows of :meth:`read_table` as ``pyarrow.RecordBatch`` es of at most ``max_records``
        rows, read from the log a bounded amount at a time: for ranges too large for memory.

        Arguments are checked, and each partition's range fixed, when it is called.

        >>> import pylog, tempfile
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("clicks", partitions=2)
        >>> _ = root.append("clicks", [b"v%d" % i for i in range(1000)], key=[b"%d" % i for i in range(1000)])
        >>> sizes = [b.num_rows for b in root.read_batches("clicks", max_records=300)]
        >>> sum(sizes), max(sizes) <= 300
        (1000, True)
        >>> import pyarrow as pa   # a stream DuckDB, Polars or pyarrow.dataset can scan:
        >>> from pylog.storage.root.manager import TABLE_SCHEMA
        >>> reader = pa.RecordBatchReader.from_batches(TABLE_SCHEMA, root.read_batches("clicks"))
        >>> reader.read_all().num_rows
        1000
        >>> root.close()
        """
        from pylog.storage.root import reading

        return reading.read_batches(
            self,
            topic,
            partitions,
            start_offset=start_offset,
            end_offset=end_offset,
            start_timestamp=start_timestamp,
            end_timestamp=end_timestamp,
            max_records=max_records,
            include_headers=include_headers,
        )

    def to_pandas(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        start_offset: int | None = None,
        end_offset: int | None = None,
        start_timestamp: Any = None,
        end_timestamp: Any = None,
        include_headers: bool = True,
    ) -> Any:
        """:meth:`read_table` as a ``pandas.DataFrame`` (needs pandas).

        >>> import pylog, tempfile
        >>> root = pylog.open(tempfile.mkdtemp())
        >>> root.create_topic("clicks")
        >>> _ = root.append("clicks", [b"a", b"b"], key=[b"k", b"k"], timestamp=1_700_000_000_000)
        >>> df = root.to_pandas("clicks", include_headers=False)
        >>> list(df.columns)
        ['key', 'value', 'topic', 'partition', 'offset', 'timestamp', 'timestampType']
        >>> len(df), str(df["timestamp"].dtype), df["value"].tolist()
        (2, 'datetime64[ms, UTC]', [b'a', b'b'])
        >>> root.close()
        """
        from pylog.storage.root import reading

        return reading.to_pandas(
            self,
            topic,
            partitions,
            start_offset=start_offset,
            end_offset=end_offset,
            start_timestamp=start_timestamp,
            end_timestamp=end_timestamp,
            include_headers=include_headers,
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        for lg in self._logs.values():
            if not lg.read_only:
                lg.flush()
        self.checkpoint()

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoints (writer only)."""
        if self._writer is None:
            return
        rp = dict(self._recovery_points)
        lso = dict(self._start_offsets)
        for key, lg in self._logs.items():
            rp[key] = lg.recovery_point
            if lg.log_start_offset > lg.segments[0].base_offset:
                lso[key] = lg.log_start_offset
            else:
                lso.pop(key, None)
        ckpt.write_offsets(self.storage, ckpt.RECOVERY_POINT, rp)
        self._step("recovery-point-checkpointed")
        ckpt.write_offsets(self.storage, ckpt.LOG_START_OFFSET, lso)
        self._step("log-start-checkpointed")

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
            self._step("logs-closed")
            self.checkpoint()
            self.storage.write_atomic(CLEAN_SHUTDOWN, CLEAN_SHUTDOWN_CONTENT)
            self._step("clean-shutdown-written")
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


def _explicit(cfg: LogConfig) -> dict[str, str]:
    """The topic configs that differ from Kafka's defaults, by their topic names."""
    defaults = LogConfig().to_dict()
    return {k: v for k, v in cfg.to_dict().items() if defaults.get(k) != v}


def _take(col: Any, indices: pa.Array, n: int) -> Any:
    if col is None:
        return None
    if isinstance(col, int | np.integer):
        return col
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if isinstance(col, pa.Array):
        return col.take(indices)
    arr = np.asarray(col) if not isinstance(col, list) else None
    if arr is not None and arr.dtype != object and arr.shape == (n,):
        return arr[indices.to_numpy()]
    return [col[i] for i in indices.to_pylist()]


def open_root(
    path: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    read_only: bool = False,
    lock_timeout: float = 0.0,
) -> Root:
    """Open (creating if needed) a pylog root at a local path or an fsspec URL.

    Local disk: reading needs no lock; the first write takes the root's writer lock, and with
    ``lock_timeout`` > 0 waits that many seconds for another writer to finish.

    Object stores (``s3://bucket/prefix``, any fsspec filesystem with put-if-absent): every
    change is published atomically by a versioned manifest; concurrent writers are safe.
    ``storage_options`` go to fsspec (``endpoint_url``, ``key``, ``secret``,
    ``client_kwargs.region_name``, ``anon``...), plus pylog's ``pylog.*`` settings."""
    text = os.fspath(path)
    if is_object_url(text):
        storage = ObjectStorage.open(text, dict(storage_options or {}), read_only=read_only)
        return Root(storage, read_only=read_only, lock_timeout=lock_timeout)
    if storage_options:
        raise ConfigError(
            f"{text}: storage options apply to object-store URLs (s3://...), not to local paths"
        )
    if text.startswith("file://"):
        text = text[len("file://") :]
    return Root(LocalStorage(text, create=not read_only), read_only=read_only, lock_timeout=lock_timeout)
