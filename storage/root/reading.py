"""Reading a topic without Spark: offset or time ranges, as one table or as streamed batches.

The logic behind :meth:`Root.read_table <pylog.storage.root.manager.Root.read_table>`,
:meth:`~pylog.storage.root.manager.Root.read_batches` and :meth:`~pylog.storage.root.manager.Root.to_pandas`.
Rows have the columns of Spark's Kafka source (:data:`~pylog.storage.root.schema.TABLE_SCHEMA`).
The functions read any :class:`LogSource` (a ``Root`` is one); :class:`TableReading` is the
mixin that gives ``Root`` those three methods.

A range is resolved per partition into offsets ``[start, end)`` exactly as Spark's Kafka source
resolves its options:

* ``start_offset`` (default: the log start offset; an offset below it starts there, one above
  the log end offset is an :class:`OffsetOutOfRangeError`) or ``start_timestamp``
  (``startingTimestamp``): the earliest offset whose record timestamp is >= it (Kafka's
  ListOffsets, through the time index); a partition with no such record reads nothing;
* ``end_offset`` (default: the log end offset, exclusive) or ``end_timestamp``
  (``endingTimestamp``): the earliest offset whose timestamp is >= it, exclusive; the log end
  offset when there is none.

Offsets are never negative.  Timestamps are milliseconds since the epoch, a ``datetime`` with a
time zone (a naive one is refused: which zone it means is unknown) or a ``numpy.datetime64``
(UTC, like the ``timestamp`` column).  Kafka timestamps need not grow with offsets: a
time range is a range of offsets, and may hold records whose own timestamps fall outside it.

>>> from datetime import datetime, timezone
>>> to_millis(datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc), "start_timestamp")
1700000000000
>>> to_millis(1_700_000_000_000, "end_timestamp")
1700000000000
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from pylog.storage.codec.columns import NAIVE_DATETIME
from pylog.storage.errors import ConfigError, OffsetOutOfRangeError
from pylog.storage.partition.log import DEFAULT_FETCH_BYTES, Log
from pylog.storage.root.schema import TABLE_SCHEMA, kafka_columns

TimestampLike = int | dt.datetime | np.datetime64
"""Milliseconds since the epoch, a ``datetime`` with a time zone or a ``numpy.datetime64`` (UTC)."""

DEFAULT_MAX_RECORDS = 65_536
"""Rows per batch of :func:`read_batches` unless told otherwise."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class LogSource(Protocol):
    """Where topics are read from: the partition count of a topic and the log of each
    partition (:class:`~pylog.storage.root.manager.Root`)."""

    def partitions(self, topic: str) -> int: ...

    def log(self, topic: str, partition: int) -> Log: ...


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition to read."""

    partition: int
    start: int
    end: int


def to_millis(value: TimestampLike, name: str) -> int:
    """``value`` as milliseconds since the epoch (``name`` is the argument, for the message)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be milliseconds since the epoch or a datetime, got {value!r}")
    if isinstance(value, int | np.integer):
        ms = int(value)
    elif isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError(f"{name}: {value!r} is {NAIVE_DATETIME}")
        ms = (value - _EPOCH) // dt.timedelta(milliseconds=1)
    elif isinstance(value, np.datetime64):
        if np.isnat(value):
            raise ConfigError(f"{name} must be a time, got {value!r}")
        ms = int(value.astype("datetime64[ms]").astype(np.int64))
    else:
        raise ConfigError(
            f"{name} must be milliseconds since the epoch or a datetime, got {type(value).__name__} {value!r}"
        )
    if ms < 0:
        # Kafka reserves negative targets (-1 latest, -2 earliest, -3 max timestamp)
        raise ConfigError(f"{name} must not be before 1970-01-01 (milliseconds >= 0), got {value!r}")
    return ms


def _offset(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an integer offset, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ConfigError(f"{name} must be an offset >= 0, got {value} (offsets are never negative)")
    return int(value)


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ReadRange:
    """A validated read range, before it is resolved against each partition's log."""

    start_offset: int | None = None
    end_offset: int | None = None
    start_timestamp: int | None = None
    end_timestamp: int | None = None

    @classmethod
    def of(
        cls,
        start_offset: Any = None,
        end_offset: Any = None,
        start_timestamp: Any = None,
        end_timestamp: Any = None,
    ) -> ReadRange:
        if start_offset is not None and start_timestamp is not None:
            raise ConfigError("give start_offset or start_timestamp, not both")
        if end_offset is not None and end_timestamp is not None:
            raise ConfigError("give end_offset or end_timestamp, not both")
        so, eo = _offset(start_offset, "start_offset"), _offset(end_offset, "end_offset")
        if so is not None and eo is not None and eo < so:
            raise ConfigError(f"end_offset {eo} is before start_offset {so}")
        st = None if start_timestamp is None else to_millis(start_timestamp, "start_timestamp")
        et = None if end_timestamp is None else to_millis(end_timestamp, "end_timestamp")
        if st is not None and et is not None and et < st:
            raise ConfigError(f"end_timestamp {et} is before start_timestamp {st}")
        return cls(so, eo, st, et)

    def resolve(self, lg: Log, partition: int) -> PartitionRange:
        """The offsets of ``lg`` this range covers (end capped at the log end offset)."""
        leo = lg.log_end_offset
        if self.start_timestamp is not None:
            start = _offset_for_time(lg, self.start_timestamp, leo)
        elif self.start_offset is None:
            start = lg.log_start_offset
        else:
            start = max(self.start_offset, lg.log_start_offset)
            if start > leo:
                raise OffsetOutOfRangeError(
                    f"{lg.directory}: start_offset {self.start_offset} is out of range "
                    f"[{lg.log_start_offset}, {leo}] (beyond the log end offset)"
                )
        if self.end_timestamp is not None:
            end = _offset_for_time(lg, self.end_timestamp, leo)
        else:
            end = leo if self.end_offset is None else min(self.end_offset, leo)
        return PartitionRange(partition, start, max(start, end))


def _offset_for_time(lg: Log, ms: int, leo: int) -> int:
    """The earliest offset with a timestamp >= ``ms`` (Kafka's ListOffsets), else the log end."""
    found = lg.offset_for_timestamp(ms)
    return leo if found is None else max(lg.log_start_offset, min(found.offset, leo))


def resolve(
    root: LogSource, topic: str, partitions: Sequence[int] | None, bounds: ReadRange
) -> list[PartitionRange]:
    """The offset range of each partition of ``topic`` to read (all partitions when None)."""
    parts = range(root.partitions(topic)) if partitions is None else partitions
    if isinstance(parts, int | np.integer):
        raise ConfigError(f"partitions must be a sequence of partition numbers, got {parts!r}")
    out = []
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, int | np.integer):
            raise ConfigError(f"partition numbers must be integers, got {type(p).__name__} {p!r}")
        out.append(bounds.resolve(root.log(topic, int(p)), int(p)))
    return out


