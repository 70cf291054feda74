"""The lines ``pylog dump`` prints for a ``.log`` file, as Kafka's DumpLogSegments prints them:
one per batch (v2) or entry (legacy, magic 0/1), and with ``--deep-iteration`` one ``| offset: …``
line per record.

Legacy (magic 0/1) entry header, read for the shallow ``offset: …`` line (v2 batch header:
see :mod:`batch`, index entries: see :mod:`index`), big-endian:

    +------+-------------+--------+-------------------------------------------------+
    | byte | field       | type   | notes                                           |
    +------+-------------+--------+-------------------------------------------------+
    |    0 | offset      | int64  | a wrapper's is the offset of its last message   |
    |    8 | messageSize | int32  | entry size = this + 12                          |
    |   12 | crc         | uint32 | CRC-32 (IEEE) of bytes [16, end)                |
    |   16 | magic       | int8   | 0 or 1                                          |
    |   17 | attributes  | int8   | codec bits 0-2, timestamp type bit 3 (magic 1)  |
    |   18 | timestamp   | int64  | magic 1 only                                    |
    +------+-------------+--------+-------------------------------------------------+
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pylog.storage.codec import compression, records
from pylog.storage.codec.batch import (
    CONTROL_KEY,
    CONTROL_TYPES,
    BatchHeaders,
    Scan,
    control_type,
    end_txn_marker,
    parse_headers,
    scan_entries,
    verify_crcs,
)
from pylog.storage.errors import CorruptRecordError

LEGACY_V0 = struct.Struct(">qiIbb")  # offset, messageSize, crc, magic, attributes
LEGACY_V1 = struct.Struct(">qiIbbq")  # ... timestamp
LENGTH = struct.Struct(">i")

INT32_MAX = 2**31 - 1
HEADER_SIZE_UP_TO_MAGIC = 17  # FileLogInputStream stops when no more than this is left
DECODE_CHUNK = 32 << 20  # bytes of batches decoded at once for --deep-iteration
TIMESTAMP_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
LEGACY_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class OffsetTracker:
    """Kafka's non-consecutive offset check over the records of one ``.log`` file."""

    def __init__(self) -> None:
        self.last = -1
        self.pairs: list[tuple[int, int]] = []

    def see(self, offset: int) -> None:
        if self.last != -1 and offset != self.last + 1:
            self.pairs.append((self.last, offset))
        self.last = offset


@dataclass
class Entries:
    """The complete entries at the start of a buffer, with their printable batch fields."""

    headers: BatchHeaders
    last_offset: np.ndarray
    valid: np.ndarray  # stored CRC matches
    end: int  # where the complete entries stop
    error: CorruptRecordError | None  # what stopped the walk before the end of the data


def scan_log(data: np.ndarray, path: str) -> Entries:
    """Walk the entries as Kafka's ``FileLogInputStream`` does, stopping at the first bad one."""
    n = data.shape[0]
    end, error = n, None
    scan: Scan | None = None
    while scan is None:
        try:
            scan = scan_entries(data, end=end, path=path)
        except CorruptRecordError as e:
            bad = int(e.position or 0)
            if n - bad > HEADER_SIZE_UP_TO_MAGIC:  # Kafka stops silently at <= 17 bytes left
                error = e
            end = bad
    h = parse_headers(data, scan.position, scan.size, scan.magic)
    last = h.base_offset + h.last_offset_delta
    valid = verify_crcs(data, h)
    for i in np.nonzero(h.magic < 2)[0].tolist():  # legacy: fill in the fields Kafka prints
        p, size = int(h.position[i]), int(h.size[i])
        fields = (LEGACY_V1 if h.magic[i] == 1 else LEGACY_V0).unpack_from(data.data, p)
        last[i] = fields[0]
        h.crc[i] = fields[2]
        h.attributes[i] = fields[4] & 0xFF
        h.max_timestamp[i] = fields[5] if h.magic[i] == 1 else -1
        valid[i] = zlib.crc32(data.data[p + 16 : p + size]) == fields[2]
    return Entries(h, last, valid, scan.end, error)


def timestamp_type(magic: int, attributes: int) -> str:
    return TIMESTAMP_TYPES[-1 if magic == 0 else (attributes >> 3) & 1]


