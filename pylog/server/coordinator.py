"""The classic consumer-group protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups,
DescribeGroups (Kafka's ``GroupCoordinator``, for one node).

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable:

- JoinGroup from a new member (v4+) first gets MEMBER_ID_REQUIRED with its member id, and joins
  again with it.  A join starts a rebalance: every known member must join again; the join
  completes when all have and every member id handed out is used (or its session timed out),
  or when the longest rebalance timeout has passed (members that did not rejoin are removed).
  A group's first rebalance waits ``initial_rebalance_delay_ms`` for more members (Kafka's
  ``group.initial.rebalance.delay.ms``) before it completes.
- Completing the join starts a new generation, picks the protocol every member supports (the
  one most members list first), keeps the leader or picks one, and answers every JoinGroup:
  the leader's response lists the members with their metadata.
- SyncGroup: the leader's carries the assignments; every member's SyncGroup is answered with
  its own assignment bytes once the leader's has arrived.
- Heartbeat within the session timeout, or the member is removed and the group rebalances;
  REBALANCE_IN_PROGRESS tells a member to join again.  Stale generations get
  ILLEGAL_GENERATION, unknown members UNKNOWN_MEMBER_ID, also for OffsetCommit.

Group state lives in the server's memory (committed offsets are durable in the root): after a
restart, members join again, as after a coordinator move in Kafka.  Static membership
(``group.instance.id``) is accepted and treated as dynamic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server.context import Request, millis

log = logging.getLogger("pylog.server")

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
INITIAL_REBALANCE_DELAY_MS = 3000
"""Kafka's ``group.initial.rebalance.delay.ms`` default."""


