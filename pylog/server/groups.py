"""The group APIs' handlers: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups and
DescribeGroups over the coordinator's state (:mod:`~pylog.server.coordinator`)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, make, response_module
from pylog.server.coordinator import EMPTY, STABLE
from pylog.server.node import Node

# ---------------------------------------------------------------------------- handlers


async def handle_join_group(node: Node, req: Request) -> Any:
    mod = response_module(req)
    r = await node.coordinator.join(req)
    return make(
        mod,
        "JoinGroupResponse",
        error_code=r.error,
        generation_id=r.generation,
        protocol_type=r.protocol_type,
        protocol_name=r.protocol_name if r.protocol_name is not None else ("" if req.version < 7 else None),
        leader=r.leader,
        skip_assignment=False,
        member_id=r.member_id,
        members=tuple(
            make(mod, "JoinGroupResponseMember", member_id=mid, group_instance_id=iid, metadata=meta)
            for mid, iid, meta in r.members
        ),
    )


async def handle_sync_group(node: Node, req: Request) -> Any:
    mod = response_module(req)
    b = req.body
    code, assignment = await node.coordinator.sync(b.group_id, b.generation_id, b.member_id, b.assignments)
    g = node.coordinator.groups.get(b.group_id)
    return make(
        mod,
        "SyncGroupResponse",
        error_code=code,
        protocol_type=g.protocol_type if g else None,
        protocol_name=g.protocol_name if g else None,
        assignment=assignment,
    )


async def handle_heartbeat(node: Node, req: Request) -> Any:
    b = req.body
    code = node.coordinator.heartbeat(b.group_id, b.generation_id, b.member_id)
    return make(response_module(req), "HeartbeatResponse", error_code=code)


async def handle_leave_group(node: Node, req: Request) -> Any:
    mod = response_module(req)
    b = req.body
    if req.version < 3:
        code = node.coordinator.leave(b.group_id, [b.member_id])[b.member_id]
        return make(mod, "LeaveGroupResponse", error_code=code)
    results = node.coordinator.leave(b.group_id, [m.member_id for m in b.members])
    return make(
        mod,
        "LeaveGroupResponse",
        error_code=ErrorCode.none,
        members=tuple(
            make(
                mod,
                "MemberResponse",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=results[m.member_id],
            )
            for m in b.members
        ),
    )


async def handle_list_groups(node: Node, req: Request) -> Any:
    mod = response_module(req)
    coord = node.coordinator
    names = set(coord.groups) | set(node.committed.groups)
    states = set(getattr(req.body, "states_filter", ()) or ())
    listed = []
    for name in sorted(names):
        g = coord.groups.get(name)
        state = g.state if g else EMPTY
        if states and state not in states:
            continue
        listed.append(
            make(
                mod,
                "ListedGroup",
                group_id=name,
                protocol_type=(g.protocol_type if g and g.protocol_type else "consumer"),
                group_state=state,
                group_type="classic",
            )
        )
    return make(mod, "ListGroupsResponse", error_code=ErrorCode.none, groups=tuple(listed))


async def handle_describe_groups(node: Node, req: Request) -> Any:
    mod = response_module(req)
    coord = node.coordinator
    out = []
    for name in req.body.groups:
        g = coord.groups.get(name)
        if g is None:
            state = EMPTY if name in node.committed.groups else "Dead"
            out.append(
                make(
                    mod, "DescribedGroup", error_code=ErrorCode.none, group_id=name, group_state=state,
                    protocol_type="", protocol_data="", members=(),
                )
            )  # fmt: skip
            continue
        members = tuple(
            make(
                mod,
                "DescribedGroupMember",
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.host,
                member_metadata=m.metadata(g.protocol_name or "") if g.state == STABLE else b"",
                member_assignment=m.assignment if g.state == STABLE else b"",
            )
            for m in g.members.values()
        )
        out.append(
            make(
                mod,
                "DescribedGroup",
                error_code=ErrorCode.none,
                group_id=name,
                group_state=g.state,
                protocol_type=g.protocol_type or "",
                protocol_data=g.protocol_name or "",
                members=members,
            )
        )
    return make(mod, "DescribeGroupsResponse", groups=tuple(out))
