"""RecordBatch headers: layout, vectorized parsing of many headers at once, entry scanning.

RecordBatch v2 header (Kafka ``DefaultRecordBatch``), 61 bytes, big-endian:

    +------+----------------------+-------+---------------------------------------------+
    | byte | field                | type  | notes                                       |
    +------+----------------------+-------+---------------------------------------------+
    |    0 | baseOffset           | int64 | offset of the record with offsetDelta 0     |
    |    8 | batchLength          | int32 | bytes after this field (size = this + 12)   |
    |   12 | partitionLeaderEpoch | int32 | not covered by the CRC                      |
    |   16 | magic                | int8  | 2 (0/1: legacy message, see legacy.py)      |
    |   17 | crc                  | uint32| CRC-32C of bytes [21, end)                  |
    |   21 | attributes           | int16 | codec 0-2, tsType 3, txn 4, control 5,      |
    |      |                      |       | delete horizon 6                            |
    |   23 | lastOffsetDelta      | int32 |                                             |
    |   27 | baseTimestamp        | int64 | delete horizon when attribute bit 6 is set  |
    |   35 | maxTimestamp         | int64 |                                             |
    |   43 | producerId           | int64 | -1 none                                     |
    |   51 | producerEpoch        | int16 | -1 none                                     |
    |   53 | baseSequence         | int32 | -1 none                                     |
    |   57 | recordsCount         | int32 | may be < lastOffsetDelta + 1 after cleaning |
    |   61 | records              | bytes | compressed as one stream when codec != 0    |
    +------+----------------------+-------+---------------------------------------------+

Every log entry, whatever its magic, starts ``offset int64 | size int32`` and has its magic at
byte 16, which is how mixed legacy/v2 segments are walked.

Control record (transaction marker), the only record of a control batch:
key ``version int16 | type int16`` (0 ABORT, 1 COMMIT, ...), value for COMMIT/ABORT
``version int16 | coordinatorEpoch int32``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

import crc32c
import numpy as np

from pylog.storage.codec import _kernels
from pylog.storage.codec._kernels_src import (
    AT_CRC,
    AT_LENGTH,
    AT_MAGIC,
    CRC_FROM,
    E_ENTRY_SIZE,
    E_TORN_ENTRY,
    ENTRY_PREFIX,
    HEADER,
    HEADER_AT,
    HEADER_FIELDS,
    HEADER_SIZE,
    LOG_OVERHEAD,
    min_body,
)
from pylog.storage.codec.legacy import MESSAGE_HEADER_V0, MESSAGE_HEADER_V1
from pylog.storage.errors import CorruptRecordError

# HEADER (the struct of the table above), HEADER_AT (each field's offset) and the AT_* offsets
# are defined with the kernels, which write headers; they are derived from one field list.
FIELD = {name: struct.Struct(">" + code) for name, code in HEADER_FIELDS}
"""Each header field's own struct, to read or patch one field at its ``HEADER_AT`` offset."""
CONTROL_KEY = struct.Struct(">hh")
END_TXN_VALUE = struct.Struct(">hi")

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP_TYPE = -1

ABORT, COMMIT = 0, 1
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}

_ARANGE_HEADER = np.arange(HEADER_SIZE, dtype=np.int64)
_HEADER_DTYPE = np.dtype(
    {
        "names": [name for name, _ in HEADER_FIELDS],
        "formats": [">" + code for _, code in HEADER_FIELDS],
        "offsets": [HEADER_AT[name] for name, _ in HEADER_FIELDS],
        "itemsize": HEADER_SIZE,
    }
)
"""The v2 header as a numpy structured type: many headers parse in one view."""
# Legacy message fields read by parse_headers (layout in legacy.py): the crc follows the
# offset/size prefix, the attributes byte ends the magic-0 header, the magic-1 timestamp follows.
_LEGACY_CRC_AT = LOG_OVERHEAD
_LEGACY_ATTRIBUTES_AT = MESSAGE_HEADER_V0.size - 1
_LEGACY_TIMESTAMP_AT = MESSAGE_HEADER_V0.size


