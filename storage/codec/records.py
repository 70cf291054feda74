"""Columnar RecordBatch codec: many batches <-> one Arrow table of records.

Decoding walks a buffer of log entries (v2 batches, and legacy magic 0/1 messages through
:mod:`legacy`), verifies CRCs, decompresses, and returns the records as a ``pyarrow.Table``
with Spark's Kafka columns (offset, timestamp, timestampType, key, value, headers) plus the
batch-level facts callers need (``BatchHeaders``).  Encoding turns Arrow arrays into v2
batches of a chosen size and codec.  The per-record work runs in the kernels of
``_kernels_src`` (compiled by numba); everything else is vectorized numpy, with one Python
step per *batch* (CRC, compression).

Byte layouts: batch header in :mod:`batch`, record layout in :mod:`_kernels_src`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa

from pylog.storage.codec import _kernels, compression
from pylog.storage.codec import _kernels_src as K
from pylog.storage.codec.batch import (
    CONTROL_MASK,
    HEADER,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    TRANSACTIONAL_MASK,
    BatchHeaders,
    as_uint8,
    parse_headers,
    scan_entries,
    verify_crcs,
)
from pylog.storage.codec.columns import HEADER_TYPE, binary_parts, header_parts, timestamps_ms, varint_sizes
from pylog.storage.codec.columns import to_binary_array as _to_arrow
from pylog.storage.errors import ConfigError, CorruptRecordError

DEFAULT_BATCH_BYTES = 1 << 20
"""Default target size of an encoded batch (uncompressed bytes)."""
MAX_DECOMPRESSED_BATCH = 1 << 30
"""Upper bound on one batch's decompressed records section (a defence, not a format limit)."""
MIN_RECORD_BYTES = 7  # length varint + attributes + 5 one-byte varints
HEADER_LENGTH = struct.Struct(">i")  # batchLength, rewritten after compression

RECORD_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(HEADER_TYPE), nullable=False),
    ]
)
"""Columns of a decoded record set; ``timestamp`` is milliseconds since the epoch."""

_MESSAGES = {
    K.E_TRUNCATED: "a field runs past the end of its record",
    K.E_VARINT_TOO_LONG: "varint longer than allowed (5 bytes, or 10 for a varlong)",
    K.E_RECORD_LENGTH: "record length is negative, too small, or beyond the end of the batch",
    K.E_KEY_LENGTH: "key length is below -1 or beyond the end of the record",
    K.E_VALUE_LENGTH: "value length is below -1 or beyond the end of the record",
    K.E_HEADER_COUNT: "header count is negative or cannot fit in the record",
    K.E_HEADER_KEY_LENGTH: "header key length is negative or beyond the end of the record",
    K.E_HEADER_VALUE_LENGTH: "header value length is below -1 or beyond the end of the record",
    K.E_RECORD_SIZE_MISMATCH: "record length does not match the fields it contains",
    K.E_TRAILING_BYTES: "incorrect declared batch size, records still remaining",
}


@dataclass
class RecordSet:
    """Decoded records (``records``, in file order) and the entries they came from."""

    records: pa.Table
    batch_index: np.ndarray  # int64, for each record the row of ``batches`` holding it
    batches: BatchHeaders
    end: int  # position after the last complete entry (relative to the buffer)
    torn_bytes: int  # incomplete bytes after ``end`` (only with allow_torn_tail)

    def __len__(self) -> int:
        return self.records.num_rows

    def data_records(self) -> pa.Table:
        """The records without control records (transaction markers)."""
        if not self.batches.is_control.any():
            return self.records
        keep = ~self.batches.is_control[self.batch_index]
        return self.records.filter(pa.array(keep))


@dataclass
class EncodedBatches:
    """Encoded v2 batches laid end to end in ``buffer``, with their headers."""

    buffer: np.ndarray  # uint8
    batches: BatchHeaders  # positions relative to the start of ``buffer``

    def tobytes(self) -> bytes:
        return self.buffer.tobytes()

    def __len__(self) -> int:
        return int(self.buffer.shape[0])


# ============================================================================ decoding


