"""kafka-python and aiokafka against a real ``pylog serve``: the Python part of the client matrix.

Every test runs a real server process (``serve`` / ``serve_factory``) on 127.0.0.1 and real
clients; nothing is mocked.  What the clients send is compared with what the root holds (the
Python API, ``pylog.open(root, read_only=True)``, and the segment files' batch headers for the
codecs) and with what the clients read back over the wire.  The Spark cross-checks use the
connector tests' local SparkSession (``spark``).

Waiting is always polling for a condition with a generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pytest

import pylog
from pylog.storage.codec import batch as B
from pylog.storage.codec import records as codec_records
from tests.connector import conftest as connector_fixtures

pytest.importorskip("kafka", reason="kafka-python is a dev dependency (pip install '.[dev]')")
pytest.importorskip("aiokafka", reason="aiokafka is a dev dependency (pip install '.[dev]')")

import aiokafka
import aiokafka.admin
import aiokafka.errors
import kafka
import kafka.admin
import kafka.errors

spark = connector_fixtures.spark  # the connector tests' session-wide local SparkSession

DEADLINE_S = 90.0
"""How long any wait for a condition may take (the machine may be loaded)."""
T0 = (int(time.time()) - 3600) * 1000
"""Explicit record timestamps start here: an hour ago (inside the topics' 7-day retention, which
would otherwise delete the records, and before the brokers' limit on future timestamps)."""
CODECS: dict[str | None, int] = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
GROUP_TIMEOUTS: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "max_poll_interval_ms": 30000,
}


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True, order=True)
class Rec:
    """One record as the root stores it and a consumer reads it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    timestamp_type: int = 0
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class Msg:
    """One record to produce (``partition`` None: the client's partitioner picks it)."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = T0
    partition: int | None = None

    def stored_as(self, partition: int, offset: int) -> Rec:
        return Rec(partition, offset, self.key, self.value, self.timestamp, 0, self.headers)


def wait_until(
    cond: Callable[[], bool],
    what: str,
    timeout: float = DEADLINE_S,
    detail: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} {detail()}")
        time.sleep(0.01)


async def async_wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)


def table_recs(t: pa.Table) -> list[Rec]:
    cols = {name: t.column(name).to_pylist() for name in ("partition", "offset", "key", "value")}
    ts = t.column("timestamp").cast(pa.int64()).to_pylist()
    types = t.column("timestampType").to_pylist()
    heads = t.column("headers").to_pylist()
    return sorted(
        Rec(p, o, k, v, s, y, tuple((h["key"], h["value"]) for h in (hs or ())))
        for p, o, k, v, s, y, hs in zip(
            cols["partition"], cols["offset"], cols["key"], cols["value"], ts, types, heads, strict=True
        )
    )


def stored(root: str, topic: str) -> list[Rec]:
    """What the root holds, through the Python API (a reader: no lock, beside the server)."""
    with pylog.open(root, read_only=True) as r:
        return table_recs(r.read_table(topic))


def end_offsets(root: str, topic: str) -> dict[int, int]:
    with pylog.open(root, read_only=True) as r:
        return {p: r.log(topic, p).log_end_offset for p in range(r.partitions(topic))}


