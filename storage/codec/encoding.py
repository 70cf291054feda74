"""Encoding records into RecordBatch v2 batches: Arrow columns (or Python values) -> bytes.

:func:`encode` takes the columns of one run of records; :class:`EncodeInput` parses columns
once so that :func:`encode_partitioned` encodes the rows of every partition at once, in one
pass over the input (a sink task's Arrow batch, whose rows go to many partitions).  Each
record's bytes are copied once, from the input into its batch.  The per-record loops are the kernels of
``_kernels_src``/``_kernels_part_src``; one Python step per *batch* remains (CRC, compression).

Byte layouts: batch header in :mod:`batch`, record layout in :mod:`_kernels_src`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pylog.storage.codec import _kernels, compression
from pylog.storage.codec import _kernels_src as K
from pylog.storage.codec.batch import (
    CONTROL_MASK,
    FIELD,
    HEADER_SIZE,
    TRANSACTIONAL_MASK,
    BatchHeaders,
    parse_headers,
    write_crcs,
)
from pylog.storage.codec.columns import binary_parts, header_parts, pool_buffer, timestamps_ms, varint_sizes
from pylog.storage.codec.columns import to_binary_array as _to_arrow
from pylog.storage.errors import ConfigError

DEFAULT_BATCH_BYTES = 1 << 20
"""Default target size of an encoded batch (uncompressed bytes)."""
MIN_RECORD_BYTES = 7  # length varint + attributes + 5 one-byte varints


@dataclass
class EncodedBatches:
    """Encoded v2 batches laid end to end in ``buffer``, with their headers."""

    buffer: np.ndarray  # uint8
    batches: BatchHeaders  # positions relative to the start of ``buffer``

    def tobytes(self) -> bytes:
        return self.buffer.tobytes()

    def __len__(self) -> int:
        return int(self.buffer.shape[0])


@dataclass(frozen=True)
class EncodeInput:
    """The per-record columns of :func:`encode`, parsed once: :func:`encode_partitioned`
    encodes each partition's rows without copying their bytes first (a sink task encodes the
    rows of one Arrow batch straight from it)."""

    n: int
    v_start: np.ndarray
    v_data: np.ndarray
    v_len: np.ndarray
    k_start: np.ndarray
    k_data: np.ndarray
    k_len: np.ndarray
    ts: np.ndarray
    h_list: np.ndarray
    hk_off: np.ndarray
    hk_data: np.ndarray
    hv_start: np.ndarray
    hv_data: np.ndarray
    hv_len: np.ndarray
    h_cnt: np.ndarray
    h_size: np.ndarray

    @classmethod
    def of(cls, value: Any, key: Any = None, timestamp: Any = None, headers: Any = None) -> EncodeInput:
        """The records of :func:`encode`'s arguments, checked (a clear error naming the column)."""
        values = _to_arrow(value, "value")
        n = len(values)
        v_start, v_data, v_len = binary_parts(values, n, "value")
        k_start, k_data, k_len = binary_parts(key, n, "key")
        ts = timestamps_ms(timestamp, n)
        h_list, hk_off, hk_data, hv_start, hv_data, hv_len = header_parts(headers, n)
        if hk_off.shape[0] > 1:
            hk_len = np.diff(hk_off)
            entry = varint_sizes(hk_len) + hk_len + varint_sizes(hv_len) + np.maximum(hv_len, 0)
            csum = np.concatenate([[0], np.cumsum(entry)])
            h_size = csum[h_list[1:]] - csum[h_list[:-1]]
        else:
            h_size = np.zeros(n, np.int64)
        return cls(
            n, v_start, v_data, v_len, k_start, k_data, k_len, ts,
            h_list, hk_off, hk_data, hv_start, hv_data, hv_len, np.diff(h_list), h_size,
        )  # fmt: skip

    def with_timestamps(self, timestamp: Any) -> EncodeInput:
        """The same records with other timestamps (one for all, or one per record)."""
        return replace(self, ts=timestamps_ms(timestamp, self.n))