@dataclass
class BatchHeaders:
    """Header fields of many log entries, one numpy array per field, in file order.

    ``position`` is where each entry starts (relative to the decoded buffer plus the caller's
    base position) and ``size`` its total size.  Legacy (magic 0/1) entries carry the
    equivalent values: ``base_offset`` is the first inner offset, producer fields are -1.
    """

    position: np.ndarray
    size: np.ndarray
    magic: np.ndarray
    base_offset: np.ndarray
    partition_leader_epoch: np.ndarray
    crc: np.ndarray
    attributes: np.ndarray
    last_offset_delta: np.ndarray
    base_timestamp: np.ndarray
    max_timestamp: np.ndarray
    producer_id: np.ndarray
    producer_epoch: np.ndarray
    base_sequence: np.ndarray
    records_count: np.ndarray

    def __len__(self) -> int:
        return int(self.position.shape[0])

    @property
    def last_offset(self) -> np.ndarray:
        return self.base_offset + self.last_offset_delta

    @property
    def codec(self) -> np.ndarray:
        return self.attributes & CODEC_MASK

    @property
    def timestamp_type(self) -> np.ndarray:
        return np.where(self.magic == 0, NO_TIMESTAMP_TYPE, (self.attributes >> 3) & 1)

    @property
    def is_transactional(self) -> np.ndarray:
        return (self.attributes & TRANSACTIONAL_MASK) != 0

    @property
    def is_control(self) -> np.ndarray:
        return (self.attributes & CONTROL_MASK) != 0

    @property
    def has_delete_horizon(self) -> np.ndarray:
        return (self.attributes & DELETE_HORIZON_MASK) != 0

    def take(self, index: np.ndarray | slice) -> BatchHeaders:
        return BatchHeaders(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(parts: list[BatchHeaders]) -> BatchHeaders:
        if not parts:
            return empty_headers()
        return BatchHeaders(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(BatchHeaders)}
        )


def empty_headers() -> BatchHeaders:
    return BatchHeaders(**{f.name: np.zeros(0, dtype=np.int64) for f in fields(BatchHeaders)})


