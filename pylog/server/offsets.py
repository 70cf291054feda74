"""OffsetCommit and OffsetFetch: the handlers over the groups' committed offsets
(:mod:`~pylog.server.committed`, durable in the root)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, error_for, make, partitions_of, response_module
from pylog.server.node import Node
from pylog.server.store import Key


async def handle_offset_commit(node: Node, req: Request) -> Any:
    body = req.body
    mod = response_module(req)
    generation = int(getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1)))
    group_error = node.coordinator.check_commit(body.group_id, body.member_id, generation)
    root = node.root
    codes: dict[Key, ErrorCode] = {}
    offsets: dict[Key, tuple[int, str]] = {}
    for t in body.topics:
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            if group_error != ErrorCode.none:
                codes[key] = group_error
            elif not 0 <= key[1] < partitions_of(root, t.name):
                codes[key] = ErrorCode.unknown_topic_or_partition
            else:
                codes[key] = ErrorCode.none
                offsets[key] = (int(p.committed_offset), p.committed_metadata or "")
    if offsets:
        try:
            await node.committed.commit(body.group_id, offsets)
        except Exception as e:
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


def _fetch_group(node: Node, mod: Any, group: str, topics: Any, names: tuple[str, str, str]) -> list[Any]:
    topic_cls, part_cls, _ = names
    committed = node.committed.groups.get(group, {})
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


async def handle_offset_fetch(node: Node, req: Request) -> Any:
    mod = response_module(req)
    body = req.body
    await node.committed.settled()
    if req.version >= 8:
        names = ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", "")
        groups = tuple(
            make(
                mod,
                "OffsetFetchResponseGroup",
                group_id=g.group_id,
                topics=tuple(_fetch_group(node, mod, g.group_id, g.topics, names)),
                error_code=ErrorCode.none,
            )
            for g in body.groups
        )
        return make(mod, "OffsetFetchResponse", groups=groups)
    names = ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition", "")
    return make(
        mod,
        "OffsetFetchResponse",
        topics=tuple(_fetch_group(node, mod, body.group_id, body.topics, names)),
        error_code=ErrorCode.none,
    )
