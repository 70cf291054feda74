"""Normalising what callers hand to the encoder: Arrow arrays (any binary/string flavour,
sliced or chunked), Python sequences, timestamps in several forms, and header lists, into the
flat numpy buffers the encoding kernels take (start offsets, data bytes, lengths with -1 for
null).  Vectorized: no per-record Python work for Arrow inputs.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pylog.storage.errors import ConfigError

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
"""Arrow type of one record header, as in Spark's Kafka source."""


def binary_parts(arr: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start offsets, data, lengths with -1 for null) of a binary-like column."""
    if arr is None:
        return np.zeros(n, np.int64), np.zeros(1, np.uint8), np.full(n, -1, np.int64)
    a = to_binary_array(arr, name)
    if len(a) != n:
        raise ConfigError(f"{name}: has {len(a)} values, expected {n} (one per record)")
    if pa.types.is_large_binary(a.type) or pa.types.is_large_string(a.type):
        off_dtype: Any = np.int64
    elif pa.types.is_binary(a.type) or pa.types.is_string(a.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"column {name!r} must be binary or string, not {a.type}")
    bufs = a.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[a.offset : a.offset + n + 1].astype(np.int64)
    data = (
        np.frombuffer(bufs[2], dtype=np.uint8)
        if bufs[2] is not None and bufs[2].size
        else np.zeros(1, np.uint8)
    )
    lengths = np.diff(offsets)
    if a.null_count:
        lengths = np.where(a.is_null().to_numpy(zero_copy_only=False), -1, lengths)
    return offsets[:-1], data, lengths


def to_binary_array(arr: Any, name: str) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.Array):
        return arr
    try:
        return pa.array(arr, type=pa.binary())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise TypeError(f"column {name!r} must be bytes-like values or None: {e}") from e


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TIMESTAMP_RANGE = f"epoch milliseconds in [{INT64_MIN}, {INT64_MAX}] (a 64-bit integer)"
"""What a record timestamp may be (in the byte format), for error messages."""

RECORD_TIMESTAMP_RANGE = f"epoch milliseconds in [0, {INT64_MAX}]"
"""What the timestamp of a record appended by a caller may be, for error messages."""

NAIVE_DATETIME = "a datetime without tzinfo; give tzinfo=timezone.utc (or the zone it is in) or epoch ms"
"""Why a naive ``datetime`` is refused: the zone it means is unknown (local time? UTC?)."""


def timestamps_ms(
    timestamp: Any, n: int, *, expected: str = TIMESTAMP_RANGE, now_ms: int | None = None
) -> np.ndarray:
    """``timestamp`` (None: now; one value for every record; or one per record: integers,
    integral floats, datetimes with a time zone, Arrow timestamps) as ``n`` int64 epoch
    milliseconds.  Raises :class:`ConfigError` naming the argument (and the first bad row)
    otherwise, saying that a timestamp is ``expected``.

    ``now_ms`` given (the Spark sink: a column of Spark's microsecond timestamps or longs): it
    is the time of records without one (None, or a null in an Arrow column), and Arrow
    timestamps are truncated to milliseconds as Spark's Kafka sink does."""
    if timestamp is None:
        return np.full(n, int(time.time() * 1000) if now_ms is None else now_ms, dtype=np.int64)
    if isinstance(timestamp, datetime.datetime | np.datetime64 | int | float | np.number) and not isinstance(
        timestamp, bool
    ):
        return np.full(n, _scalar_ms(timestamp, expected), dtype=np.int64)
    if isinstance(timestamp, str | bytes | bool | dict):
        raise ConfigError(f"timestamp: expected {expected} or a list of them, got {timestamp!r}")
    if isinstance(timestamp, pa.ChunkedArray):
        timestamp = timestamp.combine_chunks()
    if isinstance(timestamp, pa.Array):
        if now_ms is not None:  # nulls: now; sub-millisecond parts truncated
            if pa.types.is_timestamp(timestamp.type):
                ms = pa.timestamp("ms", tz=timestamp.type.tz)
                timestamp = timestamp.cast(ms, safe=False).cast(pa.int64())
            timestamp = pc.fill_null(timestamp.cast(pa.int64()), now_ms)
        elif pa.types.is_timestamp(timestamp.type) or pa.types.is_date(timestamp.type):
            timestamp = timestamp.cast(pa.timestamp("ms")).cast(pa.int64())
        if timestamp.null_count:
            row = int(np.argmax(timestamp.is_null().to_numpy(zero_copy_only=False)))
            raise ConfigError(f"timestamp: row {row} is null")
        timestamp = timestamp.to_numpy(zero_copy_only=False)
    try:
        ts = np.asarray(timestamp)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"timestamp: not a list of {expected}: {e}") from None
    if ts.ndim != 1 or ts.shape[0] != n:
        got = ts.shape[0] if ts.ndim else "one"
        raise ConfigError(f"timestamp: has {got} values, expected {n} (one per record)")
    if ts.dtype.kind == "M":
        ts = ts.astype("datetime64[ms]").astype(np.int64)
    elif ts.dtype.kind == "f":
        bad = ~np.isfinite(ts) | (ts != np.floor(ts)) | (ts < INT64_MIN) | (ts >= 2.0**63)
        if bad.any():
            row = int(np.argmax(bad))
            raise ConfigError(f"timestamp: row {row} is {float(ts[row])!r}; expected {expected}")
    elif ts.dtype.kind == "O":
        try:
            return np.fromiter((_scalar_ms(v, expected) for v in ts), np.int64, n)
        except ConfigError as e:
            raise ConfigError(f"{e} (timestamp list)") from None
    elif ts.dtype.kind == "u" and ts.size and ts.max() > INT64_MAX:
        row = int(np.argmax(ts > INT64_MAX))
        raise ConfigError(f"timestamp: row {row} is {int(ts[row])}, out of range: expected {expected}")
    elif ts.dtype.kind not in "iu":
        first = ts[0].item() if ts.size else None
        raise ConfigError(f"timestamp: expected {expected}, got {first!r} (row 0, {ts.dtype})")
    ts = ts.astype(np.int64, copy=False)
    return np.ascontiguousarray(ts)


