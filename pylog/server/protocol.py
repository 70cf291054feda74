"""Kafka's request and response framing, and the versions this server speaks.

Every request and response on a connection is one frame::

    | bytes | field                                                                     |
    |-------|---------------------------------------------------------------------------|
    | 4     | size of what follows, int32 big-endian                                     |
    | 2     | api_key, int16             (request header v1 / v2)                        |
    | 2     | api_version, int16                                                         |
    | 4     | correlation_id, int32                                                      |
    | 2+n   | client_id, nullable string (int16 length, -1 for null)                      |
    | ...   | tagged fields (header v2, the flexible versions of an API only)             |
    | ...   | the request body, as the API's JSON schema in Kafka's sources says          |

A response frame is the size, the correlation id, tagged fields when the API version is
flexible (response header v1; ApiVersions always answers with header v0), then the body.

The bodies are not written by hand: they are the dataclasses of ``kio``, generated from Kafka's
own JSON message schemas, parsed by its native reader and written by its writer.  This module
holds the one table of what the server speaks (:data:`SUPPORTED`), reads request headers, and
frames responses.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, BinaryIO

from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from pylog.storage.errors import ProtocolError, PylogError

FRAME = struct.Struct(">i")
"""The size in front of every request and response."""
HEADER_FIXED = struct.Struct(">hhi")
"""api_key, api_version, correlation_id: the start of every request header."""
CORRELATION = struct.Struct(">i")

MAX_FRAME = 100 * 1024 * 1024
"""Largest request accepted (Kafka's ``socket.request.max.bytes``); a larger size prefix
closes the connection, as Kafka does."""


# The APIs this server answers: api_key -> (name, min version, max version, first flexible).
# The minimums are Kafka 4's (KIP-896) or lower, so that the exact versions older librdkafka
# releases look for inside the advertised ranges are there; the maximums are the highest
# versions current clients send that kio has schemas for, below those that name topics by id
# (Fetch 13, OffsetCommit/OffsetFetch 10, Produce 13): topics have no ids here (Metadata gives
# the zero id), and clients then stay below those versions.
SUPPORTED: dict[int, tuple[str, int, int, int]] = {
    0: ("Produce", 0, 11, 9),
    1: ("Fetch", 4, 12, 12),
    2: ("ListOffsets", 1, 8, 6),
    3: ("Metadata", 0, 12, 9),
    8: ("OffsetCommit", 2, 9, 8),
    9: ("OffsetFetch", 1, 9, 6),
    10: ("FindCoordinator", 0, 4, 3),
    11: ("JoinGroup", 0, 9, 6),
    12: ("Heartbeat", 0, 4, 4),
    13: ("LeaveGroup", 0, 5, 4),
    14: ("SyncGroup", 0, 5, 4),
    15: ("DescribeGroups", 0, 5, 5),
    16: ("ListGroups", 0, 4, 3),
    18: ("ApiVersions", 0, 4, 3),
    19: ("CreateTopics", 2, 7, 5),
    22: ("InitProducerId", 0, 5, 2),
    23: ("OffsetForLeaderEpoch", 2, 4, 4),
    32: ("DescribeConfigs", 1, 4, 4),
}

API_VERSIONS = 18


def api_name(api_key: int) -> str:
    entry = SUPPORTED.get(api_key)
    return entry[0] if entry else f"api {api_key}"


def flexible(api_key: int, version: int) -> bool:
    return version >= SUPPORTED[api_key][3]


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int
    """Where the body starts in the frame."""


def _read_nullable_string(frame: memoryview, pos: int) -> tuple[str | None, int]:
    if pos + 2 > len(frame):
        raise ProtocolError("truncated request header (client_id)")
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    if n < 0:
        return None, pos
    if pos + n > len(frame):
        raise ProtocolError("truncated request header (client_id)")
    return bytes(frame[pos : pos + n]).decode("utf-8", "replace"), pos + n


def _skip_tagged_fields(frame: memoryview, pos: int) -> int:
    count, pos = _read_uvarint(frame, pos)
    for _ in range(count):
        _, pos = _read_uvarint(frame, pos)  # tag
        size, pos = _read_uvarint(frame, pos)
        pos += size
        if pos > len(frame):
            raise ProtocolError("truncated tagged field in the request header")
    return pos


def _read_uvarint(frame: memoryview, pos: int) -> tuple[int, int]:
    try:
        return _uvarint(frame, pos, len(frame))
    except _Stop:
        raise ProtocolError("bad unsigned varint in the request header") from None


def read_header(frame: memoryview) -> RequestHeader:
    """The header of a request frame (without its size prefix).  For an API this server does not
    speak, or a version outside its range, only the fixed part is read: the caller answers with
    an error (ApiVersions: KIP-511's v0 reply) or closes the connection."""
    if len(frame) < HEADER_FIXED.size:
        raise ProtocolError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation = HEADER_FIXED.unpack_from(frame, 0)
    client_id, pos = _read_nullable_string(frame, HEADER_FIXED.size)
    entry = SUPPORTED.get(api_key)
    if entry is not None and entry[1] <= version <= entry[2] and version >= entry[3]:
        pos = _skip_tagged_fields(frame, pos)  # request header v2
    return RequestHeader(api_key, version, correlation, client_id, pos)


ADVERTISED_ONLY = {0: 3}
"""Versions advertised but refused, as Kafka 4 does (KIP-896, KAFKA-18659): Produce 0-2 (magic 0
and 1 message sets) is inside the advertised range only because librdkafka releases before
2.11.1 turn compression off unless Produce 2 is; no client sends it.  api_key -> first accepted."""


def supported(header: RequestHeader) -> bool:
    entry = SUPPORTED.get(header.api_key)
    lowest = ADVERTISED_ONLY.get(header.api_key, entry[1] if entry else 0)
    return entry is not None and max(entry[1], lowest) <= header.api_version <= entry[2]


@cache
def _request_reader(api_key: int, version: int) -> tuple[type, Callable[..., Any]]:
    cls = load_payload_module(api_key, version, EntityType.request).__dict__[_class_name(api_key, "Request")]
    return cls, entity_reader(cls)


@cache
def response_module(api_key: int, version: int) -> Any:
    """kio's module of one response version: its dataclasses build the response."""
    return load_payload_module(api_key, version, EntityType.response)


@cache
def request_module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.request)


_WRITERS: dict[type, Callable[..., Any]] = {}


def _response_writer(cls: type) -> Callable[..., Any]:
    writer = _WRITERS.get(cls)
    if writer is None:
        writer = _WRITERS[cls] = entity_writer(cls)
    return writer


def _class_name(api_key: int, suffix: str) -> str:
    return SUPPORTED[api_key][0] + suffix


def parse_request(header: RequestHeader, frame: memoryview) -> Any:
    """The body of a supported request as kio's dataclass; a body that does not parse raises
    :class:`ProtocolError` (the connection is closed, as Kafka does)."""
    cls, read = _request_reader(header.api_key, header.api_version)
    if flexible(header.api_key, header.api_version):
        try:
            _walk_entity(cls, frame, header.body_offset, len(frame))
        except _Stop:
            pass  # a truncated body: kio's reader says where
        except ProtocolError as e:
            raise ProtocolError(
                f"{api_name(header.api_key)} v{header.api_version} request does not parse: {e}"
            ) from None
    try:
        body, _size = read(frame, header.body_offset)
    except Exception as e:  # kio's native reader raises several kinds on bad bytes
        raise ProtocolError(
            f"{api_name(header.api_key)} v{header.api_version} request does not parse: {e}"
        ) from e
    return body


# ---------------------------------------------------------------------------- compact arrays
# kio's native reader reserves room for a compact array's declared length before reading its
# entries, and a garbage length (up to 2**32) aborts the process on the failed allocation.  So a
# flexible request's body is first walked by its schema: an array that declares more entries
# than there are bytes left (each takes one at least) is refused before kio reads it.

_FIXED_SIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4,
    "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "timedelta_i64": 8,
    "datetime_i64": 8, "float64": 8, "uuid": 16,
}  # fmt: skip
_Item = tuple[bool, str, Any, bool]
"""(is an array, "fixed" | "bytes" | "entity", its size or class, a nullable entity)"""