def increment_sequence(sequence: int, increment: int) -> int:
    """``DefaultRecordBatch.incrementSequence``: wraps at Integer.MAX_VALUE to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def java_bool(b: object) -> str:
    return "true" if b else "false"


def batch_fields(e: Entries, i: int, path: str) -> dict[str, Any]:
    """The fields Kafka prints for batch (v2) or entry (legacy) ``i``, in its order and with its
    names (``timestampType`` and ``maxTimestamp`` print as ``CreateTime: <ts>``)."""
    h = e.headers
    magic, attrs = int(h.magic[i]), int(h.attributes[i])
    codec = attrs & 0x07
    names = compression.CODEC_NAMES if magic >= 2 else LEGACY_CODECS
    if codec not in names:
        where = int(h.position[i])
        raise CorruptRecordError(f"unknown compression type id {codec}", position=where, path=path)
    fields: dict[str, Any]
    if magic >= 2:
        base_seq = int(h.base_sequence[i])
        last_seq = -1 if base_seq == -1 else increment_sequence(base_seq, int(h.last_offset_delta[i]))
        fields = {
            "baseOffset": int(h.base_offset[i]),
            "lastOffset": int(e.last_offset[i]),
            "count": int(h.records_count[i]),
            "baseSequence": base_seq,
            "lastSequence": last_seq,
            "producerId": int(h.producer_id[i]),
            "producerEpoch": int(h.producer_epoch[i]),
            "partitionLeaderEpoch": int(h.partition_leader_epoch[i]),
            "isTransactional": bool(attrs & 0x10),
            "isControl": bool(attrs & 0x20),
            "deleteHorizonMs": int(h.base_timestamp[i]) if attrs & 0x40 else None,
        }
    else:
        fields = {"offset": int(e.last_offset[i])}
    fields.update(
        position=int(h.position[i]),
        timestampType=timestamp_type(magic, attrs),
        maxTimestamp=int(h.max_timestamp[i]),
        size=int(h.size[i]),
        magic=magic,
        compresscodec=names[codec],
        crc=int(h.crc[i]),
        isvalid=bool(e.valid[i]),
    )
    return fields


def batch_line(fields: dict[str, Any]) -> str:
    """The line Kafka prints for a batch, from its :func:`batch_fields`."""
    parts = []
    for name, value in fields.items():
        if name == "timestampType":
            continue
        if name == "maxTimestamp":
            parts.append(f"{fields['timestampType']}: {value}")
        elif name == "deleteHorizonMs":
            parts.append(f"{name}: {'OptionalLong.empty' if value is None else f'OptionalLong[{value}]'}")
        else:
            parts.append(f"{name}: {java_bool(value) if isinstance(value, bool) else value}")
    return " ".join(parts)


def decode_prefix(
    data: np.ndarray, start: int, end: int, path: str
) -> tuple[records.RecordSet, CorruptRecordError | None]:
    """Decode the entries in ``data[start:end]``; on a corrupt entry, those before it and the error."""
    error = None
    while True:
        try:
            return records.decode(data, verify_crc=False, path=path, start=start, end=end), error
        except CorruptRecordError as e:
            error, end = e, max(start, int(e.position or start))


class Chunks:
    """Records of consecutive batches, decoded ``DECODE_CHUNK`` bytes at a time (bounded memory)."""

    def __init__(self, data: np.ndarray, h: BatchHeaders, path: str):
        self.data, self.h, self.path = data, h, path
        self.ends = h.position + h.size
        self.lo = self.hi = 0  # batches [lo, hi) are decoded in rs
        self.rs: records.RecordSet | None = None
        self.bounds = np.zeros(1, np.int64)
        self.error: CorruptRecordError | None = None  # for batch hi, when set

    def rows(self, i: int) -> tuple[records.RecordSet, slice]:
        """The decoded records of batch ``i`` (batches are asked for in order)."""
        if i >= self.hi:
            if self.error is not None:
                raise self.error
            start = int(self.h.position[i])
            last = max(i + 1, int(np.searchsorted(self.ends, start + DECODE_CHUNK, side="right")))
            self.rs, self.error = decode_prefix(self.data, start, int(self.ends[last - 1]), self.path)
            self.lo, self.hi = i, i + len(self.rs.batches)
            self.bounds = np.searchsorted(self.rs.batch_index, np.arange(self.hi - self.lo + 1))
            if i >= self.hi and self.error is not None:
                raise self.error
        assert self.rs is not None
        return self.rs, slice(int(self.bounds[i - self.lo]), int(self.bounds[i - self.lo + 1]))


def legacy_inner(data: np.ndarray, pos: int, magic: int, codec: int) -> list[tuple[int, bool]]:
    """(stored crc, crc valid) of each message inside a compressed legacy wrapper."""
    mv = data.data
    p = pos + (LEGACY_V1 if magic == 1 else LEGACY_V0).size
    p += LENGTH.size + max(LENGTH.unpack_from(mv, p)[0], 0)
    size = LENGTH.unpack_from(mv, p)[0]
    raw = compression.decompress(codec, mv[p + 4 : p + 4 + size], magic=magic)
    out, q = [], 0
    while q + 16 <= len(raw):
        msg_size = LENGTH.unpack_from(raw, q + 8)[0]
        crc = struct.unpack_from(">I", raw, q + 12)[0]
        out.append((crc, msg_size >= 14 and zlib.crc32(raw[q + 16 : q + 12 + msg_size]) == crc))
        q += 12 + max(msg_size, 0)
    return out


def record_fields(
    e: Entries, i: int, chunks: Chunks, tracker: OffsetTracker, *, data: bool, metadata: bool = True
) -> Iterator[dict[str, Any]]:
    """The fields Kafka prints for each record of entry ``i`` (with ``data``, its ``key`` and
    ``payload`` as bytes, absent when null; never for control records), in its order; each
    record's offset is shown to ``tracker``."""
    rs, rows = chunks.rows(i)
    h = e.headers
    magic, attrs = int(h.magic[i]), int(h.attributes[i])
    is_control = magic >= 2 and bool(attrs & 0x20)
    ts_type = timestamp_type(magic, attrs)
    t = rs.records.slice(rows.start, rows.stop - rows.start).to_pydict()
    legacy: list[tuple[int, bool]] = []
    if magic < 2:
        codec = attrs & 0x07
        if codec == 0:  # the record is the entry itself
            legacy = [(int(h.crc[i]), bool(e.valid[i]))]
        else:
            legacy = legacy_inner(chunks.data, int(h.position[i]), magic, codec)
    base_offset, base_seq = int(h.base_offset[i]), int(h.base_sequence[i])
    for r, (offset, ts, key, value, headers) in enumerate(
        zip(t["offset"], t["timestamp"], t["key"], t["value"], t["headers"], strict=True)
    ):
        tracker.see(offset)
        fields: dict[str, Any] = {}
        if metadata:
            fields = {
                "offset": offset,
                "timestampType": ts_type,
                "timestamp": ts,
                "keySize": -1 if key is None else len(key),
                "valueSize": -1 if value is None else len(value),
            }
            if magic >= 2:
                seq = increment_sequence(base_seq, offset - base_offset) if base_seq >= 0 else -1
                fields["sequence"] = seq
                fields["headerKeys"] = [hd["key"] for hd in headers]
            elif r < len(legacy):
                fields["isValid"], fields["crc"] = legacy[r][1], legacy[r][0]
            if is_control:
                fields.update(control_fields(key, value, int(h.position[i])))
        if data and not is_control:
            if key is not None:
                fields["key"] = key
            if value is not None:
                fields["payload"] = value
        yield fields


