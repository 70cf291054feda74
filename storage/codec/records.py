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

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pylog.storage.codec import _kernels, compression
from pylog.storage.codec import _kernels_src as K
from pylog.storage.codec.batch import (
    HEADER,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    BatchHeaders,
    as_uint8,
    batch_error,
    check_v2_headers,
    parse_headers,
    scan_entries,
)
from pylog.storage.codec.columns import HEADER_TYPE
from pylog.storage.codec.columns import pool_buffer as _alloc
from pylog.storage.codec.columns import pool_empty as _empty
from pylog.storage.codec.encoding import (  # encoding is its own module; these stay importable here
    DEFAULT_BATCH_BYTES,
    MIN_RECORD_BYTES,
    EncodedBatches,
    EncodeInput,
    compress_batches,
    control_batch,
    encode,
    encode_partitioned,
)
from pylog.storage.errors import CorruptRecordError

MAX_DECOMPRESSED_BATCH = 1 << 30
"""Upper bound on one batch's decompressed records section (a defence, not a format limit)."""

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
    if (headers.magic >= 2).any():
        check_v2_headers(data, headers, verify_crc=verify_crc, path=path, base_position=base_position)
    sections = record_sections(data, headers, verify_crc=verify_crc, path=path, base_position=base_position)
    walked = walk_decoded(sections, error=lambda j, msg: batch_error(headers, j, msg, path, base_position))
    idx = np.arange(len(headers), dtype=np.int64)
    column = _headers_column(
        _kernels.active(walked.offset.shape[0]),
        sections.buffer,
        walked.hdr_rec,
        walked.hdr_pos,
        walked.hdr_cnt,
        walked.total_headers,
        path,
        base_position,
        headers,
        idx,
    )
    ts_type = np.repeat(((headers.attributes >> 3) & 1).astype(np.int32), sections.count)
    sections.fix_legacy(walked.offset, walked.timestamp, ts_type)
    table = pa.Table.from_arrays(
        [
            pa.array(walked.offset),
            pa.array(walked.timestamp),
            pa.array(ts_type),
            walked.keys,
            walked.values,
            column,
        ],
        schema=RECORD_SCHEMA,
    )
    headers.position = headers.position + base_position
    return RecordSet(table, np.repeat(idx, sections.count), headers, scan.end, scan.torn_bytes)


# ============================================================================ records sections


@dataclass
class Sections:
    """The records sections of a run of log entries, where the record walk reads them.

    ``buffer`` starts with the entries' bytes (an entry's position is the same in both); after
    them come the records of compressed batches, decompressed, and those of legacy (magic 0/1)
    entries re-encoded as a v2 records section: decoding and the cleaner's spans read legacy
    entries the one way.  Entry ``j`` has ``count[j]`` records in ``buffer[start[j]:end[j]]``,
    their offset and timestamp deltas relative to ``base_offset[j]`` and ``base_timestamp[j]``;
    the records of the legacy entries ``legacy`` take their own offsets and timestamps
    (:meth:`fix_legacy`)."""

    buffer: np.ndarray
    start: np.ndarray
    end: np.ndarray
    count: np.ndarray
    base_offset: np.ndarray
    base_timestamp: np.ndarray
    log_append: np.ndarray
    max_timestamp: np.ndarray
    decompressed: np.ndarray  # bool: the section came out of a decompressor (error messages say so)
    legacy: list[tuple[int, LegacyRecords]]

    @functools.cached_property
    def first(self) -> np.ndarray:
        """``first[j]:first[j + 1]`` are the rows of entry ``j``'s records."""
        first = np.zeros(self.count.shape[0] + 1, np.int64)
        np.cumsum(self.count, out=first[1:])
        return first

    def fix_legacy(
        self, offset: np.ndarray, timestamp: np.ndarray, timestamp_type: np.ndarray | None = None
    ) -> None:
        """Give the walked records of legacy entries their own offsets, timestamps (and types)."""
        for j, rec in self.legacy:
            lo, hi = int(self.first[j]), int(self.first[j + 1])
            offset[lo:hi] = rec.offset
            timestamp[lo:hi] = rec.timestamp
            if timestamp_type is not None:
                timestamp_type[lo:hi] = rec.timestamp_type


