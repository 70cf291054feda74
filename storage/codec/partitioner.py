"""Kafka's default partitioner: murmur2 over the serialized key bytes, in one compiled pass.

What the hash reads of each key (Java `org.apache.kafka.common.utils.Utils.murmur2`):

    | key bytes            | read as                       | step                                 |
    |----------------------|-------------------------------|--------------------------------------|
    | (its length)         | int32                         | h = 0x9747b28c ^ length              |
    | [4i, 4i+4) for every | uint32 little-endian block k  | k *= m; k ^= k >>> 24; k *= m;       |
    |   whole block i      |                               | h *= m; h ^= k                       |
    | [4n, len) tail,      | tail[2] << 16, tail[1] << 8,  | h ^= each present byte (switch with  |
    |   len % 4 bytes      | tail[0]                       | fallthrough); h *= m if any          |
    | (end)                |                               | h ^= h >>> 13; h *= m; h ^= h >>> 15 |

m = 0x5bd1e995; all arithmetic is 32-bit with wraparound; the result is read as a signed int32
like Java's. partition = (h & 0x7fffffff) % numPartitions (`BuiltInPartitioner.partitionForKey`).

The hash is the ``murmur2_keys`` kernel (:mod:`_kernels`, numba-compiled): one pass over the
keys' bytes straight from the Arrow buffers, about 10 ns per 16-byte key (the block chain of a
key is sequential, so a numpy formulation needs a step per block index and costs ~15x more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from pylog.storage.codec import _kernels
from pylog.storage.errors import ConfigError

__all__ = ["murmur2", "murmur2_one", "partition_for_keys"]


_MAX_PARTITIONS = 0x7FFFFFFF  # Java int

KeysLike: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


def murmur2_one(key: bytes | bytearray | memoryview) -> int:
    """murmur2 of one key, as a signed int32 (Java ``Utils.murmur2``)."""
    data = np.frombuffer(bytes(key), dtype=np.uint8)
    return int(_murmur2_core(data, np.zeros(1, np.int64), np.array([len(data)], np.int64))[0])


def murmur2(keys: KeysLike) -> np.ndarray:
    """murmur2 of every key as int32 (signed, like Java). A null key hashes to 0."""
    h, _ = _hash_with_nulls(keys)
    return h


def partition_for_keys(keys: KeysLike, num_partitions: int) -> np.ndarray:
    """Kafka's default partition of every key: ``(murmur2 & 0x7fffffff) % num_partitions``.

    Returns int32; a null key gets -1 (the caller assigns it sticky / round robin, as Kafka does
    for records without a key).
    """
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise ConfigError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
    if not 1 <= num_partitions <= _MAX_PARTITIONS:
        raise ConfigError(f"num_partitions must be in [1, {_MAX_PARTITIONS}], got {num_partitions}")
    h, null = _hash_with_nulls(keys)
    positive = h.view(np.uint32) & np.uint32(0x7FFFFFFF)
    parts = (positive % np.uint32(num_partitions)).astype(np.int32)
    if null is not None:
        parts[null] = -1
    return parts


# --------------------------------------------------------------------------------------------
# input normalization


def _hash_with_nulls(keys: KeysLike) -> tuple[np.ndarray, np.ndarray | None]:
    """(int32 hashes, boolean null mask or None when there are no nulls)."""
    if isinstance(keys, pa.ChunkedArray):
        parts = [_hash_with_nulls(chunk) for chunk in keys.chunks]
        if not parts:
            return np.zeros(0, dtype=np.int32), None
        hashes = np.concatenate([p[0] for p in parts])
        if all(p[1] is None for p in parts):
            return hashes, None
        masks = [np.zeros(len(p[0]), bool) if p[1] is None else p[1] for p in parts]
        return hashes, np.concatenate(masks)
    if isinstance(keys, pa.Array):
        return _hash_arrow(keys)
    if isinstance(keys, bytes | bytearray | memoryview | str):
        raise TypeError("keys must be a sequence of keys; use murmur2_one() for a single key")
    # One conversion of the whole sequence (in C); bytes, bytearray, memoryview and None are
    # accepted; str keys are encoded as UTF-8 (what Kafka's StringSerializer does).
    arr = pa.array(keys if isinstance(keys, list | tuple) else list(keys), type=pa.large_binary())
    return _hash_arrow(arr)


def _hash_arrow(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    t = arr.type
    if pa.types.is_dictionary(t):
        # Hash each distinct key once, then gather.
        dict_hash, dict_null = _hash_arrow(arr.dictionary)
        idx_arr = arr.indices
        null = _null_mask(idx_arr)
        idx = idx_arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.intp)
        hashes = dict_hash[idx] if len(dict_hash) else np.zeros(len(arr), np.int32)
        if dict_null is not None and len(dict_hash):
            via_dict = dict_null[idx]
            null = via_dict if null is None else (null | via_dict)
        if null is not None:
            hashes = hashes.copy()
            hashes[null] = 0
        return hashes, null
    if pa.types.is_binary(t) or pa.types.is_string(t):
        off_dtype: type[np.integer[Any]] = np.int32
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        off_dtype = np.int64
    elif pa.types.is_fixed_size_binary(t):
        return _hash_fixed(arr)
    elif pa.types.is_null(t):
        return np.zeros(len(arr), np.int32), np.ones(len(arr), dtype=bool)
    elif pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        return _hash_arrow(arr.cast(pa.large_binary()))
    else:
        raise TypeError(f"keys must be a binary or string array, got {t}")

    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int32), None
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[arr.offset : arr.offset + n + 1]
    data = _data_array(bufs[2])
    null = _null_mask(arr)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    return _hash_spans(data, starts, lengths, null), null


def _hash_fixed(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    n = len(arr)
    width = arr.type.byte_width
    if n == 0:
        return np.zeros(0, dtype=np.int32), None
    data = _data_array(arr.buffers()[1])
    starts = (np.arange(n, dtype=np.int64) + arr.offset) * width
    lengths = np.full(n, width, dtype=np.int64)
    null = _null_mask(arr)
    return _hash_spans(data, starts, lengths, null), null


def _hash_spans(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, null: np.ndarray | None
) -> np.ndarray:
    """murmur2 of each span ``data[starts[i]:starts[i] + lengths[i]]``; 0 for the ``null`` ones
    (Arrow allows a null slot to span bytes: it hashes as nothing).  ``lengths`` is modified."""
    if null is not None:
        lengths[null] = 0
    hashes = _murmur2_core(data, starts, lengths)
    if null is not None:
        hashes[null] = 0
    return hashes


def _data_array(buf: pa.Buffer | None) -> np.ndarray:
    if buf is None or buf.size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _null_mask(arr: pa.Array) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    return arr.is_null().to_numpy(zero_copy_only=False)


# --------------------------------------------------------------------------------------------
# the vectorized hash


def _murmur2_core(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """murmur2 (int32) of the keys data[starts[i] : starts[i] + lengths[i]]."""
    if len(starts) and int((starts + lengths).max()) > len(data):
        raise ValueError("key bytes beyond the data buffer")  # the kernel reads unchecked
    out = np.empty(len(starts), dtype=np.int64)
    _kernels.active(len(starts)).murmur2_keys(data, starts, lengths, out)
    return out.astype(np.uint32).view(np.int32)