def decode(
    buf: bytes | bytearray | memoryview | np.ndarray,
    *,
    verify_crc: bool = True,
    path: str | None = None,
    base_position: int = 0,
    allow_torn_tail: bool = False,
    start: int = 0,
    end: int | None = None,
) -> RecordSet:
    """Decode every log entry in ``buf[start:end]`` into a :class:`RecordSet`.

    ``base_position`` is the file position of ``buf[0]``: errors and ``batches.position``
    are reported as file positions.  Corrupt input raises :class:`CorruptRecordError`
    naming ``path`` and the byte position of the bad entry.
    """
    data = as_uint8(buf)
    scan = scan_entries(
        data, start=start, end=end, path=path, base_position=base_position, allow_torn_tail=allow_torn_tail
    )
    headers = parse_headers(data, scan.position, scan.size, scan.magic)
    v2 = headers.magic >= 2
    if v2.any():
        _check_v2_headers(data, headers, v2, verify_crc, path, base_position)
    legacy_rows: list[Any] = []
    if not v2.all():
        legacy_rows = _decode_legacy(data, headers, verify_crc, path, base_position)
    records, batch_index = _decode_v2(data, headers, v2, path, base_position)
    if legacy_rows:
        records, batch_index = _merge_legacy(records, batch_index, legacy_rows)
    headers.position = headers.position + base_position
    return RecordSet(records, batch_index, headers, scan.end, scan.torn_bytes)


def _check_v2_headers(
    data: np.ndarray, h: BatchHeaders, v2: np.ndarray, verify_crc: bool, path: str | None, base: int
) -> None:
    def fail(i: int, msg: str) -> None:
        raise CorruptRecordError(
            f"batch at offset {int(h.base_offset[i])}: {msg}", position=base + int(h.position[i]), path=path
        )

    if verify_crc:
        ok = verify_crcs(data, h)
        bad = np.nonzero(~ok)[0]
        if bad.size:
            i = int(bad[0])
            p, s = int(h.position[i]), int(h.size[i])
            computed = int(crc32c.crc32c(data.data[p + 21 : p + s]))
            fail(i, f"CRC mismatch: stored 0x{int(h.crc[i]):08x}, computed 0x{computed:08x}")
    idx = np.nonzero(v2)[0]
    for cond, msg in (
        (h.codec[idx] > 4, "unknown compression codec id {codec}"),
        (h.records_count[idx] < 0, "negative record count {records_count}"),
        (h.last_offset_delta[idx] < 0, "negative lastOffsetDelta {last_offset_delta}"),
    ):
        if cond.any():
            i = int(idx[np.argmax(cond)])
            fail(
                i,
                msg.format(
                    codec=int(h.codec[i]),
                    records_count=int(h.records_count[i]),
                    last_offset_delta=int(h.last_offset_delta[i]),
                ),
            )


def _decode_v2(
    data: np.ndarray, h: BatchHeaders, v2: np.ndarray, path: str | None, base: int
) -> tuple[pa.Table, np.ndarray]:
    idx = np.nonzero(v2)[0]
    rec_start = h.position[idx] + HEADER_SIZE
    rec_end = h.position[idx] + h.size[idx]
    count = h.records_count[idx]
    codec = h.codec[idx]
    buffer = data
    if (codec != 0).any():
        buffer, rec_start, rec_end = _decompress(data, h, idx, rec_start, rec_end, path, base)
    too_many = count * MIN_RECORD_BYTES > rec_end - rec_start
    if too_many.any():
        j = int(np.argmax(too_many))
        raise CorruptRecordError(
            f"batch at offset {int(h.base_offset[idx[j]])}: record count {int(count[j])} cannot "
            f"fit in {int(rec_end[j] - rec_start[j])} bytes of records",
            position=base + int(h.position[idx[j]]),
            path=path,
        )
    n = int(count.sum())
    kern = _kernels.active()
    out_off, out_ts = _empty(n), _empty(n)
    key_pos, key_len, val_pos, val_len = _empty(n), _empty(n), _empty(n), _empty(n)
    hdr_pos, hdr_cnt = _empty(n), _empty(n)
    status = np.zeros(4, np.int64)
    log_append = ((h.attributes[idx] >> 3) & 1).astype(np.bool_)
    total_h = kern.decode_records(
        buffer,
        rec_start,
        rec_end,
        count,
        h.base_offset[idx],
        h.base_timestamp[idx],
        log_append,
        h.max_timestamp[idx],
        out_off,
        out_ts,
        key_pos,
        key_len,
        val_pos,
        val_len,
        hdr_pos,
        hdr_cnt,
        status,
    )
    if total_h < 0:
        j, rec = int(status[1]), int(status[3])
        where = int(status[2]) - int(rec_start[j])
        raise CorruptRecordError(
            f"batch at offset {int(h.base_offset[idx[j]])}, record {rec} (byte {where} of the "
            f"{'decompressed ' if codec[j] else ''}records): {_MESSAGES.get(int(status[0]), 'corrupt')}",
            position=base + int(h.position[idx[j]]),
            path=path,
        )
    keys = _binary_column(kern, buffer, key_pos, key_len)
    values = _binary_column(kern, buffer, val_pos, val_len)
    headers = _headers_column(kern, buffer, hdr_pos, hdr_cnt, int(total_h), path, base, h, idx)
    ts_type = np.repeat(((h.attributes[idx] >> 3) & 1).astype(np.int32), count)
    table = pa.Table.from_arrays(
        [pa.array(out_off), pa.array(out_ts), pa.array(ts_type), keys, values, headers],
        schema=RECORD_SCHEMA,
    )
    return table, np.repeat(idx, count)


