"""Kafka's default partitioner: murmur2 over the serialized key bytes, vectorized with numpy.

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

Vectorization.  The per-block mixing of k is independent for every block, so the words of all
blocks of all keys are gathered and mixed in one numpy pass.  Only `h = h * m ^ k` is a chain
per key.  Keys are sorted by block count, longest first, so the keys that still have a block
at block index b are always a prefix of the sorted order; the block words are laid out block-
major in that order, so step b is two in-place ufuncs on contiguous slices: `h[:c] *= m` and
`h[:c] ^= K[s:s+c]`.  This is the length-bucket idea taken to its limit: a short key costs no
work at block indexes beyond its own length, whatever the longest key is, so there is no
masked waste.  What remains is the fixed numpy cost of one step per block index (~1 µs); when
only a handful of very long keys are left (at most _TAIL_KEYS), their remaining chains are
finished with Python ints (~0.1 µs per block), which bounds the cost of one huge outlier key.
The tail bytes (length % 4) are applied with masks, then the finalizer runs on all keys.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from pylog.storage.errors import ConfigError

__all__ = ["murmur2", "murmur2_one", "partition_for_keys"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF

_M_U32 = np.uint32(_M)
_MAX_PARTITIONS = 0x7FFFFFFF  # Java int

# One 4-byte block of a key (the hash reads keys in little-endian blocks).
_BLOCK = struct.Struct("<I")

# When at most this many keys still have blocks left, finish them with scalar Python ints:
# a numpy step costs about as much as ~10-20 scalar block steps.
_TAIL_KEYS = 8
# Keys are hashed in runs of about this many 4-byte blocks (4 MiB of key bytes), which bounds
# the block-position and block-word temporaries (~24 bytes per block) whatever the input size.
_CHUNK_BLOCKS = 1 << 20

KeysLike: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


def murmur2_one(key: bytes | bytearray | memoryview) -> int:
    """murmur2 of one key, as a signed int32 (Java ``Utils.murmur2``)."""
    data = bytes(key)
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    nblocks = length // 4
    for (k,) in _BLOCK.iter_unpack(data[: nblocks * 4]):
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = nblocks * 4
    extra = length - tail
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


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
    if null is not None:
        # Arrow allows a null slot to span bytes; it hashes as nothing.
        lengths[null] = 0
    hashes = _murmur2_core(data, starts, lengths)
    if null is not None:
        hashes[null] = 0
    return hashes, null


def _hash_fixed(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    n = len(arr)
    width = arr.type.byte_width
    if n == 0:
        return np.zeros(0, dtype=np.int32), None
    data = _data_array(arr.buffers()[1])
    starts = (np.arange(n, dtype=np.int64) + arr.offset) * width
    lengths = np.full(n, width, dtype=np.int64)
    null = _null_mask(arr)
    if null is not None:
        lengths[null] = 0
    hashes = _murmur2_core(data, starts, lengths)
    if null is not None:
        hashes[null] = 0
    return hashes, null


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
    h = (np.uint32(_SEED) ^ lengths.astype(np.uint32)).astype(np.uint32)
    nblocks = lengths >> 2
    cumulative = np.cumsum(nblocks)
    total_blocks = int(cumulative[-1]) if len(cumulative) else 0
    lo = 0
    while lo < len(nblocks) and total_blocks:
        # The run [lo, hi): keys up to _CHUNK_BLOCKS blocks past the run's start (at least one).
        before = int(cumulative[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(cumulative, before + _CHUNK_BLOCKS, side="right")), lo + 1)
        run_blocks = int(cumulative[hi - 1]) - before
        if run_blocks:
            _mix_blocks(h[lo:hi], data, starts[lo:hi], nblocks[lo:hi], run_blocks)  # in place
        lo = hi

    # Tail bytes, Java's switch with fallthrough: 3 → byte 2, 2 → byte 1, 1 → byte 0 then *= m.
    extra = lengths & 3
    tail = starts + (nblocks << 2)
    for nbytes, shift in ((3, 16), (2, 8)):
        idx = np.flatnonzero(extra >= nbytes)
        if len(idx):
            h[idx] ^= data[tail[idx] + (nbytes - 1)].astype(np.uint32) << np.uint32(shift)
    idx = np.flatnonzero(extra >= 1)
    if len(idx):
        h[idx] = (h[idx] ^ data[tail[idx]].astype(np.uint32)) * _M_U32

    h ^= h >> np.uint32(13)
    h *= _M_U32
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def _mix_blocks(h: np.ndarray, data: np.ndarray, starts: np.ndarray, nblocks: np.ndarray, total: int) -> None:
    """Run the 4-byte block loop of every key, updating h (uint32) in place."""
    # Longest keys first (stable, so equal lengths keep input order): the keys with a block at
    # index b are then the prefix order[:count[b]].
    order = np.argsort(-nblocks, kind="stable")
    nb_sorted = nblocks[order]
    max_blocks = int(nb_sorted[0])
    # count[b] = number of keys with more than b blocks.
    ascending = nb_sorted[::-1]
    count = len(nb_sorted) - np.searchsorted(ascending, np.arange(max_blocks), side="right")
    col_start = np.zeros(max_blocks + 1, dtype=np.int64)
    np.cumsum(count, out=col_start[1:])

    # Byte position of every (block b, sorted key j < count[b]) in block-major order.
    block_of = np.repeat(np.arange(max_blocks, dtype=np.int64), count)
    key_of = np.arange(total, dtype=np.int64) - np.repeat(col_start[:-1], count)
    pos = starts[order][key_of] + (block_of << 2)
    del block_of, key_of

    # Unaligned little-endian uint32 view at every byte position, then one gather and the
    # block mixing for all blocks at once.
    words = np.ndarray(shape=(len(data) - 3,), dtype="<u4", buffer=data, offset=0, strides=(1,))
    k = words[pos].astype(np.uint32)
    del pos
    k *= _M_U32
    k ^= k >> np.uint32(_R)
    k *= _M_U32

    hs = h[order]
    b = 0
    while b < max_blocks:
        c = int(count[b])
        if c <= _TAIL_KEYS and max_blocks - b > 2 * _TAIL_KEYS:
            _finish_scalar(hs, k, col_start, nb_sorted, b, c)
            break
        view = hs[:c]
        view *= _M_U32
        view ^= k[col_start[b] : col_start[b] + c]
        b += 1
    h[order] = hs


def _finish_scalar(
    hs: np.ndarray, k: np.ndarray, col_start: np.ndarray, nb_sorted: np.ndarray, b: int, c: int
) -> None:
    """Finish the block chains of the (few) keys 0..c-1 from block b on with Python ints."""
    for j in range(c):
        ks = k[col_start[b : int(nb_sorted[j])] + j].tolist()
        hv = int(hs[j])
        for kv in ks:
            hv = ((hv * _M) & _MASK32) ^ kv
        hs[j] = hv