@dataclass(frozen=True)
class LegacyRecords:
    """The offsets, timestamps and timestamp types of a legacy entry's records (magic 0 has no
    timestamps: -1 and type -1)."""

    offset: np.ndarray
    timestamp: np.ndarray
    timestamp_type: np.ndarray


def record_sections(
    data: np.ndarray,
    h: BatchHeaders,
    *,
    verify_crc: bool = True,
    path: str | None = None,
    base_position: int = 0,
) -> Sections:
    """The records sections of the complete entries ``h`` (positions relative to ``data``, v2
    headers already checked): compressed ones decompressed, legacy ones decoded (their rows
    of ``h`` filled in, their CRCs checked unless ``verify_crc`` is False) and re-encoded."""
    start = h.position + HEADER_SIZE
    end = h.position + h.size
    count = h.records_count.copy()
    base_offset = h.base_offset.copy()
    base_timestamp = h.base_timestamp.copy()
    log_append = ((h.attributes >> 3) & 1).astype(np.bool_)
    decompressed = np.zeros(len(h), np.bool_)
    legacy: list[tuple[int, LegacyRecords]] = []
    parts: list[np.ndarray] = [data]
    total = int(data.shape[0])
    mv = data.data
    for i in np.nonzero((h.magic < 2) | (h.codec != 0))[0].tolist():
        p, s = int(h.position[i]), int(h.size[i])
        if h.magic[i] >= 2:
            try:
                raw = compression.decompress(
                    int(h.codec[i]), mv[p + HEADER_SIZE : p + s], magic=2, max_size=MAX_DECOMPRESSED_BATCH
                )
            except CorruptRecordError as e:
                raise batch_error(h, i, e.reason, path, base_position) from e
            section = np.frombuffer(raw, dtype=np.uint8)
            decompressed[i] = True
        else:
            section, rec, base_timestamp[i] = _legacy_section(mv, h, i, verify_crc, path, base_position)
            count[i], base_offset[i], log_append[i] = h.records_count[i], 0, False
            legacy.append((i, rec))
        parts.append(section)
        start[i] = total
        total += int(section.shape[0])
        end[i] = total
    buffer = np.concatenate(parts) if len(parts) > 1 else data
    return Sections(
        buffer,
        start,
        end,
        count,
        base_offset,
        base_timestamp,
        log_append,
        h.max_timestamp,
        decompressed,
        legacy,
    )


def _legacy_section(
    mv: memoryview, h: BatchHeaders, i: int, verify_crc: bool, path: str | None, base: int
) -> tuple[np.ndarray, LegacyRecords, int]:
    """Decode legacy entry ``i`` (a per-entry Python step: legacy data is rare and small), fill
    its row of ``h`` as Kafka's ``AbstractLegacyRecordBatch`` reads it, and re-encode its records
    as one v2 records section: (the section, the records' own offsets and timestamps, the base
    timestamp of the section's deltas)."""
    from pylog.storage.codec.legacy import decode_legacy_entry

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
    rec = LegacyRecords(
        np.array([r.offset for r in recs], np.int64),
        np.array([r.timestamp for r in recs], np.int64),
        np.array([r.timestamp_type for r in recs], np.int32),
    )
    if not recs:
        return np.zeros(0, np.uint8), rec, 0
    enc = encode(
        pa.array([r.value for r in recs], pa.binary()),
        pa.array([r.key for r in recs], pa.binary()),
        rec.timestamp,
        batch_bytes=2**31,
    )
    return enc.buffer[HEADER_SIZE:], rec, int(enc.batches.base_timestamp[0])


@dataclass
class RecordSpans:
    """Where each record of some records sections is, nothing copied (the cleaner's view, see
    :mod:`rewrite`): offset, timestamp, where its key starts, key and value lengths, and its
    *tail* (from its keyLength varint) and end."""

    offset: np.ndarray
    timestamp: np.ndarray
    key_pos: np.ndarray
    key_len: np.ndarray
    val_len: np.ndarray
    tail: np.ndarray
    end: np.ndarray


