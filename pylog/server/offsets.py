"""OffsetCommit and OffsetFetch: consumer groups' committed offsets, durable in the root.

Each group's offsets are the file the Spark source writes for its queries,
``pylog-consumer-offsets.<group>`` (Kafka's checkpoint format), so ``pylog describe`` lists Kafka
consumer groups and Spark queries alike, with their lag; the metadata strings committed with
them are kept beside it (``pylog-consumer-metadata.<group>``) and returned by OffsetFetch.
A commit is answered once both files are replaced (atomically, on the store's thread: on an
object store, one commit).  Group ids with characters outside ``[A-Za-z0-9._-]`` are
percent-encoded in the file names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, make, response_module
from pylog.server.store import Key, Store
from pylog.storage.root import consumers

if TYPE_CHECKING:
    from pylog.server.broker import Broker

Committed = dict[Key, tuple[int, str]]


class CommittedOffsets:
    """Every group's committed offsets and metadata, as in the root."""

    def __init__(self, store: Store):
        self.store = store
        self.groups: dict[str, Committed] = {}

    async def load(self) -> None:
        self.groups = await self.store.call(self._read_all)

    def _read_all(self) -> dict[str, Committed]:
        storage = self.store.root.storage
        out: dict[str, Committed] = {}
        for group, offsets in consumers.read_consumer_offsets(storage).items():
            meta = consumers.read_consumer_metadata(storage, group)
            out[group] = {tp: (off, meta.get(tp, "")) for tp, off in offsets.items()}
        return out

    async def commit(self, group: str, offsets: Committed) -> None:
        merged = dict(self.groups.get(group, {}))
        merged.update(offsets)
        await self.store.call(self._write, group, merged)
        self.groups[group] = merged

    def _write(self, group: str, committed: Committed) -> None:
        root = self.store.root

        def write() -> None:
            root.become_writer()
            consumers.write_consumer_metadata(
                root.storage, group, {tp: m for tp, (_, m) in committed.items()}
            )
            consumers.write_consumer_offsets(root.storage, group, {tp: o for tp, (o, _) in committed.items()})

        root.transaction(write)


async def handle_offset_commit(broker: Broker, req: Request) -> Any:
    body = req.body
    mod = response_module(req)
    generation = int(getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1)))
    group_error = broker.coordinator.check_commit(body.group_id, body.member_id, generation)
    root = broker.root
    codes: dict[Key, ErrorCode] = {}
    offsets: dict[Key, tuple[int, str]] = {}
    for t in body.topics:
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            if group_error != ErrorCode.none:
                codes[key] = group_error
            elif t.name not in root.topics() or not 0 <= key[1] < root.partitions(t.name):
                codes[key] = ErrorCode.unknown_topic_or_partition
            else:
                codes[key] = ErrorCode.none
                offsets[key] = (int(p.committed_offset), p.committed_metadata or "")
    if offsets:
        try:
            await broker.committed.commit(body.group_id, offsets)
        except Exception as e:
            from pylog.server.cluster import error_for

            code = error_for(e)
            for key in offsets:
                codes[key] = code
    return make(
        mod,
        "OffsetCommitResponse",
        topics=tuple(
            make(
                mod,
                "OffsetCommitResponseTopic",
                name=t.name,
                partitions=tuple(
                    make(
                        mod,
                        "OffsetCommitResponsePartition",
                        partition_index=p.partition_index,
                        error_code=codes[(t.name, int(p.partition_index))],
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        ),
    )


def _fetch_group(broker: Broker, mod: Any, group: str, topics: Any, names: tuple[str, str, str]) -> list[Any]:
    topic_cls, part_cls, _ = names
    committed = broker.committed.groups.get(group, {})
    if topics is None:  # every partition the group committed
        wanted: dict[str, list[int]] = {}
        for t, p in sorted(committed):
            wanted.setdefault(t, []).append(p)
        pairs = list(wanted.items())
    else:
        pairs = [(t.name, [int(i) for i in t.partition_indexes]) for t in topics]
    out = []
    for name, parts in pairs:
        rows = []
        for p in parts:
            offset, meta = committed.get((name, p), (-1, ""))
            rows.append(
                make(
                    mod,
                    part_cls,
                    partition_index=p,
                    committed_offset=offset,
                    committed_leader_epoch=-1,
                    metadata=meta,
                    error_code=ErrorCode.none,
                )
            )
        out.append(make(mod, topic_cls, name=name, partitions=tuple(rows)))
    return out


async def handle_offset_fetch(broker: Broker, req: Request) -> Any:
    mod = response_module(req)
    body = req.body
    if req.version >= 8:
        names = ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", "")
        groups = tuple(
            make(
                mod,
                "OffsetFetchResponseGroup",
                group_id=g.group_id,
                topics=tuple(_fetch_group(broker, mod, g.group_id, g.topics, names)),
                error_code=ErrorCode.none,
            )
            for g in body.groups
        )
        return make(mod, "OffsetFetchResponse", groups=groups)
    names = ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition", "")
    return make(
        mod,
        "OffsetFetchResponse",
        topics=tuple(_fetch_group(broker, mod, body.group_id, body.topics, names)),
        error_code=ErrorCode.none,
    )
