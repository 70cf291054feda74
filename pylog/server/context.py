"""What every request handler gets: the server's state, the request, and a way to build the
response of the request's API version."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server import protocol
from pylog.server.protocol import RequestHeader
from pylog.storage.errors import (
    CorruptRecordError,
    DamagedLogError,
    OffsetOutOfRangeError,
    PylogError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicError,
)
from pylog.storage.root.manager import Root

NO_THROTTLE = dt.timedelta(0)


@dataclass
class Request:
    header: RequestHeader
    body: Any
    client_host: str

    @property
    def version(self) -> int:
        return self.header.api_version


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def make(module: Any, cls_name: str, /, **values: Any) -> Any:
    """``module.name(**values)`` without the values that this version of the message lacks
    (fields come and go between versions; handlers give every field any version has)."""
    cls = getattr(module, cls_name)
    names = _field_names(cls)
    if "throttle_time" in names and "throttle_time" not in values:
        values["throttle_time"] = NO_THROTTLE
    return cls(**{k: v for k, v in values.items() if k in names})


def response_module(req: Request) -> Any:
    return protocol.response_module(req.header.api_key, req.header.api_version)


def millis(value: Any) -> int:
    """A kio duration field (a timedelta) in milliseconds."""
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def error_for(exc: BaseException) -> ErrorCode:
    """Kafka's error code for an error of pylog's storage."""
    if isinstance(exc, UnknownTopicError):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, OffsetOutOfRangeError):
        return ErrorCode.offset_out_of_range
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.message_too_large
    if isinstance(exc, CorruptRecordError):
        return ErrorCode.corrupt_message
    if isinstance(exc, DamagedLogError | StorageError | OSError):
        return ErrorCode.kafka_storage_error
    if isinstance(exc, PylogError):
        return ErrorCode.unknown_server_error
    return ErrorCode.unknown_server_error


def partitions_of(root: Root, topic: str) -> int:
    """The partitions of ``topic``, 0 if there is no such topic (one lookup of the topics' map,
    safe beside the storage thread that changes it; ``root.topics()`` iterates it)."""
    try:
        return root.partitions(topic)
    except UnknownTopicError:
        return 0