@dataclass
class DecodedRecords:
    """The records of some records sections, decoded: offset, timestamp, keys and values copied
    out, and the records with headers (which, where their headers start, how many)."""

    offset: np.ndarray
    timestamp: np.ndarray
    keys: pa.Array
    values: pa.Array
    hdr_rec: np.ndarray
    hdr_pos: np.ndarray
    hdr_cnt: np.ndarray
    total_headers: int


WalkError = Callable[[int, str], CorruptRecordError]
"""``error(j, message)``: the error for corrupt framing in section ``j``."""


def walk_spans(sec: Sections, error: WalkError) -> RecordSpans:
    """Locate every record of ``sec``, checking every length against the end of its record
    (:func:`_kernels_src.walk_records`); legacy records take their own offsets and timestamps."""
    n = _check_counts(sec, error)
    status = np.zeros(8, np.int64)
    w = RecordSpans(*(np.empty(n, np.int64) for _ in range(7)))
    got = _kernels.active(n).walk_records(
        *_walk_inputs(sec), w.offset, w.timestamp, w.key_pos, w.key_len, w.val_len, w.tail, w.end,
        None, None, None, None, None, status,
    )  # fmt: skip
    _check_walk(sec, got, status, error)
    sec.fix_legacy(w.offset, w.timestamp)
    return w


def walk_decoded(sec: Sections, error: WalkError) -> DecodedRecords:
    """Decode every record of ``sec`` (keys and values copied out as they are walked), checking
    every length against the end of its record.  Offsets and timestamps are as walked: the
    caller applies :meth:`Sections.fix_legacy`."""
    n = _check_counts(sec, error)
    status = np.zeros(8, np.int64)
    # decoded columns come from Arrow's pool, like the Arrow arrays built beside them;
    # every key (value) lies inside its records section: their total bounds the bytes
    capacity = int((sec.end - sec.start).sum())
    keys, values = _binary_out(n, capacity, scratch=True), _binary_out(n, capacity)
    rare = _empty(5 * n).reshape(5, n)
    offset, timestamp = _empty(n), _empty(n)
    got = _kernels.active(n).walk_records(
        *_walk_inputs(sec), offset, timestamp, None, None, None, None, None,
        rare, keys[0][1], keys[1][1], values[0][1], values[1][1], status,
    )  # fmt: skip
    _check_walk(sec, got, status, error)
    key_nulls, value_nulls, with_headers = (int(c) for c in status[4:7])
    hdr_rec, hdr_pos, hdr_cnt = rare[2:5, :with_headers]
    return DecodedRecords(
        offset,
        timestamp,
        _binary_array(*keys, rare[0, :key_nulls]),
        _binary_array(*values, rare[1, :value_nulls]),
        hdr_rec,
        hdr_pos,
        hdr_cnt,
        int(got),
    )


def _walk_inputs(sec: Sections) -> tuple[np.ndarray, ...]:
    return (
        sec.buffer,
        sec.start,
        sec.end,
        sec.count,
        sec.base_offset,
        sec.base_timestamp,
        sec.log_append,
        sec.max_timestamp,
    )


def _check_counts(sec: Sections, error: WalkError) -> int:
    """The number of records of ``sec``, once no section claims more than its bytes can hold."""
    too_many = sec.count * MIN_RECORD_BYTES > sec.end - sec.start
    if too_many.any():
        j = int(np.argmax(too_many))
        size = int(sec.end[j] - sec.start[j])
        raise error(j, f"record count {int(sec.count[j])} cannot fit in {size} bytes of records")
    return int(sec.count.sum())


def _check_walk(sec: Sections, got: int, status: np.ndarray, error: WalkError) -> None:
    if got < 0:
        j, rec = int(status[1]), int(status[3])
        where = int(status[2]) - int(sec.start[j])
        what = "decompressed records" if sec.decompressed[j] else "records"
        msg = _MESSAGES.get(int(status[0]), "corrupt")
        raise error(j, f"record {rec} (byte {where} of the {what}): {msg}")


_scratch = threading.local()
_SCRATCH_MAX = 64 << 20
"""Largest scratch buffer a thread keeps (:func:`_binary_out`); bigger sets use Arrow buffers."""


