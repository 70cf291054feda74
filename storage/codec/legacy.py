"""Read-only decoder for legacy (magic 0 and 1) Kafka message sets.

Each legacy message is its own log entry (Kafka ``LegacyRecord`` / ``AbstractLegacyRecordBatch``),
big-endian:

    +-----------+-------------+--------+----------------------------------------------------+
    | byte      | field       | type   | notes                                              |
    +-----------+-------------+--------+----------------------------------------------------+
    |  0        | offset      | int64  | wrapper: offset of its LAST inner message          |
    |  8        | messageSize | int32  | bytes after this field (entry size = this + 12)    |
    | 12        | crc         | uint32 | CRC-32 (IEEE, zlib) of bytes [16, 12+messageSize)  |
    | 16        | magic       | int8   | 0 or 1                                             |
    | 17        | attributes  | int8   | bits 0-2 codec (0 none 1 gzip 2 snappy 3 lz4;      |
    |           |             |        | zstd is illegal), bit 3 timestamp type (v1 only)   |
    | 18        | timestamp   | int64  | magic 1 only                                       |
    | 18 / 26   | keyLength   | int32  | -1 = null key                                      |
    |           | key         | bytes  |                                                    |
    |           | valueLength | int32  | -1 = null value                                    |
    |           | value       | bytes  | wrapper: compressed message set of inner messages  |
    +-----------+-------------+--------+----------------------------------------------------+

messageSize is at least 14 (magic 0) or 22 (magic 1): crc, magic, attributes, [timestamp,]
both length fields.  A compressed message is a *wrapper*: its value decompresses to a message set
of plain inner messages, each with the layout above.  Inner offsets are absolute for magic 0 and
relative (0..n-1) for magic 1, where ``absolute = wrapperOffset - lastInnerOffset + inner``; a
negative base (librdkafka writes wrapper offset 0) leaves the inner offsets as they are, as in
Java's ``DeepRecordsIterator``.  With LogAppendTime on a magic-1 wrapper, the inner messages
take the wrapper's timestamp.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from pylog.storage.codec.compression import decompress
from pylog.storage.errors import CorruptRecordError

__all__ = ["LegacyEntry", "LegacyRecord", "decode_legacy_entry"]

LOG_HEADER = struct.Struct(">qi")  # offset, messageSize
MESSAGE_HEADER_V0 = struct.Struct(">qiIbb")  # offset, messageSize, crc, magic, attributes
MESSAGE_HEADER_V1 = struct.Struct(">qiIbbq")  # ... + timestamp
LENGTH = struct.Struct(">i")  # keyLength / valueLength

LOG_OVERHEAD = LOG_HEADER.size  # 12
MAGIC_POSITION = 16  # byte of the magic inside an entry; the CRC covers [16, end)
RECORD_OVERHEAD_V0 = 14  # crc 4 + magic 1 + attributes 1 + keyLength 4 + valueLength 4
RECORD_OVERHEAD_V1 = 22  # + timestamp 8
_RECORD_OVERHEAD = (RECORD_OVERHEAD_V0, RECORD_OVERHEAD_V1)
_HEADERS = (MESSAGE_HEADER_V0, MESSAGE_HEADER_V1)

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_LEGACY_CODECS = (0, 1, 2, 3)
ZSTD = 4

NO_TIMESTAMP = -1
NO_TIMESTAMP_TYPE = -1
CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Default bound on a wrapper's decompressed size: a little above deflate's maximum expansion
# (~1032:1; snappy and lz4 expand far less), so no valid wrapper is refused, capped so that a
# crafted wrapper cannot make the reader allocate without limit.
MAX_EXPANSION = 1100
MAX_DECOMPRESSED_SIZE = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LegacyRecord:
    """One message as a consumer sees it (an inner message of a wrapper, or a plain message)."""

    offset: int  # absolute offset
    timestamp: int  # ms; -1 for magic 0
    timestamp_type: int  # 0 create time, 1 log-append time, -1 none (magic 0)
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """One outer log entry: a plain message, or a compressed wrapper and its inner messages."""

    position: int  # byte position of the entry in the buffer
    size: int  # 12 + messageSize
    offset: int  # the entry's offset field (a wrapper's is the offset of its last record)
    magic: int
    codec: int
    timestamp_type: int  # -1 for magic 0
    timestamp: int  # -1 for magic 0
    crc: int  # stored CRC
    crc_valid: bool  # the stored CRC matches, and so do those of all inner messages
    key_size: int  # -1 when null
    value_size: int  # -1 when null
    records: tuple[LegacyRecord, ...]


@dataclass(frozen=True, slots=True)
class _Message:
    """The fields of one message, with the key and value as positions into its buffer."""

    offset: int
    size: int  # 12 + messageSize
    crc: int
    crc_valid: bool
    magic: int
    codec: int
    timestamp_type: int
    timestamp: int
    key_pos: int
    key_size: int
    value_pos: int
    value_size: int


class _Malformed(Exception):
    """A problem in one message, before it is anchored at the outer entry's position."""


