"""Which partition each record goes to, as Kafka's producer chooses: for ``Root.append`` and
for the Spark sink's tasks.

A record goes to the partition given for it (for the whole call, or in its ``partition``
column), else to Kafka's murmur2 partition of its key (:mod:`pylog.storage.codec.partitioner`),
else (no key) where the null-key strategy puts it: :class:`RoundRobin` (``Root.append``: the
records of one call share one partition, the next call takes the next one) or :class:`Sticky`
(the sink: the Java producer's sticky partitioner, one partition per record batch's worth of
bytes).  :func:`assign_partitions` does this for a whole column at once; :meth:`Router.route`
then groups an append's rows by partition (stably: each partition gets its records in their
order) without a Python object per row.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from pylog.storage.codec.columns import record_timestamps_ms, to_binary_array
from pylog.storage.codec.partitioner import partition_for_keys
from pylog.storage.errors import ConfigError


@dataclass(frozen=True)
class Rows:
    """The records of one partition: the arguments of :meth:`Log.append
    <pylog.storage.partition.log.Log.append>` (``key``, ``timestamp``, ``headers``: None, one
    value for every record, or one per record)."""

    value: Any
    key: Any = None
    timestamp: Any = None
    headers: Any = None


class NullKeys(Protocol):
    """Where records without a key (and without a given partition) go."""

    def assign(self, num_partitions: int, sizes: np.ndarray) -> np.ndarray:
        """The partitions of ``len(sizes)`` consecutive null-key records of ``sizes`` bytes."""
        ...


class RoundRobin:
    """The null-key records of one call share one partition; each call takes the next one."""

    def __init__(self) -> None:
        self.next = 0

    def assign(self, num_partitions: int, sizes: np.ndarray) -> np.ndarray:
        part = self.next % num_partitions
        self.next += 1
        return np.full(sizes.shape[0], part, dtype=np.int64)


class Sticky:
    """Kafka's sticky partitioner: consecutive null-key records fill the current partition up
    to ``switch_bytes`` (a record batch), then the next partition takes over.  The state
    (partition, bytes already in it) carries across calls (a task's Arrow batches)."""

    def __init__(self, start: int, switch_bytes: int) -> None:
        self.part = start
        self.used = 0
        self.switch_bytes = switch_bytes

    def assign(self, num_partitions: int, sizes: np.ndarray) -> np.ndarray:
        sizes = np.maximum(sizes, 0)  # a null value: no bytes
        starts = self.used + np.cumsum(sizes) - sizes  # bytes before each record, from the switch point
        chunk = starts // self.switch_bytes
        end = self.used + int(sizes.sum())
        first = self.part
        self.part = (first + end // self.switch_bytes) % num_partitions
        self.used = end % self.switch_bytes
        return np.asarray((first + chunk) % num_partitions, dtype=np.int64)


def assign_partitions(
    num_partitions: int,
    given: np.ndarray,
    key: pa.Array | pa.ChunkedArray | None,
    null_keys: NullKeys,
    sizes: np.ndarray | None = None,
) -> np.ndarray:
    """The partition of each record: ``given`` where it is >= 0 (checked by the caller), else
    the murmur2 partition of its key, else (null key) by ``null_keys``, which is told each
    null-key record's ``sizes`` (value bytes; None: zeros).  ``given`` is filled in place."""
    parts = given
    need = parts < 0
    if not need.any():
        return parts
    if key is not None:
        if need.all():
            parts[:] = partition_for_keys(key, num_partitions)
        else:
            keyed = partition_for_keys(key.filter(pa.array(need)), num_partitions)
            parts[need] = keyed
        need = parts < 0
    if need.any():
        null_sizes = np.zeros(int(need.sum()), np.int64) if sizes is None else sizes[need]
        parts[need] = null_keys.assign(num_partitions, null_sizes)
    return parts


class Router:
    """Splits appends into partitions; remembers where the last keyless records went."""

    def __init__(self) -> None:
        self.null_keys = RoundRobin()

    def route(
        self,
        topic: str,
        num_partitions: int,
        data: pa.Table | pa.RecordBatch | Any,
        *,
        key: Any = None,
        timestamp: Any = None,
        headers: Any = None,
        partition: int | None = None,
    ) -> dict[int, Rows]:
        """The records of ``data`` (a table with a ``value`` column and optionally ``key``,
        ``timestamp``, ``headers``, ``partition``, or the values themselves) per partition,
        in partition order; raises :class:`ConfigError` before anything is written."""
        data = _as_table_or_values(data)
        parts: np.ndarray | None = None
        if isinstance(data, pa.Table | Mapping):  # columns: each taken as its argument would be
            if isinstance(data, pa.Table):
                cols: Mapping[Any, Any] = {name: data.column(name) for name in data.column_names}
                what = "the table needs a 'value' column; it has"
            else:
                cols, what = data, "the columns need a 'value' column; they are"
            if "value" not in cols:
                raise ConfigError(f"{what} {sorted(map(str, cols))}")
            value = cols["value"]
            key = cols.get("key", key)
            timestamp = cols.get("timestamp", timestamp)
            headers = cols.get("headers", headers)
            if partition is None and "partition" in cols:
                parts = _partition_column(_chunked(cols["partition"]))
        else:
            value = data
        values = to_binary_array(value, "value")
        n_rows = len(values)
        if isinstance(key, str | bytes):  # one key for every record
            key = pa.repeat(pa.scalar(key, pa.binary()), n_rows)
        _check_length(key, "key", n_rows)
        _check_length(headers, "headers", n_rows)
        # checked before anything is written; negative ones refused, as by Kafka's producer
        timestamp = record_timestamps_ms(timestamp, n_rows)
        if partition is not None:
            parts = np.full(n_rows, _partition_number(partition), dtype=np.int64)
        elif parts is None:
            keys = None if key is None else to_binary_array(key, "key")
            parts = assign_partitions(num_partitions, np.full(n_rows, -1, np.int64), keys, self.null_keys)
        bad = (parts < 0) | (parts >= num_partitions)
        if bad.any():
            raise ConfigError(
                f"partition {int(parts[np.argmax(bad)])} is out of range for topic {topic!r} "
                f"(0..{num_partitions - 1})"
            )
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        take = pa.array(order)
        columns = {"value": values, "key": key, "timestamp": timestamp, "headers": headers}
        arrays = {k: _take(v, take, n_rows) for k, v in columns.items()}
        out: dict[int, Rows] = {}
        for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [n_rows]]), strict=True):
            if hi <= lo:
                continue
            sl = {
                k: (v if v is None or isinstance(v, int | np.integer) else v[int(lo) : int(hi)])
                for k, v in arrays.items()
            }
            out[int(sorted_parts[lo])] = Rows(**sl)
        return out