def batch_codecs(root: str, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> the compression codec of the stored batch holding it, from the
    segment files' batch headers."""
    out: dict[tuple[int, int], int] = {}
    for d in Path(root).glob(f"{topic}-*"):
        partition = int(d.name.rsplit("-", 1)[1])
        for seg in sorted(d.glob("*.log")):
            data = B.as_uint8(seg.read_bytes())
            sc = B.scan_entries(data)
            h = B.parse_headers(data, sc.position, sc.size, sc.magic)
            for base, last, codec in zip(h.base_offset, h.last_offset, h.codec, strict=True):
                for o in range(int(base), int(last) + 1):
                    out[(partition, o)] = int(codec)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- the two clients


@dataclass
class Read:
    records: list[Rec]
    found: dict[int, tuple[int, int] | None] = field(default_factory=dict)  # offsets_for_times


Start = str | dict[int, int] | int
"""Where a read starts: "earliest", "latest", {partition: offset} (seek), or a timestamp in ms
(offsets_for_times, then seek)."""


class Client(Protocol):
    name: str

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None: ...

    def produce(
        self, bootstrap: str, topic: str, msgs: Sequence[Msg], **config: Any
    ) -> list[tuple[int, int]]: ...

    def read(
        self,
        bootstrap: str,
        topic: str,
        until: dict[int, int],
        start: Start = "earliest",
        *,
        isolation: str = "read_uncommitted",
        positioned: Callable[[], object] | None = None,
    ) -> Read: ...


class KafkaPython:
    """kafka-python 3: blocking clients."""

    name = "kafka-python"

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kp-admin")
        try:
            admin.create_topics([kafka.admin.NewTopic(topic, partitions, 1)])
        finally:
            admin.close()

    def producer(self, bootstrap: str, **config: Any) -> Any:
        return kafka.KafkaProducer(bootstrap_servers=bootstrap, client_id="kp-producer", **config)

    def produce(
        self, bootstrap: str, topic: str, msgs: Sequence[Msg], **config: Any
    ) -> list[tuple[int, int]]:
        p = self.producer(bootstrap, **config)
        try:
            futures = [
                p.send(
                    topic,
                    value=m.value,
                    key=m.key,
                    headers=list(m.headers),
                    partition=m.partition,
                    timestamp_ms=m.timestamp,
                )
                for m in msgs
            ]
            p.flush(timeout=DEADLINE_S)
            metas = [f.get(timeout=DEADLINE_S) for f in futures]
        finally:
            p.close(timeout=DEADLINE_S)
        return [(md.partition, md.offset) for md in metas]

    def consumer(self, bootstrap: str, **config: Any) -> Any:
        config.setdefault("client_id", "kp-consumer")
        return kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)

    def read(
        self,
        bootstrap: str,
        topic: str,
        until: dict[int, int],
        start: Start = "earliest",
        *,
        isolation: str = "read_uncommitted",
        positioned: Callable[[], object] | None = None,
    ) -> Read:
        c = self.consumer(bootstrap, group_id=None, isolation_level=isolation)
        out = Read([])
        try:
            tps = [kafka.TopicPartition(topic, p) for p in sorted(until)]
            c.assign(tps)
            if start == "earliest":
                c.seek_to_beginning(*tps)
            elif start == "latest":
                c.seek_to_end(*tps)
            elif isinstance(start, dict):
                for tp in tps:
                    c.seek(tp, start[tp.partition])
            else:
                found = c.offsets_for_times({tp: start for tp in tps})
                for tp in tps:
                    hit = found[tp]
                    out.found[tp.partition] = None if hit is None else (hit.offset, hit.timestamp)
                    if hit is None:
                        c.seek_to_end(tp)
                    else:
                        c.seek(tp, hit.offset)
            for tp in tps:
                c.position(tp)  # resolves a reset to earliest/latest now
            if positioned is not None:
                positioned()
            deadline = time.monotonic() + DEADLINE_S
            while any(c.position(tp) < until[tp.partition] for tp in tps):
                assert time.monotonic() < deadline, f"{self.name} read stuck at {c.position(tps[0])}"
                for msgs in c.poll(timeout_ms=200).values():
                    out.records += [kp_rec(m) for m in msgs]
        finally:
            c.close()
        return out


def kp_rec(m: Any) -> Rec:
    return Rec(m.partition, m.offset, m.key, m.value, m.timestamp, m.timestamp_type, tuple(m.headers))


class AioKafka:
    """aiokafka 0.14: asyncio clients, each call one event loop (``asyncio.run``)."""

    name = "aiokafka"

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        async def run() -> None:
            admin = aiokafka.admin.AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="aio-admin")
            await admin.start()
            try:
                await admin.create_topics([aiokafka.admin.NewTopic(topic, partitions, 1)])
            finally:
                await admin.close()

        asyncio.run(run())

    def produce(
        self, bootstrap: str, topic: str, msgs: Sequence[Msg], **config: Any
    ) -> list[tuple[int, int]]:
        async def run() -> list[tuple[int, int]]:
            p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="aio-producer", **config)
            await p.start()
            try:
                futures = [
                    await p.send(
                        topic,
                        value=m.value,
                        key=m.key,
                        headers=list(m.headers),
                        partition=m.partition,
                        timestamp_ms=m.timestamp,
                    )
                    for m in msgs
                ]
                metas = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
            finally:
                await p.stop()
            return [(md.partition, md.offset) for md in metas]

        return asyncio.run(run())

    def read(
        self,
        bootstrap: str,
        topic: str,
        until: dict[int, int],
        start: Start = "earliest",
        *,
        isolation: str = "read_uncommitted",
        positioned: Callable[[], object] | None = None,
    ) -> Read:
        async def run() -> Read:
            c = aiokafka.AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                client_id="aio-consumer",
                group_id=None,
                enable_auto_commit=False,
                isolation_level=isolation,
            )
            await c.start()
            out = Read([])
            try:
                tps = [aiokafka.TopicPartition(topic, p) for p in sorted(until)]
                c.assign(tps)
                if start == "earliest":
                    await c.seek_to_beginning(*tps)
                elif start == "latest":
                    await c.seek_to_end(*tps)
                elif isinstance(start, dict):
                    for tp in tps:
                        c.seek(tp, start[tp.partition])
                else:
                    found = await c.offsets_for_times({tp: start for tp in tps})
                    for tp in tps:
                        hit = found[tp]
                        out.found[tp.partition] = None if hit is None else (hit.offset, hit.timestamp)
                        if hit is None:
                            await c.seek_to_end(tp)
                        else:
                            c.seek(tp, hit.offset)
                for tp in tps:
                    await c.position(tp)
                if positioned is not None:
                    await asyncio.to_thread(positioned)
                deadline = time.monotonic() + DEADLINE_S
                while True:
                    positions = {tp.partition: await c.position(tp) for tp in tps}
                    if all(positions[p] >= until[p] for p in positions):
                        break
                    assert time.monotonic() < deadline, f"{self.name} read stuck at {positions}"
                    for msgs in (await c.getmany(timeout_ms=200)).values():
                        out.records += [kp_rec(m) for m in msgs]
            finally:
                await c.stop()
            return out

        return asyncio.run(run())


