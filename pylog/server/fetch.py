"""Fetch, ListOffsets and OffsetForLeaderEpoch: reading a root over the wire.

Fetch returns, per partition, whole batches from the one holding the fetch offset (a client
skips the records before its offset) up to the high watermark — or, with
``isolation_level=read_committed`` (librdkafka's default), up to the last stable offset, with
the aborted transactions of what it returns so the client drops their records.  Limits are
Kafka's (KIP-74): ``partition_max_bytes`` per partition and ``max_bytes`` per response, except
that the first batch of the first partition with data is returned whole whatever its size, so a
large batch never blocks a consumer.  One segment is read per partition and request.

A fetch with less than ``min_bytes`` waits, up to ``max_wait``, for an append to one of its
partitions: the store wakes it right after the commit, with no polling.

Fetch sessions (KIP-227) are not kept: every response has session id 0, which tells clients to
send full fetch requests.  The cluster has one leader epoch, 0.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, error_for, make, millis, response_module
from pylog.server.node import Node
from pylog.server.protocol import FileRange, Spliced, Splices
from pylog.server.records import cut_below
from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec._kernels_src import AT_LAST_DELTA
from pylog.storage.errors import PylogError
from pylog.storage.partition import producer_state
from pylog.storage.partition.log import Log

READ_COMMITTED = 1
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -2, -1, -3, -4


@dataclass
class PartitionRead:
    topic: str
    partition: int
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes | memoryview | FileRange = b""
    aborted: tuple[tuple[int, int], ...] | None = None


def _bounds(node: Node, topic: str, partition: int) -> tuple[Any, int, int]:
    """(log, high watermark, log start offset) of a partition; raises for an unknown one."""
    root = node.root
    lg = root.log(topic, partition)
    hw = root.high_watermark(topic, partition)
    hw = lg.log_end_offset if hw is None else min(hw, lg.log_end_offset)
    return lg, hw, lg.log_start_offset


def _known(node: Node, topic: str, partition: int) -> bool:
    root = node.root
    return topic in root.topics() and 0 <= partition < root.partitions(topic)


def read_partitions(
    node: Node, wanted: list[tuple[str, int, int, int]], max_bytes: int, isolation: int
) -> list[PartitionRead]:
    """On the storage thread: what a fetch of ``wanted`` (topic, partition, offset, max bytes)
    returns now."""
    out: list[PartitionRead] = []
    budget = max_bytes
    for topic, partition, offset, part_max in wanted:
        r = PartitionRead(topic, partition)
        out.append(r)
        if not _known(node, topic, partition):
            r.error = ErrorCode.unknown_topic_or_partition
            continue
        try:
            lg, hw, start = _bounds(node, topic, partition)
            lso = producer_state.last_stable_offset(lg) if isolation == READ_COMMITTED else hw
            r.high_watermark, r.last_stable_offset, r.log_start_offset = hw, lso, start
            if offset < start or offset > hw:
                r.error = ErrorCode.offset_out_of_range
                continue
            bound = lso if isolation == READ_COMMITTED else hw
            if offset >= bound or (budget <= 0 and any(len(o.records) for o in out)):
                continue
            limit = max(1, min(part_max, budget))
            data = _file_range(lg, offset, limit, bound)
            if data is None:
                _, read = lg.read(offset, limit, max_offset=bound)
                data = cut_below(read, bound)
            if len(data) and len(data) > limit and any(len(o.records) for o in out[:-1]):
                continue  # only the first partition with data goes over the limits (KIP-74)
            r.records = data
            budget -= len(data)
            if isolation == READ_COMMITTED and len(data):
                pids, firsts, _ = producer_state.aborted_transactions(lg, offset, bound)
                r.aborted = tuple(zip(pids.tolist(), firsts.tolist(), strict=True))
            elif isolation == READ_COMMITTED:
                r.aborted = ()
        except PylogError as e:
            r.error = error_for(e)
            r.records = b""
    return out


_BATCH_HEAD = struct.Struct(">q")
_LAST_DELTA = struct.Struct(">i")


def _file_range(lg: Log, offset: int, limit: int, bound: int) -> FileRange | memoryview | None:
    """On local disk, the whole batches a fetch of ``offset`` returns as a range of their segment
    file, sent with ``sendfile`` (as Kafka does): only the first batch is read, to find where the
    range starts; it ends at the segment's end or at the batch the offset index places last
    within ``limit`` bytes.  A range under ``SPLICE_MIN`` is read (its bytes).  None (read the
    batches to cut them) wherever the cut would need them: the segment holds offsets at or above
    ``bound`` (not acknowledged yet, or past the last stable offset), the first batch alone
    exceeds ``limit`` (KIP-74), no index entry falls within the limit, or the entry does not
    point at the batch it names."""
    storage = lg.storage
    if not isinstance(storage, LocalStorage):
        return None
    pos, first = lg.read(offset, 1, max_offset=bound)
    if not len(first):
        return None
    segs = lg.segments
    base = _BATCH_HEAD.unpack_from(first)[0]
    i = bisect.bisect_right(segs, base, key=lambda seg: seg.base_offset) - 1
    seg = segs[i]
    if bound < (segs[i + 1].base_offset if i + 1 < len(segs) else lg.log_end_offset):
        return None
    end = seg.size
    if pos + limit < end:
        entry, end = seg.offset_index.lookup(_MAX_OFFSET, max_position=pos + limit + 1)
        if end <= pos:
            return None
        head = storage.read(seg.log_path, end, end + AT_LAST_DELTA + 4)
        if len(head) < AT_LAST_DELTA + 4 or (
            _BATCH_HEAD.unpack_from(head)[0] + _LAST_DELTA.unpack_from(head, AT_LAST_DELTA)[0] != entry
        ):
            return None
    if end - pos < SPLICE_MIN:
        return first if end - pos == len(first) else memoryview(storage.read(seg.log_path, pos, end))
    try:
        file = open(storage.resolve(seg.log_path), "rb", buffering=0)  # noqa: SIM115 - sent, then closed
    except OSError:
        return None
    return FileRange(file, pos, end - pos)


_MAX_OFFSET = (1 << 63) - 1


async def handle_fetch(node: Node, req: Request) -> Any:
    body = req.body
    mod = response_module(req)
    if getattr(body, "session_id", 0):
        return make(
            mod, "FetchResponse", error_code=ErrorCode.fetch_session_id_not_found, session_id=0, responses=()
        )
    wanted = [
        (t.topic, int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes))
        for t in body.topics
        for p in t.partitions
    ]
    keys = [(t, p) for t, p, _, _ in wanted]
    isolation = int(getattr(body, "isolation_level", 0))
    max_bytes = int(getattr(body, "max_bytes", 0x7FFFFFFF))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0, millis(body.max_wait)) / 1000
    store = node.store
    read = functools.partial(read_partitions, node, wanted, max_bytes, isolation)
    reads: list[PartitionRead] | None = None
    while True:
        waiter = store.waiter(keys, read)  # woken by a commit with what read() returned after it
        try:
            if reads is None:
                reads = await store.call(read)
            total = sum(len(r.records) for r in reads)
            remaining = deadline - loop.time()
            errors = any(r.error != ErrorCode.none for r in reads)
            if total >= body.min_bytes or errors or remaining <= 0 or node.stopping.is_set():
                break
            reads = None
            with contextlib.suppress(asyncio.TimeoutError):
                reads = await asyncio.wait_for(asyncio.shield(waiter), remaining)
        finally:
            store.forget(waiter, keys)
    return _response(mod, reads)


SPLICE_MIN = 16 << 10
"""Records of at least this many bytes go out from the buffer they were read into, not copied
into the encoded response (:class:`~pylog.server.protocol.Splices`)."""


def _response(mod: Any, reads: list[PartitionRead]) -> Any:
    topics: dict[str, list[Any]] = {}
    splices = Splices()
    for r in reads:
        aborted = None
        if r.aborted is not None:
            aborted = tuple(
                make(mod, "AbortedTransaction", producer_id=p, first_offset=f) for p, f in r.aborted
            )
        topics.setdefault(r.topic, []).append(
            make(
                mod,
                "PartitionData",
                partition_index=r.partition,
                error_code=r.error,
                high_watermark=r.high_watermark,
                last_stable_offset=r.last_stable_offset,
                log_start_offset=r.log_start_offset,
                aborted_transactions=aborted,
                preferred_read_replica=-1,
                records=(
                    splices.mark(r.records)
                    if isinstance(r.records, FileRange) or len(r.records) >= SPLICE_MIN
                    else bytes(r.records)
                ),
            )
        )
    body = make(
        mod,
        "FetchResponse",
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            make(mod, "FetchableTopicResponse", topic=t, partitions=tuple(ps)) for t, ps in topics.items()
        ),
    )
    return Spliced(body, splices) if splices.data else body


# ---------------------------------------------------------------------------- ListOffsets


def _list_one(
    node: Node, topic: str, partition: int, timestamp: int, isolation: int
) -> tuple[ErrorCode, int, int]:
    if not _known(node, topic, partition):
        return ErrorCode.unknown_topic_or_partition, -1, -1
    try:
        lg, hw, start = _bounds(node, topic, partition)
        if timestamp in (EARLIEST, EARLIEST_LOCAL):
            return ErrorCode.none, start, -1
        if timestamp == LATEST:
            end = producer_state.last_stable_offset(lg) if isolation == READ_COMMITTED else hw
            return ErrorCode.none, end, -1
        if timestamp < 0 and timestamp != MAX_TIMESTAMP:
            return ErrorCode.invalid_request, -1, -1
        found = lg.offset_for_timestamp(timestamp)
        if found is None or found.offset >= hw:
            return ErrorCode.none, -1, -1
        return ErrorCode.none, found.offset, found.timestamp
    except PylogError as e:
        return error_for(e), -1, -1


def _list_offsets(
    node: Node, body: Any, isolation: int
) -> list[tuple[str, list[tuple[int, ErrorCode, int, int]]]]:
    out = []
    for t in body.topics:
        rows = []
        for p in t.partitions:
            code, offset, ts = _list_one(node, t.name, int(p.partition_index), int(p.timestamp), isolation)
            rows.append((int(p.partition_index), code, offset, ts))
        out.append((t.name, rows))
    return out


async def handle_list_offsets(node: Node, req: Request) -> Any:
    mod = response_module(req)
    isolation = int(getattr(req.body, "isolation_level", 0))
    found = await node.store.call(_list_offsets, node, req.body, isolation)
    return make(
        mod,
        "ListOffsetsResponse",
        topics=tuple(
            make(
                mod,
                "ListOffsetsTopicResponse",
                name=name,
                partitions=tuple(
                    make(
                        mod,
                        "ListOffsetsPartitionResponse",
                        partition_index=p,
                        error_code=code,
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=0 if code == ErrorCode.none else -1,
                    )
                    for p, code, offset, ts in rows
                ),
            )
            for name, rows in found
        ),
    )


# ---------------------------------------------------------------------------- OffsetForLeaderEpoch


def _epoch_ends(node: Node, body: Any) -> list[tuple[str, list[tuple[int, ErrorCode, int]]]]:
    out = []
    for t in body.topics:
        rows = []
        for p in t.partitions:
            if not _known(node, t.topic, int(p.partition)):
                rows.append((int(p.partition), ErrorCode.unknown_topic_or_partition, -1))
                continue
            try:
                _, hw, _ = _bounds(node, t.topic, int(p.partition))
                rows.append((int(p.partition), ErrorCode.none, hw))
            except PylogError as e:
                rows.append((int(p.partition), error_for(e), -1))
        out.append((t.topic, rows))
    return out


async def handle_offset_for_leader_epoch(node: Node, req: Request) -> Any:
    """One leader epoch (0) for the life of every partition: its end is the log's end."""
    mod = response_module(req)
    found = await node.store.call(_epoch_ends, node, req.body)
    return make(
        mod,
        "OffsetForLeaderEpochResponse",
        topics=tuple(
            make(
                mod,
                "OffsetForLeaderTopicResult",
                topic=name,
                partitions=tuple(
                    make(
                        mod,
                        "EpochEndOffset",
                        error_code=code,
                        partition=p,
                        leader_epoch=0 if code == ErrorCode.none else -1,
                        end_offset=end,
                    )
                    for p, code, end in rows
                ),
            )
            for name, rows in found
        ),
    )
