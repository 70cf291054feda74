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
from pylog.storage.codec._kernels_src import E_ENTRY_SIZE, E_TORN_ENTRY
from pylog.storage.errors import CorruptRecordError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # offset + size
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

_ARANGE61 = np.arange(HEADER_SIZE, dtype=np.int64)
_HEADER_DTYPE = np.dtype(
    {
        "names": [
            "base_offset",
            "batch_length",
            "partition_leader_epoch",
            "magic",
            "crc",
            "attributes",
            "last_offset_delta",
            "base_timestamp",
            "max_timestamp",
            "producer_id",
            "producer_epoch",
            "base_sequence",
            "records_count",
        ],
        "formats": [">i8", ">i4", ">i4", "u1", ">u4", ">i2", ">i4", ">i8", ">i8", ">i8", ">i2", ">i4", ">i4"],
        "offsets": [0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57],
        "itemsize": HEADER_SIZE,
    }
)
"""The 61-byte v2 header as a numpy structured type: many headers parse in one view."""


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
    raw[:, :12] = data[position[:, None] + _ARANGE61[:12]]  # offset and size: every magic
    if v2.all():
        raw = data[position[:, None] + _ARANGE61]
    elif v2.any():
        raw[v2] = data[position[v2, None] + _ARANGE61]
    fields_ = np.ascontiguousarray(raw).view(_HEADER_DTYPE).reshape(-1)
    for name in _HEADER_DTYPE.names or ():
        if name != "magic":
            out[name] = fields_[name].astype(np.int64)
    del out["batch_length"]  # implied by size
    legacy = ~v2
    if legacy.any():
        # a legacy entry's offset field is its last offset (the last inner offset of a wrapper);
        # crc at 12, attributes at 17, and for magic 1 the timestamp at 18
        lraw = np.zeros((int(legacy.sum()), 26), dtype=np.uint8)
        lraw[:, :] = data[position[legacy, None] + np.minimum(_ARANGE61[:26], size[legacy, None] - 1)]
        out["crc"][legacy] = _be_column(lraw, 12, 4) & 0xFFFFFFFF
        out["attributes"][legacy] = lraw[:, 17]
        ts = np.where(magic[legacy] == 1, _be_column(lraw, 18, 8), -1)
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
    k = _kernels.active().scan_entries(data, start, end, pos, size, magic, status)
    pos, size, magic = pos[:k], size[:k], magic[:k]
    code = int(status[0])
    error: CorruptRecordError | None = None
    if code == E_ENTRY_SIZE:
        bad = int(status[2])
        m = int(data[bad + 16])
        error = CorruptRecordError(
            f"log entry declares size {int(status[3])}, below the minimum "
            f"{49 if m >= 2 else (22 if m == 1 else 14)} for magic {m}",
            position=base_position + bad,
            path=path,
        )
    elif code == E_TORN_ENTRY and not allow_torn_tail:
        bad = int(status[2])
        declared = (
            f", the entry declares {int.from_bytes(data[bad + 8 : bad + 12].tobytes(), 'big', signed=True)}"
            " + 12 bytes"
            if end - bad >= 12
            else ", fewer than the 17-byte entry prefix"
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
        ok[i] = crc32c.crc32c(mv[p + 21 : p + s]) == int(headers.crc[i])
    return ok


def batch_crc(data: np.ndarray | bytes | memoryview, start: int, end: int) -> int:
    """CRC-32C of ``data[start+21:end]`` (the checksummed range of a batch at ``start``)."""
    view = data.data if isinstance(data, np.ndarray) else memoryview(data)
    return int(crc32c.crc32c(view[start + 21 : end]))


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
    "HEADER",
    "HEADER_SIZE",
    "LOG_APPEND_TIME",
    "BatchHeaders",
    "Scan",
    "as_uint8",
    "batch_crc",
    "control_type",
    "end_txn_marker",
    "parse_headers",
    "scan_entries",
    "verify_crcs",
]