CLIENTS: list[Client] = [KafkaPython(), AioKafka()]
client_param = pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])


def produce_stored(
    client: Client, bootstrap: str, topic: str, msgs: Sequence[Msg], **config: Any
) -> list[Rec]:
    """Produce ``msgs``; the records the root must then hold (offsets from the acks)."""
    acks = client.produce(bootstrap, topic, msgs, **config)
    return [m.stored_as(p, o) for m, (p, o) in zip(msgs, acks, strict=True)]


def codec_msgs(tag: str, codec: str | None, n: int = 6) -> list[Msg]:
    """Records with null keys, headers (repeated and empty-valued ones) and a null value.  Every
    record compresses well, so that a batch of any one of them is sent compressed (the clients
    send a batch uncompressed when compression would not make it smaller)."""
    out = []
    for i in range(n):
        key = None if i % 3 == 0 and i < n - 1 else f"{tag}-{codec}-k{i}-".encode() * 20
        value = None if i == n - 1 else f"{tag}-{codec}-v{i}".encode() * (20 + 10 * i)
        headers: tuple[tuple[str, bytes], ...] = ()
        if i % 2 == 0:
            headers = (("trace", f"t{i}".encode()), ("empty", b""), ("trace", b"again"))
        out.append(Msg(value, key, headers, T0 + 1000 * i + 7))
    return out


# ---------------------------------------------------------------------------- 1. codecs, headers, keys


@client_param
def test_every_codec_with_headers_and_null_keys(serve: Any, client: Client) -> None:
    topic = "codecs"
    client.create_topic(serve.bootstrap, topic, 3)
    expected: list[Rec] = []
    codec_of: dict[tuple[int, int], int] = {}
    for codec, codec_id in CODECS.items():
        config: dict[str, Any] = {"acks": "all", "compression_type": codec, "linger_ms": 5}
        recs = produce_stored(client, serve.bootstrap, topic, codec_msgs(client.name, codec), **config)
        expected += recs
        codec_of.update({(r.partition, r.offset): codec_id for r in recs})
    expected.sort()
    assert len({(r.key, r.value) for r in expected}) == len(expected)

    # exactly what was sent is stored, in batches of the codec it was sent with
    assert stored(serve.root, topic) == expected
    assert batch_codecs(serve.root, topic) == codec_of
    assert any(r.key is None for r in expected) and any(r.headers for r in expected)

    # and it reads back identically over the wire, with both clients
    until = end_offsets(serve.root, topic)
    for reader in CLIENTS:
        assert sorted(reader.read(serve.bootstrap, topic, until).records) == expected, reader.name
    serve.stop()


# ---------------------------------------------------------------------------- 2. positions