class _Stop(Exception):
    """The walk ran off the end of the frame (kio's reader reports the truncation)."""


@cache
def _plan(cls: type) -> tuple[list[_Item], dict[int, _Item]]:
    from dataclasses import fields

    from kio.serial._introspect import EntityField, EntityTupleField, classify_field, is_optional

    inline: list[_Item] = []
    tagged: dict[int, _Item] = {}
    for f in fields(cls):
        kind = classify_field(f)
        tag = f.metadata.get("tag")
        if isinstance(kind, EntityField | EntityTupleField):
            nullable = isinstance(kind, EntityField) and tag is None and is_optional(f)
            item: _Item = (kind.is_array, "entity", kind.type_, nullable)
        elif f.metadata["kafka_type"] in ("string", "bytes", "records"):
            item = (kind.is_array, "bytes", None, False)
        else:
            item = (kind.is_array, "fixed", _FIXED_SIZE[f.metadata["kafka_type"]], False)
        if tag is not None:
            tagged[int(tag)] = item
        elif item[:2] == (False, "fixed") and inline and inline[-1][:2] == (False, "fixed"):
            inline[-1] = (False, "fixed", inline[-1][2] + item[2], False)  # one step for a run
        else:
            inline.append(item)
    return inline, tagged


def _uvarint(frame: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 28:
            raise _Stop
        b = frame[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _walk_entity(cls: type, frame: memoryview, pos: int, end: int) -> int:
    inline, tagged = _plan(cls)
    for item in inline:
        if item[1] == "fixed" and not item[0]:
            pos += item[2]
        else:
            pos = _walk_item(item, frame, pos, end)
    if pos < end and frame[pos] == 0:  # no tagged fields, the usual case
        return pos + 1
    count, pos = _uvarint(frame, pos, end)
    for _ in range(count):
        tag, pos = _uvarint(frame, pos, end)
        size, pos = _uvarint(frame, pos, end)
        if pos + size > end:
            raise _Stop
        known = tagged.get(tag)
        if known is not None:
            _walk_item(known, frame, pos, pos + size)
        pos += size
    return pos


def _walk_item(item: _Item, frame: memoryview, pos: int, end: int) -> int:
    is_array, kind, arg, nullable = item
    n = 1
    if is_array:
        n, pos = _uvarint(frame, pos, end)
        n -= 1  # 0 is a null array
        if n > end - pos:
            raise ProtocolError(f"a compact array of {n} entries in the {end - pos} bytes left")
        if kind == "fixed":
            n, pos = 0, pos + max(n, 0) * arg
    for _ in range(n):
        if kind == "fixed":
            pos += arg
        elif kind == "bytes":
            size, pos = _uvarint(frame, pos, end)
            pos += max(size - 1, 0)
        elif nullable and pos < end and frame[pos] == 0xFF:  # KIP-893: int8 -1, a null struct
            pos += 1
        else:
            pos = _walk_entity(arg, frame, pos + (1 if nullable else 0), end)
        if pos > end:
            raise _Stop
    return pos


@dataclass
class FileRange:
    """``count`` bytes of an open file from ``offset``: a part of a response frame that the broker
    sends with ``sendfile`` (the kernel copies the file's cached pages to the socket; the bytes
    never enter this process).  The file is open from the read on, so a segment deleted or
    replaced after it was read is still sent as it was."""

    file: BinaryIO
    offset: int
    count: int

    def __len__(self) -> int:
        return self.count

    def close(self) -> None:
        self.file.close()


Part = bytes | memoryview | FileRange
Frame = bytes | list[Part]
"""A response frame as sent: its bytes, or its parts in order (a :class:`Spliced` response)."""


class Splices:
    """Large byte fields kept out of a response's encoding (a Fetch response's records): the
    handler puts :meth:`mark`'s 16-byte placeholder in the field and returns a :class:`Spliced`;
    the frame then goes out as the pieces of the encoded response around each placeholder and the
    fields' own buffers, which are never copied into one (Kafka sends them with ``sendfile``)."""

    def __init__(self) -> None:
        self.token = os.urandom(12)
        self.data: list[Part] = []

    def mark(self, data: Part) -> bytes:
        """The placeholder to put in the field that holds ``data``."""
        self.data.append(data)
        return self.token + _INDEX.pack(len(self.data) - 1)


@dataclass(frozen=True)
class Spliced:
    """A response body whose ``bytes``/``records`` fields hold :class:`Splices` placeholders."""

    body: Any
    splices: Splices


_INDEX = struct.Struct(">I")
_LEGACY_BYTES = struct.Struct(">i")


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_frame(header: RequestHeader, body: Any) -> Frame:
    """:func:`encode_response`, or for a :class:`Spliced` body the frame's parts: each
    placeholder (and its length prefix) replaced by its field's buffer and length prefix."""
    if not isinstance(body, Spliced):
        return encode_response(header, body)
    encoded = encode_response(header, body.body)
    compact = flexible(header.api_key, header.api_version)
    token, data = body.splices.token, body.splices.data
    placeholder_prefix = _uvarint_bytes(17) if compact else _LEGACY_BYTES.pack(16)
    parts: list[Part] = []
    size = len(encoded) - FRAME.size
    pos = FRAME.size
    while True:
        at = encoded.find(token, pos)
        if at < 0:
            break
        head = at - len(placeholder_prefix)
        (i,) = _INDEX.unpack_from(encoded, at + len(token))
        if encoded[head:at] != placeholder_prefix or i >= len(data):
            raise PylogError(f"a spliced {api_name(header.api_key)} response lost a placeholder")
        field = data[i]
        prefix = _uvarint_bytes(len(field) + 1) if compact else _LEGACY_BYTES.pack(len(field))
        parts += [encoded[pos:head] + prefix, field]
        size += len(prefix) + len(field) - (at + 16 - head)
        pos = at + 16
    parts.append(encoded[pos:])
    first = parts[0]
    assert isinstance(first, bytes)  # (the encoding's pieces are bytes, the fields come between)
    parts[0] = FRAME.pack(size) + first
    return parts


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """A response frame: size, correlation id, header tagged fields (flexible versions except
    ApiVersions), the body as kio writes it."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(CORRELATION.pack(header.correlation_id))
    if header.api_key != API_VERSIONS and flexible(header.api_key, header.api_version):
        out.write(b"\0")  # no tagged fields
    _response_writer(type(body))(out, body)
    data = out.getbuffer()
    FRAME.pack_into(data, 0, len(data) - 4)
    del data
    return out.getvalue()