@dataclass
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = field(default_factory=time.monotonic)
    join: asyncio.Future[JoinResult] | None = None
    sync: asyncio.Future[tuple[ErrorCode, bytes]] | None = None

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED, not joined yet (id -> deadline)."""
    timer: asyncio.TimerHandle | None = None
    new_group: bool = True


class Coordinator:
    """Every group of the server (see the module docstring)."""

    def __init__(self, *, initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS):
        self.groups: dict[str, Group] = {}
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms

    def group(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        return g

    # ------------------------------------------------------------------ join

    async def join(self, req: Request) -> JoinResult:
        b = req.body
        if not b.group_id:
            return JoinResult(ErrorCode.invalid_group_id)
        g = self.group(b.group_id)
        session_ms = millis(b.session_timeout)
        rebalance_ms = millis(getattr(b, "rebalance_timeout", b.session_timeout))
        if rebalance_ms <= 0:
            rebalance_ms = session_ms
        protocols = [(p.name, bytes(p.metadata)) for p in b.protocols]
        if not protocols or (
            g.protocol_type is not None and g.members and b.protocol_type != g.protocol_type
        ):
            return JoinResult(ErrorCode.inconsistent_group_protocol)
        if g.members and g.state != EMPTY:
            common = set.intersection(*({n for n, _ in m.protocols} for m in g.members.values()))
            if not common & {n for n, _ in protocols} and b.member_id not in g.members:
                return JoinResult(ErrorCode.inconsistent_group_protocol)
        member_id = b.member_id
        if not member_id:
            member_id = f"{req.header.client_id or 'member'}-{uuid.uuid4()}"
            if req.version >= 4:  # KIP-394: the member joins again with its id
                g.pending[member_id] = time.monotonic() + session_ms / 1000
                return JoinResult(ErrorCode.member_id_required, member_id=member_id)
        elif member_id not in g.members and member_id not in g.pending:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        g.pending.pop(member_id, None)
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = Member(
                member_id,
                getattr(b, "group_instance_id", None),
                req.header.client_id or "",
                req.client_host,
                session_ms,
                rebalance_ms,
                b.protocol_type,
                protocols,
            )
        else:
            m.protocols, m.session_timeout_ms, m.rebalance_timeout_ms = protocols, session_ms, rebalance_ms
        m.last_heartbeat = time.monotonic()
        if m.join is not None and not m.join.done():
            m.join.set_result(JoinResult(ErrorCode.rebalance_in_progress))  # its older join is superseded
        m.join = asyncio.get_running_loop().create_future()
        g.protocol_type = b.protocol_type
        if g.state != PREPARING:
            self._prepare_rebalance(g, f"{member_id} joined")
        self._maybe_complete_join(g)
        return await m.join

    def _prepare_rebalance(self, g: Group, why: str) -> None:
        log.info("group %s: rebalancing (%s)", g.group_id, why)
        if g.state == COMPLETING:  # members waiting for the leader's assignments must join again
            for m in g.members.values():
                if m.sync is not None and not m.sync.done():
                    m.sync.set_result((ErrorCode.rebalance_in_progress, b""))
        g.state = PREPARING
        loop = asyncio.get_running_loop()
        if g.timer is not None:
            g.timer.cancel()
        wait_ms = max([m.rebalance_timeout_ms for m in g.members.values()] or [0])
        if g.new_group:
            wait_ms = min(wait_ms, self.initial_rebalance_delay_ms) if self.initial_rebalance_delay_ms else 0
        g.timer = loop.call_later(wait_ms / 1000, self._complete_join, g)

    def _maybe_complete_join(self, g: Group) -> None:
        if g.state != PREPARING or (g.new_group and self.initial_rebalance_delay_ms):
            return
        # every member joined again, and every member id handed out (MEMBER_ID_REQUIRED) is
        # used, as Kafka's hasAllMembersJoined
        if (
            g.members
            and not g.pending
            and all(m.join is not None and not m.join.done() for m in g.members.values())
        ):
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        if g.state != PREPARING:
            return
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        g.new_group = False
        for mid in [mid for mid, m in g.members.items() if m.join is None or m.join.done()]:
            log.info("group %s: %s did not join in time and was removed", g.group_id, mid)
            del g.members[mid]
        g.generation += 1
        if not g.members:
            g.state, g.protocol_name, g.leader = EMPTY, None, None
            return
        votes: Counter[str] = Counter()
        common = set.intersection(*({n for n, _ in m.protocols} for m in g.members.values()))
        for m in g.members.values():
            first = next((n for n, _ in m.protocols if n in common), None)
            if first is not None:
                votes[first] += 1
        g.protocol_name = votes.most_common(1)[0][0] if votes else None
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        listing = tuple(
            (m.member_id, m.instance_id, m.metadata(g.protocol_name or "")) for m in g.members.values()
        )
        for m in g.members.values():
            m.assignment = b""
            m.last_heartbeat = time.monotonic()
            assert m.join is not None
            m.join.set_result(
                JoinResult(
                    ErrorCode.none,
                    g.generation,
                    g.protocol_type,
                    g.protocol_name,
                    g.leader or "",
                    m.member_id,
                    listing if m.member_id == g.leader else (),
                )
            )
        log.info("group %s: generation %d with %d members", g.group_id, g.generation, len(g.members))

    # ------------------------------------------------------------------ sync, heartbeat, leave

    def _member_error(self, g: Group | None, member_id: str, generation: int) -> ErrorCode:
        if g is None or member_id not in g.members:
            return ErrorCode.unknown_member_id
        if generation != g.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: Any
    ) -> tuple[ErrorCode, bytes]:
        g = self.groups.get(group_id)
        err = self._member_error(g, member_id, generation)
        if err != ErrorCode.none or g is None:
            return err, b""
        m = g.members[member_id]
        m.last_heartbeat = time.monotonic()
        if g.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b""
        if g.state == STABLE:
            return ErrorCode.none, m.assignment
        m.sync = asyncio.get_running_loop().create_future()
        if member_id == g.leader:
            given = {a.member_id: bytes(a.assignment) for a in assignments}
            for other in g.members.values():
                other.assignment = given.get(other.member_id, b"")
            g.state = STABLE
            for other in g.members.values():
                if other.sync is not None and not other.sync.done():
                    other.sync.set_result((ErrorCode.none, other.assignment))
        return await m.sync

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        g = self.groups.get(group_id)
        err = self._member_error(g, member_id, generation)
        if err != ErrorCode.none or g is None:
            return err
        g.members[member_id].last_heartbeat = time.monotonic()
        return ErrorCode.rebalance_in_progress if g.state == PREPARING else ErrorCode.none

    def leave(self, group_id: str, member_ids: list[str]) -> dict[str, ErrorCode]:
        g = self.groups.get(group_id)
        out = {}
        for mid in member_ids:
            if g is None or mid not in g.members:
                out[mid] = ErrorCode.unknown_member_id
                continue
            self._remove(g, mid, "left the group")
            out[mid] = ErrorCode.none
        return out

    def _remove(self, g: Group, member_id: str, why: str) -> None:
        m = g.members.pop(member_id)
        for fut, value in (
            (m.join, JoinResult(ErrorCode.unknown_member_id)),
            (m.sync, (ErrorCode.unknown_member_id, b"")),
        ):
            if fut is not None and not fut.done():
                fut.set_result(value)  # type: ignore[arg-type]
        if g.leader == member_id:
            g.leader = None
        if not g.members:
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
            g.state, g.protocol_name = EMPTY, None
            g.generation += 1
            log.info("group %s: %s %s; the group is empty", g.group_id, member_id, why)
        elif g.state == PREPARING:
            self._maybe_complete_join(g)
        else:
            self._prepare_rebalance(g, f"{member_id} {why}")

    def check_commit(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        """Whether an OffsetCommit may be applied: a commit outside the group protocol
        (generation -1, no member id) always may; a member's only in its generation, and as in
        Kafka also while a rebalance is prepared (a member commits what it processed before it
        rejoins: its partitions' next owner starts there), not while the group awaits the
        leader's assignment."""
        if generation < 0 and not member_id:
            return ErrorCode.none
        g = self.groups.get(group_id)
        err = self._member_error(g, member_id, generation)
        if err == ErrorCode.none and g is not None and g.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        return err

    # ------------------------------------------------------------------ expiry

    async def expire_loop(self) -> None:
        """Remove members whose session timed out (checked every 100 ms)."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for g in list(self.groups.values()):
                for mid, deadline in list(g.pending.items()):
                    if now > deadline:
                        del g.pending[mid]
                        self._maybe_complete_join(g)
                for mid, m in list(g.members.items()):
                    waiting = any(f is not None and not f.done() for f in (m.join, m.sync))
                    if not waiting and now - m.last_heartbeat > m.session_timeout_ms / 1000:
                        with contextlib.suppress(KeyError):
                            self._remove(g, mid, "timed out (session.timeout.ms)")