@client_param
def test_earliest_latest_seek_and_timestamp(serve: Any, client: Client) -> None:
    topic = "positions"
    client.create_topic(serve.bootstrap, topic, 2)
    msgs = [Msg(f"p{p}-{i}".encode(), b"k", (), T0 + 1000 * i, p) for p in range(2) for i in range(10)]
    first = sorted(produce_stored(client, serve.bootstrap, topic, msgs, acks="all"))
    assert [(r.partition, r.offset) for r in first] == [(p, i) for p in range(2) for i in range(10)]
    assert stored(serve.root, topic) == first
    ends = {0: 10, 1: 10}

    earliest = client.read(serve.bootstrap, topic, ends, "earliest")
    assert sorted(earliest.records) == first

    seek = client.read(serve.bootstrap, topic, ends, {0: 4, 1: 7})
    assert sorted(seek.records) == [r for r in first if r.offset >= (4 if r.partition == 0 else 7)]

    by_time = client.read(serve.bootstrap, topic, ends, T0 + 6500)
    assert by_time.found == {0: (7, T0 + 7000), 1: (7, T0 + 7000)}
    assert sorted(by_time.records) == [r for r in first if r.offset >= 7]
    exact = client.read(serve.bootstrap, topic, ends, T0 + 3000)
    assert exact.found == {0: (3, T0 + 3000), 1: (3, T0 + 3000)}
    after_all = client.read(serve.bootstrap, topic, ends, T0 + 60_000)
    assert after_all.found == {0: None, 1: None} and after_all.records == []

    # latest: only what is produced after the consumer took its position
    later = [Msg(f"late-{p}-{i}".encode(), None, (), T0 + 50_000 + i, p) for p in range(2) for i in range(3)]
    produced: list[Rec] = []

    def produce_later() -> None:
        produced.extend(produce_stored(client, serve.bootstrap, topic, later, acks="all"))

    latest = client.read(serve.bootstrap, topic, {0: 13, 1: 13}, "latest", positioned=produce_later)
    assert sorted(latest.records) == sorted(produced)
    assert sorted(r.offset for r in produced) == [10, 10, 11, 11, 12, 12]
    assert stored(serve.root, topic) == sorted(first + produced)
    serve.stop()


# ---------------------------------------------------------------------------- 3. groups


@dataclass
class MemberLog:
    """What a group member read (``read``, every record of every poll batch, in order) and which
    of those batches then failed to commit (``refused``: a rebalance was completing; when their
    partitions moved, the next owner reads them again, Kafka's at-least-once contract)."""

    name: str
    read: list[Rec] = field(default_factory=list)
    refused: list[Rec] = field(default_factory=list)
    assignment: frozenset[int] = frozenset()
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)


KP_COMMIT_ERRORS = (kafka.errors.CommitFailedError, kafka.errors.RebalanceInProgressError)
AIO_COMMIT_ERRORS = (aiokafka.errors.CommitFailedError, aiokafka.errors.RebalanceInProgressError)


def kp_member(bootstrap: str, topic: str, group: str, m: MemberLog) -> None:
    try:
        c = KafkaPython().consumer(
            bootstrap, group_id=group, client_id=m.name, auto_offset_reset="earliest", **GROUP_TIMEOUTS
        )
        try:
            c.subscribe([topic])
            # the topic's partitions known (after subscribe) before the first join: kafka-python
            # 3.0.12's leader otherwise rejoins once they arrive, and that rejoin can be left
            # unfinished (a poll timing out between its assignment and its SyncGroup answer ends
            # the join loop, which then sees no need to rejoin): the member never gets partitions
            assert c.partitions_for_topic(topic), topic
            while not m.stop.is_set():
                got = [kp_rec(r) for rs in c.poll(timeout_ms=100, max_records=5).values() for r in rs]
                m.assignment = frozenset(tp.partition for tp in c.assignment())
                if not got:
                    continue
                m.read += got  # processed; then committed synchronously (the positions after it)
                try:
                    c.commit()
                except KP_COMMIT_ERRORS:
                    m.refused += got
        finally:
            c.close()  # leaves the group
    except BaseException as e:
        m.error = e
    finally:
        m.closed.set()


async def aio_member(bootstrap: str, topic: str, group: str, m: MemberLog) -> None:
    try:
        c = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=m.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **GROUP_TIMEOUTS,
        )
        await c.start()
        try:
            while not m.stop.is_set():
                batches = await c.getmany(timeout_ms=100, max_records=5)
                got = [kp_rec(r) for rs in batches.values() for r in rs]
                m.assignment = frozenset(tp.partition for tp in c.assignment())
                if not got:
                    continue
                m.read += got
                try:
                    await c.commit()
                except AIO_COMMIT_ERRORS:
                    m.refused += got
        finally:
            await c.stop()
    except BaseException as e:
        m.error = e
    finally:
        m.closed.set()


