"""Which partition each appended record goes to, as Kafka's producer chooses.

A record goes to the partition given for the whole call, else to its ``partition`` column, else
to Kafka's murmur2 partition of its key (:mod:`pylog.storage.codec.partitioner`); records
without a key share one partition chosen round robin per call.  The rows are then grouped by
partition (stably: each partition gets its records in their order) without a Python object
per row.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


class Router:
    """Splits appends into partitions; remembers where the last keyless records went."""

    def __init__(self) -> None:
        self.round_robin = 0

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
            parts = (
                np.full(n_rows, -1, np.int64)
                if key is None
                else partition_for_keys(to_binary_array(key, "key"), num_partitions).astype(np.int64)
            )
            nulls = parts < 0
            if nulls.any():
                parts[nulls] = self.round_robin % num_partitions
                self.round_robin += 1
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