def _as_table_or_values(data: Any) -> pa.Table | Mapping[Any, Any] | Any:
    """``data`` as a table (a record batch), a mapping of columns (a dict, or a pandas
    DataFrame's columns as lists), or as it is (the values); a lone ``str``/``bytes`` is
    refused (iterated, it would be one record per character or byte)."""
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    pandas = sys.modules.get("pandas")  # (imported by whoever passes a DataFrame)
    # (no DataFrame while another thread is still importing pandas: pyarrow imports it lazily)
    frame = getattr(pandas, "DataFrame", None)
    if frame is not None and isinstance(data, frame):
        # (a datetime64 column as numpy's datetime64, UTC as Arrow's timestamps: its values as
        # Python objects would be naive Timestamps, refused as naive datetimes are)
        return {
            column: data[column].to_numpy() if data[column].dtype.kind == "M" else data[column].tolist()
            for column in data.columns
        }
    if isinstance(data, str | bytes | bytearray | memoryview):
        shown = data[:20] if isinstance(data, str | bytes) else bytes(data[:20])
        raise ConfigError(
            f"append takes records, not a single {type(data).__name__}: a table (or record batch, "
            "dict of columns, pandas DataFrame) with a 'value' column, or a list of values; "
            f"for one record, pass [{shown!r}]"
        )
    return data


def _partition_number(partition: Any) -> int:
    """The ``partition`` argument: an integer (not a float, string or bool, which Kafka's
    producer refuses too)."""
    if isinstance(partition, bool) or not isinstance(partition, int | np.integer):
        raise ConfigError(
            f"partition: expected an integer partition number, got {partition!r} ({type(partition).__name__})"
        )
    return int(partition)


def _chunked(col: Any) -> pa.ChunkedArray:
    """A ``partition`` column given as a Python sequence, as an Arrow one."""
    if isinstance(col, pa.ChunkedArray):
        return col
    try:
        return pa.chunked_array([col if isinstance(col, pa.Array) else pa.array(col)])
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise ConfigError(f"the 'partition' column must hold integer partition numbers: {e}") from e


def _partition_column(col: pa.ChunkedArray) -> np.ndarray:
    """A table's ``partition`` column: integers without nulls."""
    if not pa.types.is_integer(col.type):
        raise ConfigError(f"the 'partition' column must hold integer partition numbers, not {col.type}")
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise ConfigError(f"the 'partition' column is null in row {row}")
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


def _check_length(col: Any, name: str, n: int) -> None:
    """A per-record argument (``key``, ``headers``) has one value per record."""
    if col is None or isinstance(col, int | np.integer | str | bytes):
        return
    try:
        size = len(col)
    except TypeError:
        return  # not a sequence: refused by the encoder, naming it
    if size != n:
        raise ConfigError(f"{name}: has {size} values, expected {n} (one per record)")


def _take(col: Any, indices: pa.Array, n: int) -> Any:
    """``col`` (None, one value for every row, or a column of ``n`` rows) in the order ``indices``."""
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
