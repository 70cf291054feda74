"""Produce and InitProducerId: the handlers of appends over the wire.

A Produce request's record sets are checked (:mod:`~pylog.server.records`, and the producer
state of :mod:`~pylog.server.producers`) and appended, as the clients encoded them, with the next
group commit of the store; the response comes once the commit is durable (``acks`` 1 and -1
alike: the one node is every replica), and not at all for ``acks=0``.  Transactional producers
(``transactional.id``) are refused: the transaction coordinator's APIs are not served.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, error_for, make, partitions_of, response_module
from pylog.server.node import Node
from pylog.server.store import Key
from pylog.storage.errors import DuplicateBatchError, RecordSetError
from pylog.storage.partition.log import AppendInfo

log = logging.getLogger("pylog.server")


# ---------------------------------------------------------------------------- Produce


async def handle_produce(node: Node, req: Request) -> Any:
    body = req.body
    root = node.root
    mod = response_module(req)
    sets: dict[Key, Any] = {}
    refused: dict[Key, tuple[ErrorCode, str | None]] = {}
    for topic in body.topic_data:
        parts = partitions_of(root, topic.name)
        for pd in topic.partition_data:
            key = (topic.name, int(pd.index))
            if body.transactional_id is not None:
                refused[key] = (
                    ErrorCode.transactional_id_authorization_failed,
                    "transactions are not served",
                )
            elif not 0 <= pd.index < parts:
                refused[key] = (ErrorCode.unknown_topic_or_partition, None)
            elif pd.records is None or not len(pd.records):
                refused[key] = (ErrorCode.corrupt_message, "no records")
            else:
                sets[key] = bytes(pd.records)
    pending = node.store.append(sets) if sets else None  # queued now: in request order
    if body.acks == 0:
        if pending is not None:
            asyncio.ensure_future(pending).add_done_callback(_log_unacknowledged)
        return None
    results = await pending if pending is not None else {}
    responses = []
    for topic in body.topic_data:
        answers = []
        for pd in topic.partition_data:
            key = (topic.name, int(pd.index))
            answers.append(_partition_response(node, mod, key, refused.get(key), results.get(key)))
        responses.append(
            make(mod, "TopicProduceResponse", name=topic.name, partition_responses=tuple(answers))
        )
    return make(mod, "ProduceResponse", responses=tuple(responses))


def _partition_response(
    node: Node, mod: Any, key: Key, refused: tuple[ErrorCode, str | None] | None, got: Any
) -> Any:
    code, message, base, append_time = ErrorCode.none, None, -1, None
    if refused is not None:
        code, message = refused
    elif isinstance(got, DuplicateBatchError):
        base = got.base_offset
    elif isinstance(got, RecordSetError):
        code, message = ErrorCode(got.code), str(got)
    elif isinstance(got, BaseException):
        code, message = error_for(got), str(got)
        log.warning("produce to %s-%s failed: %r", key[0], key[1], got)
    elif isinstance(got, AppendInfo):
        base = got.first_offset
        if node.root.config(key[0]).message_timestamp_type == "LogAppendTime":  # the time stamped
            append_time = dt.datetime.fromtimestamp(got.max_timestamp / 1000, tz=dt.timezone.utc)
    start = -1
    if code == ErrorCode.none:
        try:
            start = node.root.log_start_offset(*key)
        except Exception:  # the answer goes out without it
            start = -1
    return make(
        mod,
        "PartitionProduceResponse",
        index=key[1],
        error_code=code,
        base_offset=base,
        log_append_time=append_time,
        log_start_offset=start,
        record_errors=(),
        error_message=message,
    )


def _log_unacknowledged(fut: asyncio.Future[Any]) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        log.warning("an acks=0 produce failed: %s", exc)
        return
    for key, got in fut.result().items():
        if isinstance(got, BaseException) and not isinstance(got, DuplicateBatchError):
            log.warning("an acks=0 produce to %s-%s failed: %s", key[0], key[1], got)


# ---------------------------------------------------------------------------- InitProducerId


async def handle_init_producer_id(node: Node, req: Request) -> Any:
    mod = response_module(req)
    body = req.body
    if body.transactional_id is not None:
        return make(
            mod,
            "InitProducerIdResponse",
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    pid, epoch = node.producers.new_id(), 0
    if getattr(body, "producer_id", -1) >= 0:  # KIP-360: the producer asks for a bumped epoch
        pid, epoch = int(body.producer_id), int(body.producer_epoch) + 1
    return make(
        mod, "InitProducerIdResponse", error_code=ErrorCode.none, producer_id=pid, producer_epoch=epoch
    )