def decode_legacy_entry(
    buf: memoryview | bytes | bytearray,
    position: int,
    *,
    verify_crc: bool = True,
    max_decompressed_size: int | None = None,
) -> LegacyEntry:
    """Decode the legacy (magic 0/1) log entry at byte ``position`` of ``buf``.

    A compressed wrapper is decompressed and its inner messages are decoded into ``records``.
    Every problem raises :class:`CorruptRecordError` whose ``position`` is ``position``.  With
    ``verify_crc=False`` a CRC mismatch (of the entry or of an inner message) does not raise
    but is reported as ``crc_valid=False``.  ``max_decompressed_size`` bounds a wrapper's
    decompressed value (default: ``MAX_EXPANSION`` × its compressed size, at most
    ``MAX_DECOMPRESSED_SIZE``).
    """
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    view = memoryview(buf)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    elif view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    try:
        msg = _parse_message(view, position, len(view), verify_crc)
        if msg.codec == 0:
            key = _field(view, msg.key_pos, msg.key_size)
            value = _field(view, msg.value_pos, msg.value_size)
            record = LegacyRecord(msg.offset, msg.timestamp, msg.timestamp_type, key, value)
            records: tuple[LegacyRecord, ...] = (record,)
            crc_valid = msg.crc_valid
        else:
            records, inner_valid = _decode_wrapper(view, msg, verify_crc, max_decompressed_size)
            crc_valid = msg.crc_valid and inner_valid
    except _Malformed as exc:
        raise CorruptRecordError(str(exc), position=position) from None
    return LegacyEntry(
        position=position,
        size=msg.size,
        offset=msg.offset,
        magic=msg.magic,
        codec=msg.codec,
        timestamp_type=msg.timestamp_type,
        timestamp=msg.timestamp,
        crc=msg.crc,
        crc_valid=crc_valid,
        key_size=msg.key_size,
        value_size=msg.value_size,
        records=records,
    )


def _field(view: memoryview, pos: int, size: int) -> bytes | None:
    return None if size < 0 else bytes(view[pos : pos + size])


def _parse_message(view: memoryview, pos: int, limit: int, verify_crc: bool) -> _Message:
    """Check and parse the message at ``view[pos:limit]``; raise _Malformed on any problem."""
    left = limit - pos
    if left < LOG_OVERHEAD:
        raise _Malformed(
            f"entry header needs {LOG_OVERHEAD} bytes (offset, messageSize), found only {max(left, 0)}"
        )
    offset, message_size = LOG_HEADER.unpack_from(view, pos)
    if message_size < RECORD_OVERHEAD_V0:
        raise _Malformed(
            f"messageSize {message_size} is below the minimum message overhead "
            f"({RECORD_OVERHEAD_V0} bytes for magic 0, {RECORD_OVERHEAD_V1} for magic 1)"
        )
    size = LOG_OVERHEAD + message_size
    if size > left:
        raise _Malformed(
            f"entry of {LOG_OVERHEAD} + {message_size} bytes extends beyond the buffer: "
            f"only {left} bytes left"
        )
    magic = view[pos + MAGIC_POSITION]
    if magic > 1:
        magic = magic - 256 if magic & 0x80 else magic  # report it as the int8 it is
        raise _Malformed(f"bad magic {magic}: expected 0 or 1 for a legacy message")
    overhead = _RECORD_OVERHEAD[magic]
    if message_size < overhead:
        raise _Malformed(
            f"messageSize {message_size} is below the minimum message overhead for magic "
            f"{magic}: expected at least {overhead} bytes"
        )
    end = pos + size
    stored_crc = _HEADERS[magic].unpack_from(view, pos)[2]
    computed_crc = zlib.crc32(view[pos + MAGIC_POSITION : end])
    crc_valid = stored_crc == computed_crc
    if verify_crc and not crc_valid:
        raise _Malformed(f"CRC mismatch: stored 0x{stored_crc:08x}, computed 0x{computed_crc:08x}")
    if magic == 0:
        attributes = MESSAGE_HEADER_V0.unpack_from(view, pos)[4]
        timestamp, timestamp_type = NO_TIMESTAMP, NO_TIMESTAMP_TYPE
        p = pos + MESSAGE_HEADER_V0.size
    else:
        attributes, timestamp = MESSAGE_HEADER_V1.unpack_from(view, pos)[4:]
        timestamp_type = LOG_APPEND_TIME if attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME
        p = pos + MESSAGE_HEADER_V1.size
    codec = attributes & CODEC_MASK
    if codec not in _LEGACY_CODECS:
        what = "zstd (codec 4)" if codec == ZSTD else f"unknown codec {codec}"
        raise _Malformed(
            f"{what} in a magic {magic} message: expected codec 0-3 "
            "(none, gzip, snappy, lz4); zstd needs magic 2"
        )
    # The fixed overhead guarantees room for both length fields; each length must leave room
    # for what follows it.
    key_size = LENGTH.unpack_from(view, p)[0]
    p += LENGTH.size
    key_pos = p
    p = _skip(key_size, "key", p, end - LENGTH.size, end)
    value_size = LENGTH.unpack_from(view, p)[0]
    p += LENGTH.size
    value_pos = p
    p = _skip(value_size, "value", p, end, end)
    if p != end:
        raise _Malformed(
            f"{end - p} bytes left over inside the message after the value: expected it to "
            f"end at messageSize {message_size}"
        )
    return _Message(
        offset=offset,
        size=size,
        crc=stored_crc,
        crc_valid=crc_valid,
        magic=magic,
        codec=codec,
        timestamp_type=timestamp_type,
        timestamp=timestamp,
        key_pos=key_pos,
        key_size=key_size,
        value_pos=value_pos,
        value_size=value_size,
    )


