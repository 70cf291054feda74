"""Normalising what callers hand to the encoder: Arrow arrays (any binary/string flavour,
sliced or chunked), Python sequences, timestamps in several forms, and header lists, into the
flat numpy buffers the encoding kernels take (start offsets, data bytes, lengths with -1 for
null).  Vectorized: no per-record Python work for Arrow inputs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
"""Arrow type of one record header, as in Spark's Kafka source."""


def binary_parts(arr: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start offsets, data, lengths with -1 for null) of a binary-like column."""
    if arr is None:
        return np.zeros(n, np.int64), np.zeros(1, np.uint8), np.full(n, -1, np.int64)
    a = to_binary_array(arr, name)
    if len(a) != n:
        raise ValueError(f"column {name!r} has {len(a)} rows, expected {n}")
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


def timestamps_ms(timestamp: Any, n: int) -> np.ndarray:
    if timestamp is None:
        return np.full(n, int(time.time() * 1000), dtype=np.int64)
    if isinstance(timestamp, int | np.integer):
        return np.full(n, int(timestamp), dtype=np.int64)
    if isinstance(timestamp, pa.ChunkedArray):
        timestamp = timestamp.combine_chunks()
    if isinstance(timestamp, pa.Array):
        if pa.types.is_timestamp(timestamp.type):
            timestamp = timestamp.cast(pa.timestamp("ms")).cast(pa.int64())
        if timestamp.null_count:
            raise ValueError("timestamp column has nulls")
        timestamp = timestamp.to_numpy(zero_copy_only=False)
    ts = np.asarray(timestamp)
    if ts.dtype.kind == "M":
        ts = ts.astype("datetime64[ms]").astype(np.int64)
    ts = ts.astype(np.int64, copy=False)
    if ts.shape != (n,):
        raise ValueError(f"timestamp has shape {ts.shape}, expected ({n},)")
    return np.ascontiguousarray(ts)


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
        headers = pa.array(
            [None if hs is None else [{"key": k, "value": v} for k, v in hs] for hs in headers],
            type=pa.list_(HEADER_TYPE),
        )
    if len(headers) != n:
        raise ValueError(f"column 'headers' has {len(headers)} rows, expected {n}")
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
        raise ValueError("header keys must not be null")
    k_start, k_data, k_len = binary_parts(hkeys, m, "headers.key")
    v_start, v_data, v_len = binary_parts(child.field("value"), m, "headers.value")
    k_off = np.concatenate([k_start, [k_start[-1] + k_len[-1]]]) if m else np.zeros(1, np.int64)
    return list_offsets, k_off, k_data, v_start, v_data, v_len


def varint_sizes(v: np.ndarray) -> np.ndarray:
    """Bytes of the zigzag varint encoding of each int64 in ``v`` (vectorized)."""
    u = ((v.astype(np.int64) << 1) ^ (v.astype(np.int64) >> 63)).view(np.uint64)
    size = np.ones(u.shape, np.int64)
    for bits in range(7, 64, 7):
        size += u >= (np.uint64(1) << np.uint64(bits))
    return size