def encode(
    value: Any,
    key: Any = None,
    timestamp: Any = None,
    headers: Any = None,
    *,
    base_offset: int = 0,
    codec: int | str = compression.NONE,
    level: int | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_records: int = K.INT32_MAX,
    timestamp_type: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
) -> EncodedBatches:
    """Encode records into RecordBatch v2 batches with consecutive offsets from ``base_offset``.

    ``value`` (and ``key``) are Arrow binary/string arrays or sequences of bytes/None;
    ``timestamp`` is milliseconds (array, scalar, Arrow timestamps) or None for now;
    ``headers`` is an Arrow ``list<struct<key: string, value: binary>>`` or a sequence of
    ``[(key, value), ...]`` lists.  Records are grouped into batches of at most
    ``batch_bytes`` uncompressed bytes (a larger record gets its own batch) and at most
    ``max_records`` records, then compressed with ``codec``.
    """
    _check_encode_options(batch_bytes, max_records, timestamp_type)
    codec_id = compression.codec_id(codec)
    inp = EncodeInput.of(value, key, timestamp, headers)
    n = inp.n
    if n == 0:
        return EncodedBatches(
            np.zeros(0, np.uint8), parse_headers(np.zeros(0, np.uint8), *(np.zeros(0, np.int64),) * 3)
        )
    kern = _kernels.active(n)
    first = np.empty(n, np.int64)
    nbytes = np.empty(n, np.int64)
    body = np.empty(n, np.int64)
    nb = kern.plan_batches(
        inp.k_len,
        inp.v_len,
        inp.h_cnt,
        inp.h_size,
        inp.ts,
        batch_bytes,
        max_records,
        first,
        nbytes,
        body,
    )
    first, nbytes = first[:nb], nbytes[:nb]
    if (nbytes - K.LOG_OVERHEAD > K.INT32_MAX).any():
        raise ValueError("a single record is larger than a batch can hold (2 GiB)")
    attributes = (
        (timestamp_type << 3)
        | (TRANSACTIONAL_MASK if is_transactional else 0)
        | (CONTROL_MASK if is_control else 0)
    )
    _, out = pool_buffer(int(nbytes.sum()))
    pos = np.empty(nb, np.int64)
    kern.write_batches(
        out,
        first,
        nbytes,
        body,
        inp.k_start,
        inp.k_data,
        inp.k_len,
        inp.v_start,
        inp.v_data,
        inp.v_len,
        inp.ts,
        inp.h_list,
        inp.hk_off,
        inp.hk_data,
        inp.hv_start,
        inp.hv_data,
        inp.hv_len,
        base_offset,
        attributes,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        pos,
    )
    if codec_id != compression.NONE:
        out, pos, nbytes = compress_batches(out, pos, nbytes, np.full(nb, codec_id), level)
    write_crcs(out, pos, nbytes)
    return EncodedBatches(out, parse_headers(out, pos, nbytes, np.full(nb, 2, np.int64)))


def _check_encode_options(batch_bytes: int, max_records: int, timestamp_type: int) -> None:
    """Refuse bad options before any input is parsed."""
    if batch_bytes < HEADER_SIZE + MIN_RECORD_BYTES:
        raise ConfigError(f"batch_bytes must be at least {HEADER_SIZE + MIN_RECORD_BYTES}, got {batch_bytes}")
    if not 1 <= max_records <= K.INT32_MAX:
        raise ConfigError(f"max_records must be in [1, {K.INT32_MAX}], got {max_records}")
    if timestamp_type not in (0, 1):
        raise ConfigError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")