def read_table(
    root: LogSource,
    topic: str,
    partitions: Sequence[int] | None = None,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_timestamp: TimestampLike | None = None,
    end_timestamp: TimestampLike | None = None,
    include_headers: bool = True,
) -> pa.Table:
    """The records of the range as one table (see :meth:`Root.read_table`)."""
    bounds = ReadRange.of(start_offset, end_offset, start_timestamp, end_timestamp)
    tables = []
    for r in resolve(root, topic, partitions, bounds):
        lg = root.log(topic, r.partition)
        tables.append(kafka_columns(lg.read_table(r.start, r.end), topic, r.partition))
    table = pa.concat_tables(tables) if tables else TABLE_SCHEMA.empty_table()
    return table if include_headers else table.drop_columns(["headers"])


def read_batches(
    root: LogSource,
    topic: str,
    partitions: Sequence[int] | None = None,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    start_timestamp: TimestampLike | None = None,
    end_timestamp: TimestampLike | None = None,
    max_records: int = DEFAULT_MAX_RECORDS,
    max_bytes: int = DEFAULT_FETCH_BYTES,
    include_headers: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The records of the range as record batches of at most ``max_records`` rows, partition
    after partition in offset order; the log is read ``max_bytes`` (of stored, possibly
    compressed, batches; at least one whole batch) at a time.

    Arguments are checked and every partition's range resolved when this is called (the end
    is the log end offset *then*: records appended while iterating are not read); the data is
    read as the batches are consumed."""
    bounds = ReadRange.of(start_offset, end_offset, start_timestamp, end_timestamp)
    max_records = _positive(max_records, "max_records")
    max_bytes = _positive(max_bytes, "max_bytes")
    ranges = resolve(root, topic, partitions, bounds)
    return _batches(root, topic, ranges, max_records, max_bytes, include_headers)


def _batches(
    root: LogSource,
    topic: str,
    ranges: list[PartitionRange],
    max_records: int,
    max_bytes: int,
    include_headers: bool,
) -> Iterator[pa.RecordBatch]:
    for r in ranges:
        if r.end <= r.start:
            continue
        lg = root.log(topic, r.partition)
        for rs in lg.iter_record_sets(r.start, r.end, max_bytes=max_bytes):
            t = rs.data_records()
            off = t.column("offset").to_numpy()
            keep = (off >= r.start) & (off < r.end)
            if not keep.all():
                t = t.filter(pa.array(keep))
            if t.num_rows == 0:
                continue
            table = kafka_columns(t, topic, r.partition)
            if not include_headers:
                table = table.drop_columns(["headers"])
            for batch in table.to_batches(max_chunksize=max_records):
                if batch.num_rows:
                    yield batch


def to_pandas(root: LogSource, topic: str, partitions: Sequence[int] | None = None, **kwargs: Any) -> Any:
    """:func:`read_table` as a ``pandas.DataFrame`` (needs pandas)."""
    return read_table(root, topic, partitions, **kwargs).to_pandas()


class TableReading:
    """The table-reading API of :class:`~pylog.storage.root.manager.Root` (a mixin, as
    :class:`~pylog.storage.root.txn.Transactions`): :meth:`read_table`, :meth:`read_batches` and
    :meth:`to_pandas`, each calling the module function of the same name with the root as its
    :class:`LogSource`."""

    def partitions(self, topic: str) -> int:  # pragma: no cover - Root's
        raise NotImplementedError

    def log(self, topic: str, partition: int) -> Log:  # pragma: no cover - Root's
        raise NotImplementedError

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
        a ``datetime`` with a time zone (a naive one is refused) or a ``numpy.datetime64``; an
        offset is never negative (a :class:`ConfigError`).  A partition with no record at or after
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
        return read_table(
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
        >>> from pylog.storage.root.schema import TABLE_SCHEMA
        >>> reader = pa.RecordBatchReader.from_batches(TABLE_SCHEMA, root.read_batches("clicks"))
        >>> reader.read_all().num_rows
        1000
        >>> root.close()
        """
        return read_batches(
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
        return to_pandas(
            self,
            topic,
            partitions,
            start_offset=start_offset,
            end_offset=end_offset,
            start_timestamp=start_timestamp,
            end_timestamp=end_timestamp,
            include_headers=include_headers,
        )