class Group:
    """Members of one group, as threads (kafka-python) or as tasks of one background event loop
    (aiokafka)."""

    def __init__(self, client: Client, bootstrap: str, topic: str, group: str):
        self.client, self.bootstrap, self.topic, self.group = client, bootstrap, topic, group
        self.members: list[MemberLog] = []
        self.threads: list[threading.Thread] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        if client.name == "aiokafka":
            self.loop = asyncio.new_event_loop()
            self.threads.append(threading.Thread(target=self.loop.run_forever, daemon=True))
            self.threads[-1].start()

    def join(self, name: str) -> MemberLog:
        m = MemberLog(name)
        self.members.append(m)
        if self.loop is not None:
            asyncio.run_coroutine_threadsafe(aio_member(self.bootstrap, self.topic, self.group, m), self.loop)
        else:
            t = threading.Thread(
                target=kp_member, args=(self.bootstrap, self.topic, self.group, m), daemon=True
            )
            self.threads.append(t)
            t.start()
        return m

    def leave(self, m: MemberLog) -> None:
        m.stop.set()
        wait_until(m.closed.is_set, f"{m.name} to close")

    def live(self) -> list[MemberLog]:
        return [m for m in self.members if not m.stop.is_set()]

    def check(self) -> None:
        for m in self.members:
            assert m.error is None, f"{m.name}: {m.error!r}"

    def balanced(self, partitions: int) -> bool:
        self.check()
        live = self.live()
        parts = [p for m in live for p in m.assignment]
        return sorted(parts) == list(range(partitions)) and all(
            len(m.assignment) == partitions // len(live) for m in live
        )

    def state(self) -> str:
        return "; ".join(
            f"{m.name}{' (left)' if m.stop.is_set() else ''}: partitions {sorted(m.assignment)}, "
            f"{len(m.read)} read, {len(m.refused)} not committed"
            for m in self.members
        )

    def read(self) -> list[tuple[int, int]]:
        return [(r.partition, r.offset) for m in self.members for r in m.read]

    def close(self) -> None:
        for m in self.members:
            m.stop.set()
        for m in self.members:
            wait_until(m.closed.is_set, f"{m.name} to close")
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        for t in self.threads:
            t.join(DEADLINE_S)
        if self.loop is not None:
            self.loop.close()
        self.check()


def committed_offsets(
    client: Client, bootstrap: str, topic: str, group: str, partitions: int
) -> dict[int, int]:
    if client.name == "kafka-python":
        c = KafkaPython().consumer(bootstrap, group_id=group, client_id="kp-committed")
        try:
            return {p: c.committed(kafka.TopicPartition(topic, p)) for p in range(partitions)}
        finally:
            c.close()

    async def run() -> dict[int, int]:
        c = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, client_id="aio-committed", enable_auto_commit=False
        )
        await c.start()
        try:
            return {p: await c.committed(aiokafka.TopicPartition(topic, p)) for p in range(partitions)}
        finally:
            await c.stop()

    return asyncio.run(run())


@client_param
def test_group_rebalance_loses_and_repeats_nothing_and_resumes_after_restart(
    serve: Any, client: Client
) -> None:
    topic, group, parts = "grouped", f"g-{client.name}", 6
    client.create_topic(serve.bootstrap, topic, parts)
    sent: list[Rec] = []

    def produce(phase: int, n: int = 36) -> None:
        msgs = [Msg(f"{phase}-{i}".encode(), f"k{i}".encode(), (), T0 + i, i % parts) for i in range(n)]
        sent.extend(produce_stored(KafkaPython(), serve.bootstrap, topic, msgs, acks="all"))

    g = Group(client, serve.bootstrap, topic, group)
    try:
        first = [g.join(f"{client.name}-m{i}") for i in range(3)]
        wait_until(lambda: g.balanced(parts), "3 members to share 6 partitions", detail=g.state)
        produce(1)
        wait_until(lambda: len(first[0].read) > 0, "m0 to read", detail=g.state)
        produce(2)  # m0 leaves while this phase is being read
        g.leave(first[0])
        produce(3)
        g.join(f"{client.name}-m3")  # and m3 joins while that rebalance's records are read
        produce(4)

        def unread() -> str:
            gone = sorted({(r.partition, r.offset) for r in sent} - set(g.read()))
            return f"{g.state()}; not read: {gone}"

        wait_until(
            lambda: g.balanced(parts) and set(g.read()) >= {(r.partition, r.offset) for r in sent},
            "every record read",
            detail=unread,
        )
    finally:
        g.close()
    assert len(sent) == 4 * 36
    # nothing lost: every record read, as it was produced
    by_place = {(r.partition, r.offset): r for m in g.members for r in m.read}
    assert sorted(by_place.values()) == sorted(sent)
    # nothing read twice, except what a member read in a batch whose commit then failed
    twice = {k for k, n in Counter(g.read()).items() if n > 1}
    refused = {(r.partition, r.offset) for m in g.members for r in m.refused}
    readers = {k: [m.name for m in g.members for r in m.read if (r.partition, r.offset) == k] for k in twice}
    assert twice <= refused, f"read twice although committed: {readers}; {g.state()}; {serve.log()[-3000:]}"
    print(f"{client.name}: {len(refused)} records in batches whose commit failed, {len(twice)} read twice")
    assert len({p for m in g.members[1:] for p in m.assignment}) == parts
    ends = {p: sum(1 for r in sent if r.partition == p) for p in range(parts)}
    assert committed_offsets(client, serve.bootstrap, topic, group, parts) == ends

    # committed offsets are durable: after a restart (a new port) the group resumes there
    serve.restart()
    assert committed_offsets(client, serve.bootstrap, topic, group, parts) == ends
    before = len(sent)
    produce(5, 12)
    g = Group(client, serve.bootstrap, topic, group)
    try:
        resumed = g.join(f"{client.name}-after-restart")
        wait_until(
            lambda: len(resumed.read) >= 12, "the resumed member to read the new records", detail=g.state
        )
        wait_until(lambda: resumed.assignment == frozenset(range(parts)), "its assignment", detail=g.state)
    finally:
        g.close()
    assert sorted(resumed.read) == sorted(sent[before:])
    serve.stop()