def record_timestamps_ms(timestamp: Any, n: int) -> np.ndarray | None:
    """:func:`timestamps_ms` of the timestamps a caller gives its records (None: the time of the
    append), refusing negative ones as Kafka's producer does (``ProducerRecord``: "Timestamp should
    always be non-negative or null"; -1 means "no timestamp" only in message formats v0/v1, which
    the encoder still writes when it re-encodes such records)."""
    if timestamp is None:
        return None
    ts = timestamps_ms(timestamp, n, expected=RECORD_TIMESTAMP_RANGE)
    bad = ts < 0
    if bad.any():
        row = int(np.argmax(bad))
        what = f"{int(ts[row])} is" if _is_scalar(timestamp) else f"row {row} is {int(ts[row])},"
        raise ConfigError(
            f"timestamp: {what} before 1970-01-01: a record timestamp is {RECORD_TIMESTAMP_RANGE} "
            "(Kafka's producer refuses negative timestamps)"
        )
    return ts


def _is_scalar(v: Any) -> bool:
    return isinstance(v, datetime.datetime | np.datetime64 | int | float | np.number)


def _scalar_ms(v: Any, expected: str = TIMESTAMP_RANGE) -> int:
    """One timestamp as epoch milliseconds (a naive datetime is refused: which zone it is in is
    unknown)."""
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None or v.utcoffset() is None:
            raise ConfigError(f"timestamp: {v!r} is {NAIVE_DATETIME}")
        return round(v.timestamp() * 1000)
    if isinstance(v, np.datetime64):
        return int(v.astype("datetime64[ms]").astype(np.int64))
    if isinstance(v, bool) or not isinstance(v, int | float | np.number):
        raise ConfigError(f"timestamp: expected {expected}, got {v!r} ({type(v).__name__})")
    if isinstance(v, float | np.floating) and not (np.isfinite(v) and v == int(v)):
        raise ConfigError(f"timestamp: {v!r} is not {expected}")
    out = int(v)
    if not INT64_MIN <= out <= INT64_MAX:
        raise ConfigError(f"timestamp: {v!r} is out of range: expected {expected}")
    return out