def _decompress(
    data: np.ndarray,
    h: BatchHeaders,
    idx: np.ndarray,
    rec_start: np.ndarray,
    rec_end: np.ndarray,
    path: str | None,
    base: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Append every compressed batch's decompressed records to a copy of ``data``."""
    parts: list[Any] = [data]
    total = data.shape[0]
    new_start, new_end = rec_start.copy(), rec_end.copy()
    mv = data.data
    for j in np.nonzero(h.codec[idx] != 0)[0]:
        i = int(idx[j])
        try:
            raw = compression.decompress(
                int(h.codec[i]),
                mv[int(rec_start[j]) : int(rec_end[j])],
                magic=2,
                max_size=MAX_DECOMPRESSED_BATCH,
            )
        except CorruptRecordError as e:
            raise CorruptRecordError(
                f"batch at offset {int(h.base_offset[i])}: {e.reason}",
                position=base + int(h.position[i]),
                path=path,
            ) from e
        parts.append(np.frombuffer(raw, dtype=np.uint8))
        new_start[j] = total
        total += len(raw)
        new_end[j] = total
    return np.concatenate(parts), new_start, new_end


def _alloc(nbytes: int) -> tuple[pa.Buffer, np.ndarray]:
    """A writable buffer from Arrow's memory pool (which reuses pages: fresh mmaps of large
    outputs cost more in page faults than the decoding itself) and a numpy view of it."""
    buf = pa.allocate_buffer(max(nbytes, 1))
    return buf, np.frombuffer(buf, dtype=np.uint8)[:nbytes]


def _empty(n: int, dtype: Any = np.int64) -> np.ndarray:
    """``np.empty`` from Arrow's memory pool (see :func:`_alloc`)."""
    itemsize = np.dtype(dtype).itemsize
    return _alloc(n * itemsize)[1].view(dtype)


def _offsets_for(length: np.ndarray) -> tuple[np.ndarray, pa.DataType]:
    sizes = np.maximum(length, 0)
    total = int(sizes.sum())
    dtype, btype = (np.int64, pa.large_binary()) if total > K.INT32_MAX else (np.int32, pa.binary())
    offsets = _empty(length.shape[0] + 1, dtype)
    offsets[0] = 0
    np.cumsum(sizes, out=offsets[1:], dtype=dtype)
    return offsets, btype


def _binary_column(
    kern: Any, buffer: np.ndarray, pos: np.ndarray, length: np.ndarray, type_: pa.DataType | None = None
) -> pa.Array:
    offsets, btype = _offsets_for(length)
    data_buf, out = _alloc(int(offsets[-1]))
    kern.gather(buffer, pos, length, offsets, out)
    nulls = length < 0
    null_count = int(nulls.sum())
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if null_count else None
    if type_ is not None and btype == pa.binary():
        btype = type_
    return pa.Array.from_buffers(
        btype, length.shape[0], [validity, pa.py_buffer(offsets), data_buf], null_count
    )


def _headers_column(
    kern: Any,
    buffer: np.ndarray,
    hdr_pos: np.ndarray,
    hdr_cnt: np.ndarray,
    total: int,
    path: str | None,
    base: int,
    h: BatchHeaders,
    idx: np.ndarray,
) -> pa.Array:
    n = hdr_pos.shape[0]
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    if total:
        np.cumsum(hdr_cnt, out=list_offsets[1:])
    hk_pos, hk_len = np.empty(total, np.int64), np.empty(total, np.int64)
    hv_pos, hv_len = np.empty(total, np.int64), np.empty(total, np.int64)
    if total:
        sel = hdr_cnt > 0
        kern.decode_headers(buffer, hdr_pos[sel], hdr_cnt[sel], hk_pos, hk_len, hv_pos, hv_len)
    hkeys = _binary_column(kern, buffer, hk_pos, hk_len, pa.string())
    if total:
        try:
            hkeys.validate(full=True)
        except pa.ArrowInvalid as e:
            raise CorruptRecordError(
                f"a record header key is not valid UTF-8: {e}",
                position=base + int(h.position[idx[0]]),
                path=path,
            ) from e
    hvals = _binary_column(kern, buffer, hv_pos, hv_len)
    struct = pa.StructArray.from_arrays([hkeys, hvals], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(list_offsets), struct, type=pa.list_(HEADER_TYPE))


def _decode_legacy(
    data: np.ndarray, h: BatchHeaders, verify_crc: bool, path: str | None, base: int
) -> list[Any]:
    """Decode legacy entries (a per-entry Python step: legacy data is rare and small)."""
    from pylog.storage.codec.legacy import decode_legacy_entry

    rows: list[Any] = []
    mv = data.data
    for i in np.nonzero(h.magic < 2)[0].tolist():
        try:
            entry = decode_legacy_entry(mv, int(h.position[i]), verify_crc=verify_crc)
        except CorruptRecordError as e:
            raise e.with_context(path=path, offset=base) from e
        recs = entry.records
        h.base_offset[i] = recs[0].offset if recs else entry.offset
        h.last_offset_delta[i] = entry.offset - h.base_offset[i]
        h.attributes[i] = entry.codec | ((1 if entry.timestamp_type == LOG_APPEND_TIME else 0) << 3)
        h.crc[i] = entry.crc
        h.base_timestamp[i] = entry.timestamp
        h.max_timestamp[i] = max((r.timestamp for r in recs), default=entry.timestamp)
        h.partition_leader_epoch[i] = -1
        h.producer_id[i] = -1
        h.producer_epoch[i] = -1
        h.base_sequence[i] = -1
        h.records_count[i] = len(recs)
        rows.extend((i, r) for r in recs)
    return rows


def _merge_legacy(v2: pa.Table, v2_index: np.ndarray, rows: list[Any]) -> tuple[pa.Table, np.ndarray]:
    legacy = pa.Table.from_arrays(
        [
            pa.array([r.offset for _, r in rows], pa.int64()),
            pa.array([r.timestamp for _, r in rows], pa.int64()),
            pa.array([r.timestamp_type for _, r in rows], pa.int32()),
            pa.array([r.key for _, r in rows], pa.binary()),
            pa.array([r.value for _, r in rows], pa.binary()),
            pa.array([[] for _ in rows], pa.list_(HEADER_TYPE)),
        ],
        schema=RECORD_SCHEMA,
    )
    index = np.concatenate([v2_index, np.array([i for i, _ in rows], dtype=np.int64)])
    order = np.argsort(index, kind="stable")
    return pa.concat_tables([v2, legacy]).take(pa.array(order)), index[order]


# ============================================================================ encoding


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
    codec_id = compression.codec_id(codec)
    if batch_bytes < HEADER_SIZE + MIN_RECORD_BYTES:
        raise ConfigError(f"batch_bytes must be at least {HEADER_SIZE + MIN_RECORD_BYTES}, got {batch_bytes}")
    if not 1 <= max_records <= K.INT32_MAX:
        raise ConfigError(f"max_records must be in [1, {K.INT32_MAX}], got {max_records}")
    if timestamp_type not in (0, 1):
        raise ConfigError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    values = _to_arrow(value, "value")
    n = len(values)
    v_start, v_data, v_len = binary_parts(values, n, "value")
    k_start, k_data, k_len = binary_parts(key, n, "key")
    ts = timestamps_ms(timestamp, n)
    h_list, hk_off, hk_data, hv_start, hv_data, hv_len = header_parts(headers, n)
    if n == 0:
        return EncodedBatches(
            np.zeros(0, np.uint8), parse_headers(np.zeros(0, np.uint8), *(np.zeros(0, np.int64),) * 3)
        )
    if hk_off.shape[0] > 1:
        hk_len = np.diff(hk_off)
        entry = varint_sizes(hk_len) + hk_len + varint_sizes(hv_len) + np.maximum(hv_len, 0)
        csum = np.concatenate([[0], np.cumsum(entry)])
        h_size = csum[h_list[1:]] - csum[h_list[:-1]]
    else:
        h_size = np.zeros(n, np.int64)
    h_cnt = np.diff(h_list)
    kern = _kernels.active()
    first = np.empty(n, np.int64)
    nbytes = np.empty(n, np.int64)
    body = np.empty(n, np.int64)
    nb = kern.plan_batches(k_len, v_len, h_cnt, h_size, ts, batch_bytes, max_records, first, nbytes, body)
    first, nbytes = first[:nb], nbytes[:nb]
    if (nbytes - 12 > K.INT32_MAX).any():
        raise ValueError("a single record is larger than a batch can hold (2 GiB)")
    attributes = (
        (timestamp_type << 3)
        | (TRANSACTIONAL_MASK if is_transactional else 0)
        | (CONTROL_MASK if is_control else 0)
    )
    _, out = _alloc(int(nbytes.sum()))
    pos = np.empty(nb, np.int64)
    kern.write_batches(
        out,
        first,
        nbytes,
        body,
        k_start,
        k_data,
        k_len,
        v_start,
        v_data,
        v_len,
        ts,
        h_list,
        hk_off,
        hk_data,
        hv_start,
        hv_data,
        hv_len,
        base_offset,
        attributes,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        pos,
    )
    if codec_id != compression.NONE:
        out, pos, nbytes = _compress_batches(out, pos, nbytes, codec_id, level)
    _write_crcs(out, pos, nbytes)
    return EncodedBatches(out, parse_headers(out, pos, nbytes, np.full(nb, 2, np.int64)))


def _write_crcs(out: np.ndarray, pos: np.ndarray, nbytes: np.ndarray) -> None:
    mv = out.data
    crcs = np.fromiter(
        (crc32c.crc32c(mv[p + 21 : p + s]) for p, s in zip(pos.tolist(), nbytes.tolist(), strict=True)),
        dtype=np.uint32,
        count=pos.shape[0],
    )
    out[pos[:, None] + 17 + np.arange(4)] = crcs.astype(">u4").view(np.uint8).reshape(-1, 4)


def _compress_batches(
    out: np.ndarray, pos: np.ndarray, nbytes: np.ndarray, codec: int, level: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts: list[bytes] = []
    new_pos = np.empty_like(pos)
    new_size = np.empty_like(nbytes)
    total = 0
    mv = out.data
    for b, (p, s) in enumerate(zip(pos.tolist(), nbytes.tolist(), strict=True)):
        packed = compression.compress(codec, mv[p + HEADER_SIZE : p + s], level)
        header = bytearray(mv[p : p + HEADER_SIZE])
        HEADER_LENGTH.pack_into(header, 8, HEADER_SIZE - 12 + len(packed))
        attrs = int.from_bytes(header[21:23], "big") | codec
        header[21:23] = attrs.to_bytes(2, "big")
        parts.append(bytes(header))
        parts.append(packed)
        new_pos[b] = total
        new_size[b] = HEADER_SIZE + len(packed)
        total += new_size[b]
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


def concat_records(sets: Sequence[RecordSet]) -> pa.Table:
    """The records of several record sets as one table."""
    if not sets:
        return RECORD_SCHEMA.empty_table()
    return pa.concat_tables([s.records for s in sets])


__all__ = [
    "DEFAULT_BATCH_BYTES",
    "HEADER",
    "HEADER_TYPE",
    "RECORD_SCHEMA",
    "EncodedBatches",
    "RecordSet",
    "concat_records",
    "control_batch",
    "decode",
    "encode",
]