# ---------------------------------------------------------------------------- 4. idempotence


class RetryLog(logging.Handler):
    """The clients' warnings about produce requests that failed and are sent again."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "produce response" in msg or "Retrying batch" in msg:
            self.lines.append(msg)

    def in_flight_retried(self) -> bool:
        """Whether a request already sent lost its connection and its batches were retried."""
        return any("Got error produce response" in x and "Connection" in x for x in self.lines)


IDEMPOTENT_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 0,
    "request_timeout_ms": 20_000,
    "retry_backoff_ms": 50,
}
FILLER = b"." * 1500  # ~10 records per 16 KiB batch: a steady stream of requests in flight
MAX_KILLS = 4


def idem_value(i: int) -> bytes:
    return b"idem-%05d-" % i + FILLER


def idempotent_produce_through_kills(
    client: Client, serve: Any, topic: str, n: int, retries: RetryLog
) -> tuple[list[Any], int]:
    """Send ``n`` values in chunks with an idempotent acks=all producer.  After a chunk's first
    ack, while its other requests are in flight, SIGKILL the server and start it again on the
    same port; until the client has retried a request in flight (at most ``MAX_KILLS`` times).
    Returns the acks' metadata and the number of kills."""
    chunk = n // (MAX_KILLS + 1)
    kills = 0

    def maybe_kill(done: Callable[[], int], total: int) -> None:
        nonlocal kills
        if kills >= MAX_KILLS or (kills and retries.in_flight_retried()):
            return
        wait_until(lambda: done() > total - chunk, "a first ack of the chunk")
        serve.kill()
        serve.start()
        kills += 1

    if client.name == "kafka-python":
        p = KafkaPython().producer(serve.bootstrap, reconnect_backoff_max_ms=500, **IDEMPOTENT_CONFIG)
        try:
            futures = []
            for i in range(n):
                futures.append(p.send(topic, value=idem_value(i), key=b"k%d" % (i % 7), partition=0))
                if (i + 1) % chunk == 0 and i + 1 < n:
                    maybe_kill(lambda: sum(f.is_done for f in futures), len(futures))
            p.flush(timeout=DEADLINE_S)
            return [f.get(timeout=DEADLINE_S) for f in futures], kills
        finally:
            p.close(timeout=DEADLINE_S)

    async def run() -> list[Any]:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=serve.bootstrap, client_id="aio-idem", **IDEMPOTENT_CONFIG
        )
        await p.start()
        try:
            futures = []
            for i in range(n):
                futures.append(await p.send(topic, value=idem_value(i), key=b"k%d" % (i % 7), partition=0))
                if (i + 1) % chunk == 0 and i + 1 < n:
                    await async_wait_until(
                        lambda: sum(f.done() for f in futures) > len(futures) - chunk,
                        "a first ack of the chunk",
                    )
                    await asyncio.to_thread(maybe_kill, lambda: sum(f.done() for f in futures), len(futures))
            return list(await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S))
        finally:
            await p.stop()

    return asyncio.run(run()), kills