def record_line(fields: dict[str, Any]) -> str:
    """The ``| offset: …`` line Kafka prints for a record, from its :func:`record_fields`."""
    prefix, line = "| ", ""
    if "offset" in fields:
        line = (
            f"| offset: {fields['offset']} {fields['timestampType']}: {fields['timestamp']} "
            f"keySize: {fields['keySize']} valueSize: {fields['valueSize']}"
        )
        prefix = " "
        if "sequence" in fields:
            line += f" sequence: {fields['sequence']} headerKeys: [{','.join(fields['headerKeys'])}]"
        elif "isValid" in fields:
            line += f" isValid: {java_bool(fields['isValid'])} crc: {fields['crc']}}}"
        if "endTxnMarker" in fields:
            line += f" endTxnMarker: {fields['endTxnMarker']} coordinatorEpoch: {fields['coordinatorEpoch']}"
        elif "controlType" in fields:
            line += f" controlType: {fields['controlType']}({fields['controlTypeId']})"
    if "key" in fields:
        line += f"{prefix}key: {fields['key'].decode('utf-8', 'replace')}"
    if "payload" in fields:
        line += f" payload: {fields['payload'].decode('utf-8', 'replace')}"
    return line


def control_fields(key: bytes | None, value: bytes | None, position: int) -> dict[str, Any]:
    control_type(key, position=position)  # raises on a short key or a negative version
    assert key is not None
    type_id = CONTROL_KEY.unpack_from(key)[1]
    name = CONTROL_TYPES.get(type_id, "UNKNOWN")
    if name in ("ABORT", "COMMIT"):
        version, epoch = end_txn_marker(value, position=position)
        if version < 0:
            raise CorruptRecordError(
                f"invalid version {version} found for end transaction marker", position=position
            )
        return {"endTxnMarker": name, "coordinatorEpoch": epoch}
    return {"controlType": name, "controlTypeId": type_id}
