"""The group coordinator's state machine (classic protocol), driven by real request bodies."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")

from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.sync_group.v3.request import SyncGroupRequestAssignment

from pylog.server.context import Request
from pylog.server.coordinator import COMPLETING, EMPTY, STABLE, Coordinator, JoinResult
from pylog.server.protocol import RequestHeader

SESSION = dt.timedelta(seconds=10)
REBALANCE = dt.timedelta(seconds=5)


def join_request(member_id: str = "", protocols: tuple[str, ...] = ("range",)) -> Request:
    body = JoinGroupRequest(
        group_id="g",
        session_timeout=SESSION,
        rebalance_timeout=REBALANCE,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=tuple(JoinGroupRequestProtocol(name=p, metadata=p.encode()) for p in protocols),
    )
    return Request(RequestHeader(11, 5, 1, "client", 0), body, "127.0.0.1")


async def new_member(coord: Coordinator) -> str:
    first = await coord.join(join_request())
    assert first.error == ErrorCode.member_id_required and first.member_id
    return first.member_id


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_a_member_needs_an_id_then_forms_a_generation_and_gets_its_assignment() -> None:
    async def scenario() -> None:
        coord = Coordinator(initial_rebalance_delay_ms=0)
        mid = await new_member(coord)
        joined = await coord.join(join_request(mid))
        assert (joined.error, joined.generation, joined.leader) == (ErrorCode.none, 1, mid)
        assert [m[0] for m in joined.members] == [mid] and joined.protocol_name == "range"
        assert coord.groups["g"].state == COMPLETING
        code, assignment = await coord.sync(
            "g", 1, mid, (SyncGroupRequestAssignment(member_id=mid, assignment=b"A"),)
        )
        assert (code, assignment) == (ErrorCode.none, b"A")
        assert coord.groups["g"].state == STABLE
        assert coord.heartbeat("g", 1, mid) == ErrorCode.none
        assert coord.heartbeat("g", 0, mid) == ErrorCode.illegal_generation
        assert coord.heartbeat("g", 1, "stranger") == ErrorCode.unknown_member_id

    run(scenario())


def test_a_second_member_rebalances_the_group_and_both_get_the_leaders_assignments() -> None:
    async def scenario() -> None:
        coord = Coordinator(initial_rebalance_delay_ms=0)
        a = await new_member(coord)
        first = await coord.join(join_request(a))
        await coord.sync(
            "g", first.generation, a, (SyncGroupRequestAssignment(member_id=a, assignment=b"all"),)
        )
        b = await new_member(coord)
        b_join = asyncio.ensure_future(coord.join(join_request(b)))
        await asyncio.sleep(0)  # b's join is in: the group waits for a to rejoin
        assert coord.heartbeat("g", first.generation, a) == ErrorCode.rebalance_in_progress
        a_join = await coord.join(join_request(a))
        b_result: JoinResult = await b_join
        assert a_join.generation == b_result.generation == first.generation + 1
        assert a_join.leader == a and {m[0] for m in a_join.members} == {a, b} and b_result.members == ()
        gen = a_join.generation
        b_sync = asyncio.ensure_future(coord.sync("g", gen, b, ()))
        await asyncio.sleep(0)
        assert not b_sync.done()  # b waits for the leader's assignments
        plan = (
            SyncGroupRequestAssignment(member_id=a, assignment=b"p0"),
            SyncGroupRequestAssignment(member_id=b, assignment=b"p1"),
        )
        assert await coord.sync("g", gen, a, plan) == (ErrorCode.none, b"p0")
        assert await b_sync == (ErrorCode.none, b"p1")

    run(scenario())


def test_leaving_rebalances_the_rest_and_the_last_one_empties_the_group() -> None:
    async def scenario() -> None:
        coord = Coordinator(initial_rebalance_delay_ms=0)
        a = await new_member(coord)
        b = await new_member(coord)
        a_join = asyncio.ensure_future(coord.join(join_request(a)))
        b_join = asyncio.ensure_future(coord.join(join_request(b)))
        ra, rb = await asyncio.gather(a_join, b_join)
        assert ra.error == rb.error == ErrorCode.none and ra.generation == rb.generation
        assert coord.leave("g", [b]) == {b: ErrorCode.none}
        assert coord.groups["g"].state == "PreparingRebalance"
        again = await coord.join(join_request(a))
        assert again.generation == ra.generation + 1 and [m[0] for m in again.members] == [a]
        assert coord.leave("g", [a, "nobody"]) == {a: ErrorCode.none, "nobody": ErrorCode.unknown_member_id}
        assert coord.groups["g"].state == EMPTY
        assert coord.check_commit("g", "", -1) == ErrorCode.none  # a commit outside the protocol
        assert coord.check_commit("g", a, again.generation) == ErrorCode.unknown_member_id

    run(scenario())


def test_an_unknown_member_id_and_an_incompatible_protocol_are_refused() -> None:
    async def scenario() -> None:
        coord = Coordinator(initial_rebalance_delay_ms=0)
        assert (await coord.join(join_request("made-up"))).error == ErrorCode.unknown_member_id
        a = await new_member(coord)
        await coord.join(join_request(a, ("range",)))
        b = await new_member(coord)
        refused = await coord.join(join_request(b, ("roundrobin",)))
        assert refused.error == ErrorCode.inconsistent_group_protocol

    run(scenario())


def test_the_first_rebalance_of_a_new_group_waits_for_more_members() -> None:
    async def scenario() -> None:
        coord = Coordinator(initial_rebalance_delay_ms=300)
        a, b = await new_member(coord), await new_member(coord)
        a_join = asyncio.ensure_future(coord.join(join_request(a)))
        await asyncio.sleep(0)
        assert not a_join.done()  # the delay holds the first generation open
        rb = await coord.join(join_request(b))
        ra = await a_join
        assert ra.generation == rb.generation == 1 and {m[0] for m in ra.members} == {a, b}

    run(scenario())