@client_param
def test_idempotent_producer_no_duplicates_through_server_kills(serve_factory: Any, client: Client) -> None:
    serve = serve_factory(extra=["--port", str(free_port())])  # restarts keep the port: same bootstrap
    topic, n = "idempotent", 300
    client.create_topic(serve.bootstrap, topic, 1)
    retries = RetryLog()
    loggers = [logging.getLogger(name) for name in ("kafka", "aiokafka")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(retries)
        lg.setLevel(logging.DEBUG)
    try:
        metas, kills = idempotent_produce_through_kills(client, serve, topic, n, retries)
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(retries)
            lg.setLevel(level)
    print(f"{client.name}: {kills} kills; retries: {sorted({x[:150] for x in retries.lines})}")
    assert serve.runs == 1 + kills
    assert retries.in_flight_retried(), f"no request in flight was retried in {kills} kills"
    assert [md.offset for md in metas] == list(range(n)), "acks out of order or repeated"
    rows = stored(serve.root, topic)
    values = [r.value for r in rows]
    assert values == [idem_value(i) for i in range(n)], (len(values), len(set(values)))
    assert [r.offset for r in rows] == list(range(n))
    # the batches carry one producer id and consecutive sequences (one producer session)
    data = b"".join(p.read_bytes() for p in sorted((Path(serve.root) / f"{topic}-0").glob("*.log")))
    arr = B.as_uint8(data)
    sc = B.scan_entries(arr)
    h = B.parse_headers(arr, sc.position, sc.size, sc.magic)
    assert len(set(h.producer_id.tolist())) == 1 and int(h.producer_id[0]) >= 0
    assert h.base_sequence.tolist() == h.base_offset.tolist()
    serve.stop()


# ---------------------------------------------------------------------------- 5. read_committed


def write_transactions(root: str, topic: str) -> list[tuple[bytes, bool]]:
    """Through the Python API (the server not running): plain records, an aborted and a
    committed transaction, interleaved.  Returns (value, visible to read_committed) in offset
    order of the data records."""
    ts = T0

    def data(values: list[bytes], pid: int = -1, seq: int = -1) -> bytes:
        txn = pid >= 0
        enc = codec_records.encode(
            values,
            [b"k"] * len(values),
            ts,
            headers=[[("h", b"x")]] * len(values),
            producer_id=pid,
            producer_epoch=0 if txn else -1,
            base_sequence=seq,
            is_transactional=txn,
        )
        return enc.tobytes()

    def marker(kind: int, pid: int) -> bytes:
        return codec_records.control_batch(kind, offset=0, producer_id=pid, producer_epoch=0, timestamp=ts)

    steps = [
        (data([b"plain-0"]), [(b"plain-0", True)]),
        (data([b"aborted-1", b"aborted-2"], 1001, 0), [(b"aborted-1", False), (b"aborted-2", False)]),
        (data([b"committed-1"], 1002, 0), [(b"committed-1", True)]),
        (data([b"aborted-3"], 1001, 2), [(b"aborted-3", False)]),
        (marker(B.ABORT, 1001), []),
        (data([b"plain-1"]), [(b"plain-1", True)]),
        (data([b"committed-2"], 1002, 1), [(b"committed-2", True)]),
        (marker(B.COMMIT, 1002), []),
        (data([b"plain-2"]), [(b"plain-2", True)]),
    ]
    with pylog.open(root) as r:
        r.create_topic(topic, partitions=1)
        for batch, _ in steps:
            r.append_batches({(topic, 0): batch})
    return [v for _, vs in steps for v in vs]


def test_read_committed_hides_aborted_transactions(serve_factory: Any, tmp_path: Path) -> None:
    root, topic = str(tmp_path / "txn-root"), "txn"
    written = write_transactions(root, topic)
    serve = serve_factory(root)
    until = {0: end_offsets(root, topic)[0]}
    assert until[0] == 10  # 8 data records and 2 markers
    everything = [v for v, _ in written]
    committed = [v for v, visible in written if visible]
    for client in CLIENTS:
        uncommitted = client.read(serve.bootstrap, topic, until, isolation="read_uncommitted")
        assert [r.value for r in sorted(uncommitted.records)] == everything, client.name
        rc = client.read(serve.bootstrap, topic, until, isolation="read_committed")
        assert [r.value for r in sorted(rc.records)] == committed, client.name
        assert all(r.headers == (("h", b"x"),) for r in rc.records)
    serve.stop()


# ---------------------------------------------------------------------------- Spark cross-checks


def spark_recs(spark_session: Any, root: str, topic: str) -> list[Rec]:
    rows = (
        spark_session.read.format("pylog")
        .option("path", root)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .selectExpr(
            "partition", "offset", "key", "value", "unix_millis(timestamp) AS ts", "timestampType", "headers"
        )
        .collect()
    )
    return sorted(
        Rec(
            r.partition,
            r.offset,
            None if r.key is None else bytes(r.key),
            None if r.value is None else bytes(r.value),
            r.ts,
            r.timestampType,
            tuple((h.key, None if h.value is None else bytes(h.value)) for h in (r.headers or ())),
        )
        for r in rows
    )


def test_spark_reads_what_clients_produce_while_the_server_runs(spark: Any, serve: Any) -> None:
    topic = "wire"
    CLIENTS[0].create_topic(serve.bootstrap, topic, 3)
    expected: list[Rec] = []
    for client in CLIENTS:
        for codec in CODECS:
            msgs = codec_msgs(client.name, codec, 4)
            expected += produce_stored(
                client, serve.bootstrap, topic, msgs, acks="all", compression_type=codec
            )
    expected.sort()
    # the server holds the writer lock; Spark's source and the Python API read beside it
    assert spark_recs(spark, serve.root, topic) == expected
    assert stored(serve.root, topic) == expected
    # and what comes later is seen by the next read
    more = produce_stored(CLIENTS[1], serve.bootstrap, topic, [Msg(b"later", None, (("a", b"b"),), T0)])
    assert spark_recs(spark, serve.root, topic) == sorted(expected + more)
    serve.stop()


def test_spark_sink_and_api_records_consumed_by_both_clients(
    spark: Any, serve_factory: Any, tmp_path: Path
) -> None:
    root = str(tmp_path / "written-root")
    with pylog.open(root) as r:
        r.create_topic("api", partitions=2)
        r.append(
            "api",
            pa.table(
                {
                    "key": [b"a", None, b"c", None],
                    "value": [b"1", b"2", None, b"4"],
                    "timestamp": pa.array([T0, T0 + 1, T0 + 2, T0 + 3], pa.int64()),
                }
            ),
            headers=[[("h", b"1"), ("h", b"2")], [], [("e", b"")], [("x", b"y")]],
            codec="zstd",
        )
    rows = [
        (None if i % 4 == 0 else f"sk{i}", f"spark-{i}", [(f"h{i % 3}", bytes([i]))] if i % 2 else [])
        for i in range(40)
    ]
    df = spark.createDataFrame(
        rows, "key string, value string, headers array<struct<key: string, value: binary>>"
    )
    df.write.format("pylog").mode("append").option("path", root).option("topic", "sparked").option(
        "partitions", "3"
    ).option("compression.type", "lz4").save()
    serve = serve_factory(root)
    for topic, n in (("api", 4), ("sparked", 40)):
        expected = stored(root, topic)
        assert len(expected) == n
        until = end_offsets(root, topic)
        for client in CLIENTS:
            got = client.read(serve.bootstrap, topic, until).records
            assert sorted(got) == expected, (topic, client.name)
    serve.stop()


def test_spark_batch_write_beside_the_server_times_out_on_the_lock(spark: Any, serve: Any) -> None:
    from pyspark.errors import AnalysisException

    topic = "guarded"
    CLIENTS[0].create_topic(serve.bootstrap, topic, 2)
    kept = produce_stored(CLIENTS[0], serve.bootstrap, topic, [Msg(b"before", b"k")], acks="all")
    df = spark.createDataFrame([("k", "from-spark")], "key string, value string")
    t0 = time.monotonic()
    with pytest.raises(AnalysisException) as caught:
        df.write.format("pylog").mode("append").option("path", serve.root).option("topic", topic).option(
            "lockTimeoutMs", "2000"
        ).save()
    waited = time.monotonic() - t0
    message = str(caught.value)
    print(f"Spark batch write beside the server failed after {waited:.1f} s: {message[:300]}")
    # the driver's commit waited lockTimeoutMs for the writer lock the server holds, then failed
    lock = str(Path(serve.root) / ".lock")
    assert f"LogLockedError: {lock}: another process holds the writer lock of this pylog root" in message
    assert waited >= 2.0
    # the staged files were removed: the partitions hold their segments only
    assert sorted(p.name for p in Path(serve.root).glob(f"{topic}-*/*")) == sorted(
        f"{0:020d}.{ext}" for ext in ("index", "log", "timeindex") for _ in range(2)
    )
    # nothing of the failed write is visible, and the server goes on serving
    assert stored(serve.root, topic) == sorted(kept)
    more = produce_stored(CLIENTS[1], serve.bootstrap, topic, [Msg(b"after", b"k")], acks="all")
    assert stored(serve.root, topic) == sorted(kept + more)
    got = CLIENTS[1].read(serve.bootstrap, topic, end_offsets(serve.root, topic)).records
    assert sorted(got) == sorted(kept + more)
    serve.stop()