def _offsets_for(length: np.ndarray) -> tuple[np.ndarray, pa.DataType]:
    sizes = np.maximum(length, 0)
    total = int(sizes.sum())
    dtype, btype = (np.int64, pa.large_binary()) if total > K.INT32_MAX else (np.int32, pa.binary())
    offsets = _empty(length.shape[0] + 1, dtype)
    offsets[0] = 0
    np.cumsum(sizes, out=offsets[1:], dtype=dtype)
    return offsets, btype


def _binary_out(
    n: int, capacity: int, *, scratch: bool = False
) -> tuple[tuple[pa.Buffer, np.ndarray], tuple[pa.Buffer | None, np.ndarray]]:
    """Offsets (``[0]`` = 0) and a data buffer of ``capacity`` bytes for ``n`` binary values
    that the kernel fills; 64-bit offsets when the capacity exceeds 32-bit ones.

    ``scratch``: the data goes to this thread's reused scratch buffer (None for the Arrow
    buffer) and :func:`_binary_array` copies what was used out of it.  For keys, usually a
    small part of the records: a fresh buffer of the records' size for them would make the
    memory pool map (and the kernel zero) pages for bytes never used."""
    dtype = np.int64 if capacity > K.INT32_MAX else np.int32
    buf, raw = _alloc((n + 1) * np.dtype(dtype).itemsize)
    offsets = raw.view(dtype)
    offsets[0] = 0
    if scratch and capacity <= _SCRATCH_MAX:
        held = getattr(_scratch, "data", None)
        if held is None or held.shape[0] < capacity:
            held = _scratch.data = np.empty(max(capacity, 1 << 20), np.uint8)
        return (buf, offsets), (None, held[:capacity])
    return (buf, offsets), _alloc(capacity)


def _binary_array(
    offsets: tuple[pa.Buffer, np.ndarray], data: tuple[pa.Buffer | None, np.ndarray], nulls: np.ndarray
) -> pa.Array:
    """The Arrow binary array the kernel filled (:func:`_binary_out`), null at the indexes ``nulls``.

    What was used of a scratch buffer, or of a mostly unused one, is copied to a buffer of its
    size, so a decoded set holds at most about twice its bytes."""
    offs = offsets[1]
    used = int(offs[-1])
    buf = data[0]
    if buf is None or (buf.size > (1 << 20) and used < buf.size // 2):
        buf, view = _alloc(used)
        view[:] = data[1][:used]
    btype = pa.binary()
    if offs.dtype == np.int64:
        if used > K.INT32_MAX:
            btype = pa.large_binary()
        else:
            offs = offs.astype(np.int32)
    offs_buf = offsets[0] if offs is offsets[1] else pa.py_buffer(offs)
    n = offs.shape[0] - 1
    validity = None
    if nulls.shape[0]:
        valid = np.ones(n, np.bool_)
        valid[nulls] = False
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(btype, n, [validity, offs_buf, buf], int(nulls.shape[0]))


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
    hdr_rec: np.ndarray,
    hdr_pos: np.ndarray,
    hdr_cnt: np.ndarray,
    total: int,
    path: str | None,
    base: int,
    h: BatchHeaders,
    idx: np.ndarray,
) -> pa.Array:
    """The headers of the records ``hdr_rec`` (the others have none) as a list column."""
    n = int(h.records_count[idx].sum())
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    if total:
        list_offsets[hdr_rec + 1] = hdr_cnt
        np.cumsum(list_offsets, out=list_offsets)
    hk_pos, hk_len = np.empty(total, np.int64), np.empty(total, np.int64)
    hv_pos, hv_len = np.empty(total, np.int64), np.empty(total, np.int64)
    if total:
        kern.decode_headers(buffer, hdr_pos, hdr_cnt, hk_pos, hk_len, hv_pos, hv_len)
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


def concat_records(sets: Sequence[RecordSet]) -> pa.Table:
    """The records of several record sets as one table."""
    if not sets:
        return RECORD_SCHEMA.empty_table()
    return pa.concat_tables([s.records for s in sets])


__all__ = [
    "DEFAULT_BATCH_BYTES",
    "HEADER",
    "HEADER_TYPE",
    "MIN_RECORD_BYTES",
    "RECORD_SCHEMA",
    "EncodeInput",
    "EncodedBatches",
    "RecordSet",
    "compress_batches",
    "concat_records",
    "control_batch",
    "decode",
    "encode",
    "encode_partitioned",
]