def header_parts(headers: Any, n: int) -> tuple[np.ndarray, ...]:
    """list offsets (n+1), key offsets (m+1), key data, value offsets, value data, value lengths."""
    empty8 = np.zeros(1, np.uint8)
    if headers is None:
        return (
            np.zeros(n + 1, np.int64),
            np.zeros(1, np.int64),
            empty8,
            np.zeros(0, np.int64),
            empty8,
            np.zeros(0, np.int64),
        )
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if not isinstance(headers, pa.Array):
        headers = _python_headers(headers)
    elif not _is_header_type(headers.type):
        raise ConfigError(
            f"headers: expected one list of (str key, bytes value) pairs per record (Arrow type "
            f"{pa.list_(HEADER_TYPE)}), got a column of {headers.type}"
        )
    if len(headers) != n:
        raise ConfigError(f"headers: has {len(headers)} values, expected {n} (one per record)")
    list_offsets = headers.offsets.to_numpy().astype(np.int64)
    if headers.null_count:  # a null list may still span child rows; make it empty
        nulls = headers.is_null().to_numpy(zero_copy_only=False)
        counts = np.where(nulls, 0, np.diff(list_offsets))
        keep = np.repeat(~nulls, np.diff(list_offsets))
        child = headers.values.slice(int(list_offsets[0]), int(list_offsets[-1] - list_offsets[0]))
        child = child.filter(pa.array(keep))
        list_offsets = np.concatenate([[0], np.cumsum(counts)])
    else:
        child = headers.values.slice(int(list_offsets[0]), int(list_offsets[-1] - list_offsets[0]))
        list_offsets = list_offsets - list_offsets[0]
    m = int(list_offsets[-1])
    hkeys = child.field("key")
    if hkeys.null_count:
        raise ConfigError("headers: header keys must not be null")
    k_start, k_data, k_len = binary_parts(hkeys, m, "headers.key")
    v_start, v_data, v_len = binary_parts(child.field("value"), m, "headers.value")
    k_off = np.concatenate([k_start, [k_start[-1] + k_len[-1]]]) if m else np.zeros(1, np.int64)
    return list_offsets, k_off, k_data, v_start, v_data, v_len


def _is_header_type(t: pa.DataType) -> bool:
    """Whether ``t`` is a list of ``struct<key: string, value: binary>`` (any list, string and
    binary flavour), the Arrow type of a ``headers`` column."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    st = t.value_type
    names = {st.field(i).name: st.field(i).type for i in range(st.num_fields)}
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    return set(names) == {"key", "value"} and all(any(f(names[k]) for f in text) for k in names)


def _python_headers(headers: Any) -> pa.Array:
    """Python header lists (per record: None or a list of (str key, bytes/str/None value)
    pairs) as an Arrow list array; raises :class:`ConfigError` naming the first bad record."""
    if isinstance(headers, str | bytes | dict) or not hasattr(headers, "__iter__"):
        raise ConfigError(f"headers: expected one list of (key, value) pairs per record, got {headers!r}")
    headers = list(headers)
    for row, hs in enumerate(headers):
        if hs is None:
            continue
        if isinstance(hs, str | bytes | dict) or not hasattr(hs, "__iter__"):
            raise ConfigError(f"headers: record {row}: expected a list of (key, value) pairs, got {hs!r}")
        for pair in hs:
            if (
                isinstance(pair, str | bytes)
                or not isinstance(pair, tuple | list)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not (pair[1] is None or isinstance(pair[1], bytes | bytearray | memoryview | str))
            ):
                raise ConfigError(
                    f"headers: record {row}: expected (str key, bytes/str/None value) pairs, got {pair!r}"
                )
    return pa.array(
        [None if hs is None else [{"key": k, "value": v} for k, v in hs] for hs in headers],
        type=pa.list_(HEADER_TYPE),
    )


def varint_sizes(v: np.ndarray) -> np.ndarray:
    """Bytes of the zigzag varint encoding of each int64 in ``v`` (vectorized)."""
    u = ((v.astype(np.int64) << 1) ^ (v.astype(np.int64) >> 63)).view(np.uint64)
    size = np.ones(u.shape, np.int64)
    for bits in range(7, 64, 7):
        size += u >= (np.uint64(1) << np.uint64(bits))
    return size


def pool_buffer(nbytes: int) -> tuple[pa.Buffer, np.ndarray]:
    """A writable buffer from Arrow's memory pool (which reuses pages: fresh mmaps of large
    outputs cost more in page faults than the decoding itself) and a numpy view of it."""
    buf = pa.allocate_buffer(max(nbytes, 1))
    return buf, np.frombuffer(buf, dtype=np.uint8)[:nbytes]


def pool_empty(n: int, dtype: Any = np.int64) -> np.ndarray:
    """``np.empty`` from Arrow's memory pool (see :func:`pool_buffer`)."""
    itemsize = np.dtype(dtype).itemsize
    return pool_buffer(n * itemsize)[1].view(dtype)