def as_uint8(buf: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A zero-copy uint8 view of a bytes-like object."""
    if isinstance(buf, np.ndarray):
        return buf.view(np.uint8).reshape(-1)
    return np.frombuffer(buf, dtype=np.uint8)


def parse_headers(
    data: np.ndarray, position: np.ndarray, size: np.ndarray, magic: np.ndarray
) -> BatchHeaders:
    """Parse the v2 header fields of the entries at ``position`` in one vectorized pass.

    Entries must be complete (as found by :func:`scan_entries`).  Fields of legacy entries
    are left for :mod:`legacy` to fill in.
    """
    k = position.shape[0]
    out: dict[str, np.ndarray] = {
        "position": position.astype(np.int64),
        "size": size.astype(np.int64),
        "magic": magic.astype(np.int64),
    }
    v2 = magic >= 2
    raw = np.zeros((k, HEADER_SIZE), dtype=np.uint8)
    raw[:, :LOG_OVERHEAD] = data[position[:, None] + _ARANGE_HEADER[:LOG_OVERHEAD]]  # every magic
    if v2.all():
        raw = data[position[:, None] + _ARANGE_HEADER]
    elif v2.any():
        raw[v2] = data[position[v2, None] + _ARANGE_HEADER]
    fields_ = np.ascontiguousarray(raw).view(_HEADER_DTYPE).reshape(-1)
    for name in _HEADER_DTYPE.names or ():
        if name != "magic":
            out[name] = fields_[name].astype(np.int64)
    del out["batch_length"]  # implied by size
    legacy = ~v2
    if legacy.any():
        # a legacy entry's offset field is its last offset (the last inner offset of a wrapper)
        width = MESSAGE_HEADER_V1.size
        lraw = np.zeros((int(legacy.sum()), width), dtype=np.uint8)
        lraw[:, :] = data[position[legacy, None] + np.minimum(_ARANGE_HEADER[:width], size[legacy, None] - 1)]
        out["crc"][legacy] = _be_column(lraw, _LEGACY_CRC_AT, 4) & 0xFFFFFFFF
        out["attributes"][legacy] = lraw[:, _LEGACY_ATTRIBUTES_AT]
        ts = np.where(magic[legacy] == 1, _be_column(lraw, _LEGACY_TIMESTAMP_AT, 8), -1)
        for name in ("base_timestamp", "max_timestamp"):
            out[name][legacy] = ts
        for name in ("partition_leader_epoch", "producer_id", "producer_epoch", "base_sequence"):
            out[name][legacy] = -1
        out["records_count"][legacy] = 1
    return BatchHeaders(**out)


def _be_column(raw: np.ndarray, off: int, width: int) -> np.ndarray:
    dt = {8: ">i8", 4: ">i4", 2: ">i2"}[width]
    return np.ascontiguousarray(raw[:, off : off + width]).view(dt).reshape(-1).astype(np.int64)


@dataclass
class Scan:
    """Where the complete entries of a buffer are, and what follows them."""

    position: np.ndarray  # int64 entry start positions (relative to the buffer)
    size: np.ndarray  # int64 entry sizes including the 12-byte prefix
    magic: np.ndarray  # int64
    end: int  # position after the last complete entry
    torn_bytes: int  # bytes after ``end`` that do not form a complete entry
    error: CorruptRecordError | None = None  # set instead of raised with ``raise_on_corrupt=False``


def scan_entries(
    data: np.ndarray,
    *,
    start: int = 0,
    end: int | None = None,
    path: str | None = None,
    base_position: int = 0,
    allow_torn_tail: bool = True,
    raise_on_corrupt: bool = True,
) -> Scan:
    """Find the complete log entries in ``data[start:end]`` without decoding them.

    An entry whose declared size is below the smallest legal entry, or a magic above 2,
    raises CorruptRecordError.  A truncated last entry is a torn tail: allowed (and reported
    in ``torn_bytes``) when ``allow_torn_tail``, an error otherwise.
    """
    end = data.shape[0] if end is None else end
    cap = (end - start) // 26 + 1  # 26 = smallest legal entry (magic 0, empty key and value)
    pos = np.empty(cap, dtype=np.int64)
    size = np.empty(cap, dtype=np.int64)
    magic = np.empty(cap, dtype=np.int64)
    status = np.zeros(4, dtype=np.int64)
    k = _kernels.active(cap).scan_entries(data, start, end, pos, size, magic, status)
    pos, size, magic = pos[:k], size[:k], magic[:k]
    code = int(status[0])
    error: CorruptRecordError | None = None
    if code == E_ENTRY_SIZE:
        bad = int(status[2])
        m = int(data[bad + AT_MAGIC])
        error = CorruptRecordError(
            f"log entry declares size {int(status[3])}, below the minimum {min_body(m)} for magic {m}",
            position=base_position + bad,
            path=path,
        )
    elif code == E_TORN_ENTRY and not allow_torn_tail:
        bad = int(status[2])
        declared = (
            f", the entry declares {int(FIELD['batch_length'].unpack_from(data.data, bad + AT_LENGTH)[0])}"
            f" + {LOG_OVERHEAD} bytes"
            if end - bad >= LOG_OVERHEAD
            else f", fewer than the {ENTRY_PREFIX}-byte entry prefix"
        )
        error = CorruptRecordError(
            f"truncated log entry: {end - bad} bytes remain{declared}",
            position=base_position + bad,
            path=path,
        )
    bad_magic = np.nonzero(magic > 2)[0]
    if bad_magic.size:
        i = int(bad_magic[0])
        error = CorruptRecordError(
            f"unknown magic {int(magic[i])} (expected 0, 1 or 2)",
            position=base_position + int(pos[i]),
            path=path,
        )
        pos, size, magic, k = pos[:i], size[:i], magic[:i], i
    if error is not None and raise_on_corrupt:
        raise error
    stop = int(pos[-1] + size[-1]) if k else start
    return Scan(pos, size, magic, stop, 0 if error else end - stop, error)


def verify_crcs(data: np.ndarray, headers: BatchHeaders) -> np.ndarray:
    """Boolean array: does each v2 entry's stored CRC-32C match its bytes?  (legacy: True)"""
    ok = np.ones(len(headers), dtype=bool)
    mv = data.data
    for i in np.nonzero(headers.magic >= 2)[0]:
        p, s = int(headers.position[i]), int(headers.size[i])
        ok[i] = crc32c.crc32c(mv[p + CRC_FROM : p + s]) == int(headers.crc[i])
    return ok


def batch_crc(data: np.ndarray | bytes | memoryview, start: int, end: int) -> int:
    """CRC-32C of the checksummed range (attributes to end) of the batch ``data[start:end]``."""
    view = data.data if isinstance(data, np.ndarray) else memoryview(data)
    return int(crc32c.crc32c(view[start + CRC_FROM : end]))


def write_crcs(out: np.ndarray, pos: np.ndarray, nbytes: np.ndarray) -> None:
    """Store the CRC-32C of each v2 batch ``out[pos[b]:pos[b]+nbytes[b]]`` in its header."""
    mv = out.data
    crcs = np.fromiter(
        (crc32c.crc32c(mv[p + CRC_FROM : p + s]) for p, s in zip(pos.tolist(), nbytes.tolist(), strict=True)),
        dtype=np.uint32,
        count=pos.shape[0],
    )
    width = FIELD["crc"].size
    out[pos[:, None] + AT_CRC + np.arange(width)] = crcs.astype(">u4").view(np.uint8).reshape(-1, width)


def batch_error(h: BatchHeaders, i: int, msg: str, path: str | None, base: int) -> CorruptRecordError:
    """The error for entry ``i`` of ``h`` (positions relative to the file position ``base``)."""
    where = base + int(h.position[i])
    return CorruptRecordError(f"batch at offset {int(h.base_offset[i])}: {msg}", position=where, path=path)


def check_v2_headers(
    data: np.ndarray,
    h: BatchHeaders,
    *,
    verify_crc: bool | np.ndarray = True,
    path: str | None = None,
    base_position: int = 0,
) -> None:
    """Raise CorruptRecordError for the first v2 entry of ``h`` whose stored CRC does not match
    its bytes (checked where ``verify_crc``: all, none, or a boolean mask of entries), then for
    the first with an unknown codec, a negative record count or a negative lastOffsetDelta."""
    if verify_crc is not False:
        if verify_crc is True:
            ok = verify_crcs(data, h)
        else:
            ok = np.ones(len(h), bool)
            rows = np.nonzero(verify_crc)[0]
            ok[rows] = verify_crcs(data, h.take(rows))
        if not ok.all():
            i = int(np.argmax(~ok))
            p, s = int(h.position[i]), int(h.size[i])
            msg = f"CRC mismatch: stored 0x{int(h.crc[i]):08x}, computed 0x{batch_crc(data, p, p + s):08x}"
            raise batch_error(h, i, msg, path, base_position)
    v2 = h.magic >= 2
    for cond, msg, values in (
        (v2 & (h.codec > 4), "unknown compression codec id", h.codec),
        (v2 & (h.records_count < 0), "negative record count", h.records_count),
        (v2 & (h.last_offset_delta < 0), "negative lastOffsetDelta", h.last_offset_delta),
    ):
        if cond.any():
            i = int(np.argmax(cond))
            raise batch_error(h, i, f"{msg} {int(values[i])}", path, base_position)


def control_type(key: bytes | None, *, position: int | None = None) -> int:
    """The type of a control record from its key (-1 for a type Kafka does not know)."""
    if key is None or len(key) < CONTROL_KEY.size:
        raise CorruptRecordError(
            f"control record key must have at least {CONTROL_KEY.size} bytes, "
            f"has {0 if key is None else len(key)}",
            position=position,
        )
    version, kind = CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"control record key has negative version {version}", position=position)
    return kind if kind in CONTROL_TYPES else -1


def end_txn_marker(value: bytes | None, *, position: int | None = None) -> tuple[int, int]:
    """(version, coordinatorEpoch) of a COMMIT/ABORT marker's value."""
    if value is None or len(value) < END_TXN_VALUE.size:
        raise CorruptRecordError(
            f"end-transaction marker value must have at least {END_TXN_VALUE.size} bytes",
            position=position,
        )
    version, epoch = END_TXN_VALUE.unpack_from(value)
    return int(version), int(epoch)


__all__ = [
    "ABORT",
    "COMMIT",
    "CONTROL_TYPES",
    "CREATE_TIME",
    "FIELD",
    "HEADER",
    "HEADER_AT",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "LOG_APPEND_TIME",
    "LOG_OVERHEAD",
    "BatchHeaders",
    "Scan",
    "as_uint8",
    "batch_crc",
    "batch_error",
    "check_v2_headers",
    "control_type",
    "end_txn_marker",
    "parse_headers",
    "scan_entries",
    "verify_crcs",
    "write_crcs",
]