def encode_partitioned(
    inp: EncodeInput,
    parts: np.ndarray,
    base_offsets: np.ndarray,
    *,
    codec: int | str = compression.NONE,
    level: int | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_records: int = K.INT32_MAX,
    timestamp_type: int = 0,
) -> dict[int, EncodedBatches]:
    """Each partition's rows of ``inp`` as the batches :func:`encode` makes of them (same
    bytes), in one pass over the rows: row ``r`` goes to partition ``parts[r]`` (< 0: to none),
    partition ``p``'s records are numbered from ``base_offsets[p]``.  Returns the batches of
    every partition that got rows."""
    _check_encode_options(batch_bytes, max_records, timestamp_type)
    codec_id = compression.codec_id(codec)
    parts = np.asarray(parts, dtype=np.int64)
    nparts = int(base_offsets.shape[0])
    if parts.shape[0] != inp.n or (parts.shape[0] and int(parts.max()) >= nparts):
        raise IndexError(f"parts must give each of the {inp.n} rows a partition below {nparts}")
    n = inp.n
    kern = _kernels.active(n)
    state = np.zeros((3, nparts), np.int64)
    state[0] = -1
    body, batch_of = np.empty(n, np.int64), np.empty(n, np.int64)
    b_part, b_bytes, b_count, b_base_ts, b_max_ts = (np.empty(n, np.int64) for _ in range(5))
    sizes = (inp.k_len, inp.v_len, inp.h_cnt, inp.h_size, inp.ts)
    nb = kern.plan_partitioned(
        *sizes,
        parts,
        batch_bytes,
        max_records,
        state,
        body,
        batch_of,
        b_part,
        b_bytes,
        b_count,
        b_base_ts,
        b_max_ts,
    )
    if nb == 0:
        return {}
    b_part, b_bytes, b_count = b_part[:nb], b_bytes[:nb], b_count[:nb]
    if (b_bytes - K.LOG_OVERHEAD > K.INT32_MAX).any():
        raise ValueError("a single record is larger than a batch can hold (2 GiB)")
    order = np.argsort(b_part, kind="stable")  # each partition's batches together, in their order
    sorted_bytes = b_bytes[order]
    b_pos = np.empty(nb, np.int64)
    b_pos[order] = np.cumsum(sorted_bytes) - sorted_bytes
    sorted_counts = b_count[order]
    before = np.cumsum(sorted_counts) - sorted_counts  # records of earlier batches, all partitions
    starts = np.flatnonzero(np.r_[True, np.diff(b_part[order]) != 0])
    first_of_part = np.repeat(starts, np.diff(np.r_[starts, nb]))  # sorted index of its partition's first
    b_base = np.empty(nb, np.int64)
    b_base[order] = base_offsets[b_part[order]] + before - before[first_of_part]
    _, out = pool_buffer(int(b_bytes.sum()))
    attributes = timestamp_type << 3
    kern.write_partitioned(
        out, b_pos, b_bytes, b_count, b_base, b_base_ts[:nb], b_max_ts[:nb], batch_of, body,
        inp.k_start, inp.k_data, inp.k_len, inp.v_start, inp.v_data, inp.v_len, inp.ts,
        inp.h_list, inp.hk_off, inp.hk_data, inp.hv_start, inp.hv_data, inp.hv_len,
        attributes, np.empty(nb, np.int64), np.empty(nb, np.int64),
    )  # fmt: skip
    result: dict[int, EncodedBatches] = {}
    for s, e in zip(starts.tolist(), np.r_[starts[1:], nb].tolist(), strict=True):
        lo = int(b_pos[order[s]])
        pos = b_pos[order[s:e]] - lo
        nbytes = b_bytes[order[s:e]]
        buf = out[lo : lo + int(nbytes.sum())]
        if codec_id != compression.NONE:
            buf, pos, nbytes = compress_batches(buf, pos, nbytes, np.full(e - s, codec_id), level)
        write_crcs(buf, pos, nbytes)
        result[int(b_part[order[s]])] = EncodedBatches(
            buf, parse_headers(buf, pos, nbytes, np.full(e - s, 2, np.int64))
        )
    return result


def compress_batches(
    out: np.ndarray, pos: np.ndarray, nbytes: np.ndarray, codec: np.ndarray, level: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batches ``out[pos[b]:pos[b]+nbytes[b]]`` laid end to end, the records section of each
    whose ``codec[b]`` is not 0 compressed with it (the header gets its codec bits and new
    batchLength; the CRC is written after).  Returns (buffer, positions, sizes)."""
    parts: list[bytes | memoryview] = []
    new_pos = np.empty_like(pos)
    new_size = np.empty_like(nbytes)
    total = 0
    mv = out.data
    length, attributes = FIELD["batch_length"], FIELD["attributes"]
    for b, (p, s, c) in enumerate(zip(pos.tolist(), nbytes.tolist(), codec.tolist(), strict=True)):
        if c == 0:
            parts.append(mv[p : p + s])
        else:
            packed = compression.compress(c, mv[p + HEADER_SIZE : p + s], level)
            header = bytearray(mv[p : p + HEADER_SIZE])
            length.pack_into(header, K.AT_LENGTH, HEADER_SIZE - K.LOG_OVERHEAD + len(packed))
            codec_bits = attributes.unpack_from(header, K.AT_ATTRIBUTES)[0] | c
            attributes.pack_into(header, K.AT_ATTRIBUTES, codec_bits)
            parts.append(bytes(header))
            parts.append(packed)
            s = HEADER_SIZE + len(packed)
        new_pos[b] = total
        new_size[b] = s
        total += s
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy(), new_pos, new_size


def control_batch(
    marker: int,
    *,
    offset: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    timestamp: int | None = None,
    partition_leader_epoch: int = -1,
) -> bytes:
    """An end-transaction marker batch (ABORT=0 / COMMIT=1) as Kafka writes it."""
    from pylog.storage.codec.batch import CONTROL_KEY, END_TXN_VALUE

    enc = encode(
        [END_TXN_VALUE.pack(0, coordinator_epoch)],
        [CONTROL_KEY.pack(0, marker)],
        timestamp,
        base_offset=offset,
        is_transactional=True,
        is_control=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )
    return enc.tobytes()