def _skip(length: int, what: str, p: int, limit: int, end: int) -> int:
    """Position after a field of ``length`` bytes at p, which must not pass ``limit``."""
    if length < -1:
        raise _Malformed(f"{what} length {length}: expected -1 (null) or >= 0")
    if length > 0:
        if length > limit - p:
            raise _Malformed(
                f"{what} length {length} extends beyond the message: "
                f"only {max(limit - p, 0)} bytes left for it ({end - p} to the message end)"
            )
        p += length
    return p


def _decode_wrapper(
    view: memoryview, wrapper: _Message, verify_crc: bool, max_size: int | None
) -> tuple[tuple[LegacyRecord, ...], bool]:
    """Decompress a wrapper's value and decode its inner messages: (records, all CRCs valid)."""
    name = CODEC_NAMES[wrapper.codec]
    if wrapper.value_size < 0:
        raise _Malformed(f"{name} wrapper has a null value: expected a compressed message set")
    compressed = view[wrapper.value_pos : wrapper.value_pos + wrapper.value_size]
    if max_size is None:
        max_size = min(MAX_EXPANSION * len(compressed) + 1024, MAX_DECOMPRESSED_SIZE)
    try:
        data = decompress(wrapper.codec, compressed, magic=wrapper.magic, max_size=max_size)
    except CorruptRecordError as exc:
        where = "" if exc.position is None else f", at byte {exc.position} of it"
        raise _Malformed(
            f"cannot decompress the {name} wrapper value ({len(compressed)} bytes{where}): {exc.reason}"
        ) from None
    inner_view = memoryview(data)

    inner: list[tuple[_Message, bytes | None, bytes | None]] = []
    all_valid = True
    ipos = 0
    while ipos < len(inner_view):
        try:
            msg = _parse_message(inner_view, ipos, len(inner_view), verify_crc)
        except _Malformed as exc:
            raise _Malformed(
                f"inner message at byte {ipos} of the decompressed {name} value: {exc}"
            ) from None
        if msg.codec != 0:
            raise _Malformed(
                f"inner message at byte {ipos} of the decompressed {name} value is itself "
                f"compressed ({CODEC_NAMES[msg.codec]}): expected a plain message"
            )
        all_valid = all_valid and msg.crc_valid
        key = _field(inner_view, msg.key_pos, msg.key_size)
        value = _field(inner_view, msg.value_pos, msg.value_size)
        inner.append((msg, key, value))
        ipos += msg.size
    if not inner:
        raise _Malformed(f"{name} wrapper holds no messages: expected at least one")

    base = -1
    if wrapper.magic > 0:
        base = wrapper.offset - inner[-1][0].offset
    append_time = wrapper.magic > 0 and wrapper.timestamp_type == LOG_APPEND_TIME
    records = []
    for msg, key, value in inner:
        offset = msg.offset + base if base >= 0 else msg.offset
        if msg.magic == 0:
            timestamp, timestamp_type = NO_TIMESTAMP, NO_TIMESTAMP_TYPE
        elif wrapper.magic == 0:
            timestamp, timestamp_type = msg.timestamp, msg.timestamp_type
        elif append_time:
            timestamp, timestamp_type = wrapper.timestamp, LOG_APPEND_TIME
        else:
            timestamp, timestamp_type = msg.timestamp, wrapper.timestamp_type
        records.append(LegacyRecord(offset, timestamp, timestamp_type, key, value))
    return tuple(records), all_valid
