"""librdkafka against ``pylog serve``: confluent-kafka (its wheel's current librdkafka) and kcat
(Debian's kcat 1.7.1 on librdkafka 2.0.2, which speaks the old non-flexible versions: Produce 7,
Fetch 11, ListOffsets 2, Metadata 4, OffsetCommit/OffsetFetch 7).

For each client: produce with every codec, headers and null keys (what is stored, read with the
Python API, is exactly what was sent, and reads back identically over the wire); consume from
earliest, latest, an offset and a timestamp; consumer groups (a rebalance as members leave and
join mid-stream loses and repeats nothing; committed offsets survive a server restart); the
idempotent producer (a kill -9 of the server mid-stream, and the same Produce request bytes sent
twice over a raw socket, before and after a restart); read_committed over aborted transactions
written by pylog.  Cross-checks: wire-produced records as ``pylog consume`` prints them, and
records written by ``Root.append`` as both clients consume them.

Real clients against a real server on 127.0.0.1; every wait polls for a condition with a
generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pytest

import pylog
from pylog.storage.codec import batch as B
from pylog.storage.codec import records as codec

ck = pytest.importorskip(
    "confluent_kafka", reason="confluent-kafka is a dev dependency (pip install '.[dev]')"
)
ck_admin = pytest.importorskip("confluent_kafka.admin", reason="confluent-kafka is a dev dependency")

KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(
    KCAT is None, reason="kcat is not on the PATH (Debian: apt-get install kcat, librdkafka 2.0.2)"
)

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_ID = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
DEADLINE_S = 60.0
KCAT_FORMAT = "%p|%o|%T|%K|%S|%k%s|%h\\n"
"""kcat's output format: partition, offset, timestamp, key and value lengths (-1: null), then the
exact key and value bytes, then the headers (name=value, comma separated)."""

T = TypeVar("T")


def wait_until(cond: Callable[[], T], what: str, timeout: float = DEADLINE_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, order=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def stored(root: str, topic: str) -> list[Rec]:
    """Every record of ``topic`` as the Python API reads it, by partition and offset."""
    with pylog.open(root, read_only=True) as r:
        t = r.read_table(topic)
    assert set(t.column("timestampType").to_pylist()) <= {0}, "CreateTime expected"
    assert set(t.column("topic").to_pylist()) <= {topic}
    ts = t.column("timestamp").cast(pa.int64()).to_pylist()
    out = [
        Rec(
            row["partition"],
            row["offset"],
            row["key"],
            row["value"],
            ts[i],
            tuple((h["key"], h["value"]) for h in row["headers"] or ()),
        )
        for i, row in enumerate(t.select(["partition", "offset", "key", "value", "headers"]).to_pylist())
    ]
    return sorted(out)


def batch_headers(root: str, topic: str, partition: int) -> B.BatchHeaders:
    """The headers of every stored batch of a partition (one segment in these tests)."""
    with pylog.open(root, read_only=True) as r:
        lg = r.log(topic, partition)
        assert len(lg.segments) == 1
        _, data = lg.read(lg.log_start_offset, 1 << 26)
        buf = np.frombuffer(bytes(data), np.uint8)
    scan = B.scan_entries(buf, allow_torn_tail=False)
    return B.parse_headers(buf, scan.position, scan.size, scan.magic)


def codec_of_offsets(root: str, topic: str, partition: int) -> dict[int, int]:
    """offset -> the compression codec of the stored batch that holds it."""
    h = batch_headers(root, topic, partition)
    out = {}
    for base, last, attrs in zip(
        h.base_offset.tolist(), h.last_offset.tolist(), h.attributes.tolist(), strict=True
    ):
        for o in range(base, last + 1):
            out[o] = attrs & B.CODEC_MASK
    return out


def assert_consecutive(recs: list[Rec]) -> None:
    by: dict[int, list[int]] = {}
    for r in recs:
        by.setdefault(r.partition, []).append(r.offset)
    for p, offs in by.items():
        assert offs == list(range(len(offs))), f"partition {p}: offsets {offs}"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = ck_admin.AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([ck_admin.NewTopic(topic, partitions, 1)])[topic].result(30)


# ---------------------------------------------------------------------------- confluent-kafka helpers


def ck_produce(
    bootstrap: str, topic: str, msgs: Iterable[dict[str, Any]], **conf: Any
) -> list[tuple[int, int]]:
    """Produce ``msgs`` (keyword arguments of ``Producer.produce``); every one must be acknowledged.
    Returns (partition, offset) of each, in the order given."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    got: dict[int, tuple[Any, Any]] = {}
    n = 0
    for i, m in enumerate(msgs):
        p.produce(topic, **m, on_delivery=lambda e, msg, i=i: got.__setitem__(i, (e, msg)))
        p.poll(0)
        n += 1
    assert p.flush(DEADLINE_S) == 0, "messages left unsent"
    assert [got[i][0] for i in range(n)] == [None] * n
    return [(got[i][1].partition(), got[i][1].offset()) for i in range(n)]


def ck_rec(m: Any) -> Rec:
    ts_type, ts = m.timestamp()
    assert ts_type == ck.TIMESTAMP_CREATE_TIME
    return Rec(m.partition(), m.offset(), m.key(), m.value(), ts, tuple(m.headers() or ()))


def ck_read(bootstrap: str, topic: str, starts: dict[int, int], **conf: Any) -> list[Rec]:
    """What a confluent-kafka consumer assigned ``starts`` (partition -> offset) reads until the
    end of every partition (partition EOF)."""
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,  # the end of a partition is known sooner
            **conf,
        }
    )
    out: list[Rec] = []
    try:
        c.assign([ck.TopicPartition(topic, p, o) for p, o in starts.items()])
        eof: set[int] = set()
        deadline = time.monotonic() + DEADLINE_S
        while eof != set(starts):
            assert time.monotonic() < deadline, f"read {len(out)} records, no end of {set(starts) - eof}"
            m = c.poll(0.2)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                assert err.code() == ck.KafkaError._PARTITION_EOF, err
                eof.add(m.partition())
                continue
            eof.discard(m.partition())
            out.append(ck_rec(m))
    finally:
        c.close()
    return sorted(out)


# ---------------------------------------------------------------------------- kcat helpers


def kcat(*args: str, stdin: bytes | None = None) -> bytes:
    assert KCAT is not None
    proc = subprocess.run(
        [KCAT, "-m", "30", *args], input=stdin, capture_output=True, timeout=DEADLINE_S, check=False
    )
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}"
    assert b"ERROR" not in proc.stderr, proc.stderr.decode()
    return proc.stdout


def parse_kcat(out: bytes) -> list[Rec]:
    """Records printed with :data:`KCAT_FORMAT`."""
    recs = []
    pos = 0
    while pos < len(out):
        fields = []
        for _ in range(5):
            end = out.index(b"|", pos)
            fields.append(int(out[pos:end]))
            pos = end + 1
        part, off, ts, klen, vlen = fields
        key = out[pos : pos + klen] if klen >= 0 else None
        pos += max(klen, 0)
        value = out[pos : pos + vlen] if vlen >= 0 else None
        pos += max(vlen, 0)
        assert out[pos : pos + 1] == b"|", out[pos - 20 : pos + 20]
        end = out.index(b"\n", pos)
        hdrs = out[pos + 1 : end].decode()
        pos = end + 1
        headers = tuple((name, v.encode()) for name, _, v in (h.partition("=") for h in hdrs.split(",") if h))
        recs.append(Rec(part, off, key, value, ts, headers))
    return sorted(recs)


def kcat_read(bootstrap: str, topic: str, *args: str) -> list[Rec]:
    """What ``kcat -C`` prints until the end of the partitions it reads (``-e``)."""
    args = ("-X", "fetch.wait.max.ms=50", *args)  # the end of a partition is known sooner
    return parse_kcat(kcat("-C", "-b", bootstrap, "-t", topic, "-e", "-q", "-f", KCAT_FORMAT, *args))


# ---------------------------------------------------------------------------- pylog consume


def pylog_consume(root: str, topic: str) -> list[Rec]:
    proc = subprocess.run(
        [sys.executable, "-m", "pylog", "consume", root, topic, "--from-beginning", "--json"],
        capture_output=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()

    def field(obj: dict[str, Any], name: str) -> bytes | None:
        if f"{name}_b64" in obj:
            return base64.b64decode(obj[f"{name}_b64"])
        v = obj[name]
        return None if v is None else v.encode()

    def header(v: Any) -> bytes | None:
        if isinstance(v, dict):
            return base64.b64decode(v["b64"])
        return None if v is None else v.encode()

    out = []
    for line in proc.stdout.decode().splitlines():
        obj = json.loads(line)
        assert obj["topic"] == topic and obj["timestampType"] == 0
        hdrs = tuple((k, header(v)) for k, v in obj["headers"])
        out.append(
            Rec(
                obj["partition"],
                obj["offset"],
                field(obj, "key"),
                field(obj, "value"),
                obj["timestamp"],
                hdrs,
            )
        )
    return sorted(out)


# ---------------------------------------------------------------------------- 1. codecs, headers, null keys


def test_confluent_every_codec_headers_and_null_keys(serve: Any) -> None:
    topic = "codecs"
    create_topic(serve.bootstrap, topic, 2)
    base = now_ms() - 60_000
    sent: list[tuple[str, dict[str, Any]]] = []
    for ci, name in enumerate(CODECS):
        msgs = []
        for i in range(8):
            headers = [("h", b"1"), ("h", None), ("codec", name.encode()), ("bin", b"\x00\xff\n|,=")]
            msgs.append(
                {
                    "partition": i % 2,
                    "key": None if i % 3 == 0 else b"key-%s-%d\xff" % (name.encode(), i),
                    "value": None if i == 7 else b"%s-%d|" % (name.encode(), i) + bytes(range(256)) * 3,
                    "timestamp": base + 100 * ci + i,
                    "headers": None if i % 4 == 1 else headers,
                }
            )
        acked = ck_produce(serve.bootstrap, topic, msgs, **{"compression.type": name, "linger.ms": 50})
        sent += [(name, dict(m, offset=o)) for m, (_, o) in zip(msgs, acked, strict=True)]

    expected = sorted(
        Rec(m["partition"], m["offset"], m["key"], m["value"], m["timestamp"], tuple(m["headers"] or ()))
        for _, m in sent
    )
    got = stored(serve.root, topic)
    assert got == expected
    assert_consecutive(got)
    assert len(got) == 8 * len(CODECS)
    for p in (0, 1):  # the batches are stored as the client compressed them
        codecs = codec_of_offsets(serve.root, topic, p)
        assert {o: CODEC_ID[n] for n, m in sent if m["partition"] == p for o in [m["offset"]]} == codecs
    assert ck_read(serve.bootstrap, topic, {0: ck.OFFSET_BEGINNING, 1: ck.OFFSET_BEGINNING}) == expected
    assert pylog_consume(serve.root, topic) == expected


@needs_kcat
def test_kcat_every_codec_headers_and_null_keys(serve: Any) -> None:
    topic = "kcodecs"
    create_topic(serve.bootstrap, topic, 2)
    sent: list[tuple[str, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = []
    before = now_ms()
    for ci, name in enumerate(CODECS):
        part = ci % 2
        headers: tuple[tuple[str, bytes], ...] = () if ci == 2 else (("h", b"1"), ("codec", name.encode()))
        lines = []
        for i in range(6):
            key = None if i % 3 == 0 else f"key-{name}-{i}".encode()
            value = None if i == 5 else f"{name}-{i}-".encode() + b"abcdefgh" * 40
            lines.append((key + b"\t" if key is not None else b"") + (value or b""))
            sent.append((name, part, key, value, headers))
        args = ["-P", "-b", serve.bootstrap, "-t", topic, "-p", str(part), "-K", "\\t", "-Z"]
        args += ["-X", f"compression.codec={name}", "-X", "linger.ms=50"]
        for h, v in headers:
            args += ["-H", f"{h}={v.decode()}"]
        kcat(*args, stdin=b"\n".join(lines) + b"\n")
    after = now_ms()

    got = stored(serve.root, topic)
    assert_consecutive(got)
    by_part = {p: [s for s in sent if s[1] == p] for p in (0, 1)}
    for p, expect in by_part.items():
        recs = [r for r in got if r.partition == p]
        assert [(r.key, r.value, r.headers) for r in recs] == [(k, v, h) for _, _, k, v, h in expect]
        assert all(before <= r.timestamp <= after for r in recs)
        codecs = codec_of_offsets(serve.root, topic, p)
        assert [codecs[r.offset] for r in recs] == [CODEC_ID[n] for n, *_ in expect]
    assert kcat_read(serve.bootstrap, topic, "-o", "beginning") == got
    assert ck_read(serve.bootstrap, topic, {0: ck.OFFSET_BEGINNING, 1: ck.OFFSET_BEGINNING}) == got


def test_root_append_read_identically_by_confluent_and_kcat(serve_factory: Any, tmp_path: Path) -> None:
    """Records written by the Python API (every codec, headers with a null value and a repeated
    name, null keys and values, binary bytes) as both librdkafka clients consume them."""
    path = str(tmp_path / "appended")
    base = now_ms() - 30_000
    with pylog.open(path) as root:
        root.create_topic("appended", partitions=2)
        for ci, name in enumerate(CODECS):
            n = 5
            root.append(
                "appended",
                pa.table(
                    {
                        "key": [None if i == 0 else b"k\x00\xff%d" % i for i in range(n)],
                        "value": [None if i == 4 else b"v|%d\n\x80" % i + b"x" * 300 for i in range(n)],
                        "timestamp": pa.array([base + 10 * ci + i for i in range(n)], pa.int64()),
                        "headers": [
                            [
                                {"key": "a", "value": b"1"},
                                {"key": "a", "value": b"2"},
                                {"key": "n", "value": None},
                            ]
                            if i % 2
                            else []
                            for i in range(n)
                        ],
                    }
                ),
                partition=ci % 2,
                codec=name,
            )
    expected = stored(path, "appended")
    assert len(expected) == 25
    serve = serve_factory(path)
    assert ck_read(serve.bootstrap, "appended", {0: ck.OFFSET_BEGINNING, 1: ck.OFFSET_BEGINNING}) == expected
    if KCAT is None:
        pytest.skip("kcat is not on the PATH (Debian: apt-get install kcat); confluent-kafka checked")
    # kcat's %h prints a null header value as NULL
    as_kcat = [
        Rec(
            r.partition, r.offset, r.key, r.value, r.timestamp, tuple((k, v or b"NULL") for k, v in r.headers)
        )
        for r in expected
    ]
    assert kcat_read(serve.bootstrap, "appended", "-o", "beginning") == as_kcat


# ---------------------------------------------------------------------------- 2. where a consumer starts


def offsets_of(recs: list[Rec]) -> list[int]:
    return [r.offset for r in recs]


def produce_timed(bootstrap: str, topic: str, first: int, n: int, base: int) -> None:
    """Records ``first .. first+n-1`` to partition 0 with timestamps ``base + 10 * i``."""
    msgs = [
        {"partition": 0, "value": b"v%d" % i, "timestamp": base + 10 * i} for i in range(first, first + n)
    ]
    ck_produce(bootstrap, topic, msgs)


def test_confluent_consume_from_earliest_latest_offset_and_timestamp(serve: Any) -> None:
    topic = "positions"
    create_topic(serve.bootstrap, topic, 1)
    base = now_ms() - 30_000
    produce_timed(serve.bootstrap, topic, 0, 10, base)

    assert offsets_of(ck_read(serve.bootstrap, topic, {0: ck.OFFSET_BEGINNING})) == list(range(10))
    assert offsets_of(ck_read(serve.bootstrap, topic, {0: 4})) == list(range(4, 10))
    c = ck.Consumer({"bootstrap.servers": serve.bootstrap, "group.id": "times", "enable.auto.commit": False})
    try:
        for ts, want in [(base + 60, 6), (base + 55, 6), (base, 0), (base - 5_000, 0), (base + 10_000, -1)]:
            (tp,) = c.offsets_for_times([ck.TopicPartition(topic, 0, ts)], 30)
            assert tp.error is None and tp.offset == want, (ts - base, tp)
    finally:
        c.close()
    from_ts = ck_read(serve.bootstrap, topic, {0: 6})
    assert [(r.offset, r.timestamp) for r in from_ts] == [(i, base + 10 * i) for i in range(6, 10)]

    # latest: only what is produced once the consumer is positioned at the end
    c = ck.Consumer({"bootstrap.servers": serve.bootstrap, "group.id": "latest", "enable.auto.commit": False})
    got: list[Rec] = []
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])

        def positioned() -> bool:  # a fetch answered: the end offset was resolved and is fetched from
            m = c.poll(0.1)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(ck_rec(m))
            return c.get_watermark_offsets(ck.TopicPartition(topic, 0), cached=True)[1] >= 10

        wait_until(positioned, "the consumer at the end of the partition")
        produce_timed(serve.bootstrap, topic, 10, 3, base)

        def three() -> bool:
            m = c.poll(0.1)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(ck_rec(m))
            return len(got) >= 3

        wait_until(three, "the records produced after the consumer started at the end")
    finally:
        c.close()
    assert offsets_of(got) == [10, 11, 12]
    assert [r.value for r in got] == [b"v10", b"v11", b"v12"]


@needs_kcat
def test_kcat_consume_from_earliest_latest_offset_and_timestamp(serve: Any) -> None:
    topic = "kpositions"
    create_topic(serve.bootstrap, topic, 1)
    base = now_ms() - 30_000
    produce_timed(serve.bootstrap, topic, 0, 10, base)
    b = serve.bootstrap

    assert offsets_of(kcat_read(b, topic, "-p", "0", "-o", "beginning")) == list(range(10))
    assert offsets_of(kcat_read(b, topic, "-p", "0", "-o", "4")) == list(range(4, 10))
    assert offsets_of(kcat_read(b, topic, "-p", "0", "-o", "-3")) == [7, 8, 9]  # relative to the end
    from_ts = kcat_read(b, topic, "-p", "0", "-o", f"s@{base + 55}")
    assert [(r.offset, r.timestamp) for r in from_ts] == [(i, base + 10 * i) for i in range(6, 10)]
    up_to = kcat_read(b, topic, "-p", "0", "-o", "s@0", "-o", f"e@{base + 30}")
    assert offsets_of(up_to) == [0, 1, 2]
    assert kcat("-Q", "-b", b, "-t", f"{topic}:0:{base + 60}").decode().split() == [
        topic,
        "[0]",
        "offset",
        "6",
    ]

    # latest: kcat says it reached the end (stderr) before anything is produced
    assert KCAT is not None
    proc = subprocess.Popen(
        [KCAT, "-m", "30", "-C", "-b", b, "-t", topic, "-p", "0", "-o", "end", "-c", "3", "-f", KCAT_FORMAT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        err = b""

        def at_end() -> bool:
            nonlocal err
            assert proc.stderr is not None
            ready, _, _ = select.select([proc.stderr], [], [], 0.1)
            if ready:
                err += os.read(proc.stderr.fileno(), 4096)
            assert proc.poll() is None, err
            return b"Reached end of topic" in err

        wait_until(at_end, "kcat at the end of the partition")
        assert b"at offset 10" in err, err
        produce_timed(b, topic, 10, 3, base)
        out, rest = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err + rest
    got = parse_kcat(out)
    assert offsets_of(got) == [10, 11, 12]
    assert [r.value for r in got] == [b"v10", b"v11", b"v12"]


# ---------------------------------------------------------------------------- 3. consumer groups

GROUP_CONF = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
}
STALE_COMMIT = {
    ck.KafkaError.REBALANCE_IN_PROGRESS,
    ck.KafkaError.ILLEGAL_GENERATION,
    ck.KafkaError.UNKNOWN_MEMBER_ID,
    ck.KafkaError._ASSIGNMENT_LOST,
    ck.KafkaError._STATE,
}
"""Why a commit may fail across a rebalance: its records are then not processed, and read again by
the partition's next owner."""


class Member:
    """A group member that processes a polled batch by committing it synchronously: a record is
    processed (appended to ``processed``) once, and only once, its commit succeeded.  ``limit``
    stops processing after that many records: what it polls after that is dropped unprocessed
    (fetched, never committed), as when a consumer goes away mid-stream."""

    def __init__(
        self, bootstrap: str, group: str, topic: str, processed: list[tuple[int, int, bytes]], limit: int = -1
    ) -> None:
        self.topic = topic
        self.processed = processed
        self.limit = limit
        self.count = 0
        self.assigned: set[int] = set()
        self.failed_commits: list[int] = []
        self.c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF})
        self.c.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.closed = False

    def _on_assign(self, _c: Any, parts: list[Any]) -> None:
        self.assigned = {p.partition for p in parts}

    def _on_revoke(self, _c: Any, _parts: list[Any]) -> None:
        self.assigned = set()

    def step(self) -> None:
        msgs = self.c.consume(num_messages=10, timeout=0.05)
        batch = []
        for m in msgs:
            assert m.error() is None, m.error()
            if m.partition() in self.assigned:  # not revoked while this batch was polled
                batch.append(m)
        if self.limit >= 0:
            batch = batch[: max(0, self.limit - self.count)]
        if not batch:
            return
        ends: dict[int, int] = {}
        for m in batch:
            ends[m.partition()] = m.offset() + 1
        try:
            result = self.c.commit(
                offsets=[ck.TopicPartition(self.topic, p, o) for p, o in ends.items()], asynchronous=False
            )
        except ck.KafkaException as e:
            code = e.args[0].code()
            assert code in STALE_COMMIT, e
            self.failed_commits.append(code)
            return
        ok = {tp.partition for tp in result if tp.error is None}
        for tp in result:
            if tp.error is not None:
                assert tp.error.code() in STALE_COMMIT, tp.error
                self.failed_commits.append(tp.error.code())
        done = [(m.partition(), m.offset(), m.value()) for m in batch if m.partition() in ok]
        self.processed += done
        self.count += len(done)

    def close(self) -> None:
        self.c.close()
        self.closed = True


def run_until(
    cond: Callable[[], bool], members: list[Member], what: str, timeout: float = DEADLINE_S
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + "; ".join(
            f"member {i}: {sorted(m.assigned)} processed {m.count}" for i, m in enumerate(members)
        )
        for m in members:
            m.step()


def group_batch(tag: str, n_per_partition: int, partitions: int = 6) -> list[dict[str, Any]]:
    return [
        {"partition": p, "key": b"k%d" % p, "value": b"%s-%d-%d" % (tag.encode(), p, i)}
        for i in range(n_per_partition)
        for p in range(partitions)
    ]


def assert_once_each(processed: list[tuple[int, int, bytes]], everything: list[Rec]) -> None:
    seen = Counter((p, o) for p, o, _ in processed)
    repeated = sorted(k for k, n in seen.items() if n > 1)
    lost = sorted({(r.partition, r.offset) for r in everything} - set(seen))
    assert not repeated and not lost, f"read twice: {repeated}; never read: {lost}"
    assert sorted(processed) == [(r.partition, r.offset, r.value) for r in everything]


def test_confluent_group_rebalance_loses_and_repeats_nothing_and_resumes_after_restart(serve: Any) -> None:
    """Three members over six partitions; one leaves mid-stream (records fetched, never processed),
    a new one joins mid-stream.  Every record is processed exactly once (a record is processed when
    its synchronous commit succeeded; a commit refused by a rebalance leaves it to the next owner).
    After a server restart the group goes on from its committed offsets."""
    topic, group = "grouped", "workers"
    create_topic(serve.bootstrap, topic, 6)
    processed: list[tuple[int, int, bytes]] = []
    c1 = Member(serve.bootstrap, group, topic, processed)
    c2 = Member(serve.bootstrap, group, topic, processed, limit=3)
    c3 = Member(serve.bootstrap, group, topic, processed)
    c4: Member | None = None
    members = [c1, c2, c3]
    try:
        run_until(
            lambda: all(len(m.assigned) == 2 for m in members), members, "three members, two partitions each"
        )
        ck_produce(serve.bootstrap, topic, group_batch("a", 10))
        run_until(lambda: c2.count >= 3 and c1.count > 0 and c3.count > 0, members, "every member processing")
        c2.close()  # leaves mid-stream: its partitions hold records it fetched and never processed
        members = [c1, c3]
        ck_produce(serve.bootstrap, topic, group_batch("b", 10))
        run_until(
            lambda: len(c1.assigned | c3.assigned) == 6 and len(processed) >= 80,
            members,
            "the two members left owning all partitions",
        )
        c4 = Member(serve.bootstrap, group, topic, processed)  # joins mid-stream
        members = [c1, c3, c4]
        ck_produce(serve.bootstrap, topic, group_batch("c", 5))
        run_until(lambda: bool(c4 and c4.assigned), members, "the new member's assignment")
        ck_produce(serve.bootstrap, topic, group_batch("d", 5))
        run_until(lambda: len(processed) >= 180 and bool(c4 and c4.count), members, "every record processed")

        everything = stored(serve.root, topic)
        assert len(everything) == 180
        assert_once_each(processed, everything)
        tps = [ck.TopicPartition(topic, p) for p in range(6)]
        committed = {tp.partition: tp.offset for tp in c1.c.committed(tps, timeout=30)}
        assert committed == dict.fromkeys(range(6), 30)
    finally:
        for m in (c1, c2, c3, c4):
            if m is not None and not m.closed:
                m.close()

    serve.restart()  # a new port: the committed offsets come back from the root
    ck_produce(serve.bootstrap, topic, group_batch("e", 2))
    after: list[tuple[int, int, bytes]] = []
    c5 = Member(serve.bootstrap, group, topic, after)
    try:
        assert {tp.partition: tp.offset for tp in c5.c.committed(tps, timeout=30)} == committed
        run_until(lambda: len(after) >= 12, [c5], "the records produced after the restart")
    finally:
        c5.close()
    assert sorted((p, o) for p, o, _ in after) == [(p, o) for p in range(6) for o in (30, 31)]
    assert all(v.startswith(b"e-") for _, _, v in after)


@needs_kcat
def test_kcat_balanced_consumer_commits_and_resumes_after_restart(serve: Any) -> None:
    """kcat -G (librdkafka 2.0.2's JoinGroup 5, SyncGroup 3, OffsetCommit/OffsetFetch 7): a group
    read commits on close; the next run, also after a server restart, reads only newer records."""
    topic, group = "kgrouped", "kcat-workers"
    create_topic(serve.bootstrap, topic, 2)

    def run(bootstrap: str) -> list[Rec]:
        args = [
            "-b",
            bootstrap,
            "-G",
            group,
            "-e",
            "-q",
            "-f",
            KCAT_FORMAT,
            "-X",
            "auto.offset.reset=earliest",
        ]
        args += ["-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"]
        args += ["-X", "fetch.wait.max.ms=50", topic]
        return parse_kcat(kcat(*args))

    ck_produce(serve.bootstrap, topic, group_batch("a", 5, 2))
    assert [(r.partition, r.offset) for r in run(serve.bootstrap)] == [
        (p, o) for p in (0, 1) for o in range(5)
    ]
    ck_produce(serve.bootstrap, topic, group_batch("b", 3, 2))
    got = run(serve.bootstrap)
    assert [(r.partition, r.offset) for r in got] == [(p, o) for p in (0, 1) for o in range(5, 8)]
    serve.restart()
    ck_produce(serve.bootstrap, topic, group_batch("c", 2, 2))
    got = run(serve.bootstrap)
    assert [(r.partition, r.offset) for r in got] == [(p, o) for p in (0, 1) for o in range(8, 10)]
    assert all(r.value is not None and r.value.startswith(b"c-") for r in got)


# ---------------------------------------------------------------------------- 4. idempotent producer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_confluent_idempotent_producer_across_a_killed_server(serve_factory: Any) -> None:
    """An idempotent producer (acks=all) keeps producing while the server is killed (SIGKILL, its
    requests in flight unanswered) and started again on the same port: librdkafka retries what
    was not acknowledged with the same producer id and sequences; every record is stored once,
    in the order produced."""
    port = free_port()
    serve = serve_factory(extra=["--port", str(port)])
    assert serve.port == port
    topic = "idempotent"
    create_topic(serve.bootstrap, topic, 3)
    p = ck.Producer(
        {
            "bootstrap.servers": serve.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.send.max.retries": 1000,
            "retry.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200,
            "linger.ms": 1,
            "batch.num.messages": 5,
            "max.in.flight.requests.per.connection": 5,
        }
    )
    reports: list[tuple[Any, int, int, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((err, msg.partition(), msg.offset(), msg.value()))

    n = 300
    for i in range(n):
        p.produce(topic, value=b"idem-%04d" % i, partition=i % 3, on_delivery=on_delivery)
        p.poll(0)
        if i == n // 2:
            wait_until(lambda: p.poll(0.01) >= 0 and len(reports) > 0, "a first acknowledgement")
            serve.kill()  # with requests in flight
            serve.start()
            assert serve.port == port
    assert p.flush(DEADLINE_S) == 0
    assert [r for r in reports if r[0] is not None] == []
    assert len(reports) == n

    got = stored(serve.root, topic)
    assert_consecutive(got)
    for part in range(3):
        values = [r.value for r in got if r.partition == part]
        assert values == [b"idem-%04d" % i for i in range(part, n, 3)]  # once each, in order
        assert sorted((o, v) for _, pp, o, v in reports if pp == part) == [
            (r.offset, r.value) for r in got if r.partition == part
        ]
        h = batch_headers(serve.root, topic, part)
        assert (h.producer_id >= 0).all() and len(set(h.producer_id.tolist())) == 1
        # per producer epoch, the sequences run on with no gap or repeat
        seq: dict[int, int] = {}
        for epoch, base_seq, delta in zip(
            h.producer_epoch.tolist(), h.base_sequence.tolist(), h.last_offset_delta.tolist(), strict=True
        ):
            assert base_seq == seq.get(epoch, 0), (epoch, base_seq, seq)
            seq[epoch] = base_seq + delta + 1


class RawClient:
    """Kafka requests over a plain socket, built and parsed with kio (as the server does)."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
        self.correlation = 0

    def frame(self, body: Any) -> bytes:
        from kio.serial import entity_writer
        from kio.static.primitive import i32

        cls = type(body)
        header = cls.__header_schema__
        self.correlation += 1
        buf = io.BytesIO()
        entity_writer(header)(
            buf,
            header(
                request_api_key=cls.__api_key__,
                request_api_version=cls.__version__,
                correlation_id=i32(self.correlation),
                client_id="pylog-raw-test",
            ),
        )
        entity_writer(cls)(buf, body)
        return struct.pack(">i", buf.tell()) + buf.getvalue()

    def send(self, frame: bytes, request_cls: Any) -> Any:
        """Send one request frame and return the parsed response."""
        from kio.index import load_payload_module
        from kio.serial import entity_reader
        from kio.static.constants import EntityType

        self.sock.sendall(frame)
        (size,) = struct.unpack(">i", self._exactly(4))
        data = memoryview(self._exactly(size))
        mod = load_payload_module(request_cls.__api_key__, request_cls.__version__, EntityType.response)
        response_cls = getattr(mod, request_cls.__name__.replace("Request", "Response"))
        header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
        assert header.correlation_id == struct.unpack(">i", frame[8:12])[0]
        body, _ = entity_reader(response_cls)(data, offset)
        return body

    def call(self, body: Any) -> Any:
        return self.send(self.frame(body), type(body))

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the server closed the connection"
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def test_same_produce_request_twice_is_stored_once_also_after_a_restart(serve: Any) -> None:
    """A ProduceRequest (v9) of an idempotent producer's batch sent again, byte for byte, is
    answered with the base offset of the first time and not appended again: the last batch, an
    older one of the last five, on another connection, and after a server restart (the producer
    state comes back from the log).  A gap in the sequence is refused."""
    from kio.schema.errors import ErrorCode
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.types import ProducerId, TopicName
    from kio.static.primitive import Records, i16, i32, i32Timedelta

    topic = "raw"
    create_topic(serve.bootstrap, topic, 1)
    raw = RawClient(serve.bootstrap)
    init = raw.call(
        InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout=i32Timedelta.parse(dt.timedelta(seconds=60)),
            producer_id=ProducerId(-1),
            producer_epoch=i16(-1),
        )
    )
    assert init.error_code == ErrorCode.none and init.producer_id >= 0
    ts = now_ms()

    def request(client: RawClient, seq: int, n: int = 3) -> bytes:
        batch = codec.encode(
            [b"raw-%d" % (seq + i) for i in range(n)],
            timestamp=np.full(n, ts, np.int64),
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            base_sequence=seq,
            codec="lz4",
        ).tobytes()
        part = PartitionProduceData(index=i32(0), records=Records(batch))
        return client.frame(
            ProduceRequest(
                transactional_id=None,
                acks=i16(-1),
                timeout=i32Timedelta.parse(dt.timedelta(seconds=30)),
                topic_data=(TopicProduceData(name=TopicName(topic), partition_data=(part,)),),
            )
        )

    def produce(client: RawClient, frame: bytes) -> tuple[ErrorCode, int]:
        (t,) = client.send(frame, ProduceRequest).responses
        (p,) = t.partition_responses
        return p.error_code, p.base_offset

    frames = [request(raw, seq) for seq in (0, 3, 6)]
    assert [produce(raw, f) for f in frames] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 3),
        (ErrorCode.none, 6),
    ]
    assert produce(raw, frames[2]) == (ErrorCode.none, 6)  # the same bytes again
    assert produce(raw, frames[0]) == (ErrorCode.none, 0)  # an older batch, among the last five
    other = RawClient(serve.bootstrap)
    assert produce(other, frames[1]) == (ErrorCode.none, 3)
    other.close()
    assert produce(raw, request(raw, 12))[0] == ErrorCode.out_of_order_sequence_number  # 9 expected
    raw.close()
    expected = [b"raw-%d" % i for i in range(9)]
    assert [r.value for r in stored(serve.root, topic)] == expected

    serve.restart()
    raw = RawClient(serve.bootstrap)
    assert produce(raw, frames[2]) == (ErrorCode.none, 6)
    # an older batch: Kafka's producer snapshot keeps the last batch only, so after a restart
    # Kafka refuses it as out of order; answering with its offset would do too.  Never appended.
    assert produce(raw, frames[1]) in {(ErrorCode.none, 3), (ErrorCode.out_of_order_sequence_number, -1)}
    assert produce(raw, request(raw, 9)) == (ErrorCode.none, 9)
    raw.close()
    got = stored(serve.root, topic)
    assert [r.value for r in got] == [*expected, b"raw-9", b"raw-10", b"raw-11"]
    assert_consecutive(got)


# ---------------------------------------------------------------------------- 5. read_committed


def write_transactions(path: str, topic: str) -> None:
    """Offsets: 0 plain, 1-2 aborted (producer 7, gzip), 3 committed (producer 8), 4 ABORT 7,
    5 plain, 6 committed (8), 7 COMMIT 8, 8 open transaction (producer 9), 9 plain."""
    with pylog.open(path) as root:
        root.create_topic(topic, partitions=1)
        ts = now_ms() - 10_000

        def put(data: bytes) -> None:
            root.append_batches({(topic, 0): data})

        def plain(value: bytes) -> bytes:
            return codec.encode([value], key=[b"p"], timestamp=ts).tobytes()

        def txn(pid: int, seq: int, values: list[bytes], name: str = "none") -> bytes:
            return codec.encode(
                values,
                timestamp=ts,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq,
                is_transactional=True,
                codec=name,
            ).tobytes()

        put(plain(b"plain-0"))
        put(txn(7, 0, [b"aborted-1", b"aborted-2"], "gzip"))
        put(txn(8, 0, [b"committed-3"]))
        put(codec.control_batch(B.ABORT, offset=0, producer_id=7, producer_epoch=0, timestamp=ts))
        put(plain(b"plain-5"))
        put(txn(8, 1, [b"committed-6"]))
        put(codec.control_batch(B.COMMIT, offset=0, producer_id=8, producer_epoch=0, timestamp=ts))
        put(txn(9, 0, [b"open-8"]))
        put(plain(b"plain-9"))


COMMITTED = [(0, b"plain-0"), (3, b"committed-3"), (5, b"plain-5"), (6, b"committed-6")]
UNCOMMITTED = [
    (0, b"plain-0"),
    (1, b"aborted-1"),
    (2, b"aborted-2"),
    (3, b"committed-3"),
    (5, b"plain-5"),
    (6, b"committed-6"),
    (8, b"open-8"),
    (9, b"plain-9"),
]


def test_read_committed_hides_aborted_and_open_transactions(serve_factory: Any, tmp_path: Path) -> None:
    """librdkafka's default isolation.level is read_committed: it sees neither the aborted records
    nor anything from the open transaction on (the last stable offset); read_uncommitted sees
    every data record.  Both clients, over a log pylog wrote."""
    path, topic = str(tmp_path / "txn"), "txn"
    write_transactions(path, topic)
    serve = serve_factory(path)
    b = serve.bootstrap

    def pairs(recs: list[Rec]) -> list[tuple[int, bytes | None]]:
        return [(r.offset, r.value) for r in recs]

    assert pairs(ck_read(b, topic, {0: ck.OFFSET_BEGINNING})) == COMMITTED
    assert pairs(ck_read(b, topic, {0: 2})) == COMMITTED[1:]  # from inside the aborted batch
    uncommitted = ck_read(b, topic, {0: ck.OFFSET_BEGINNING}, **{"isolation.level": "read_uncommitted"})
    assert pairs(uncommitted) == UNCOMMITTED
    tp = ck.TopicPartition(topic, 0)
    for level, end in (("read_committed", 8), ("read_uncommitted", 10)):  # ListOffsets: the LSO or HW
        c = ck.Consumer({"bootstrap.servers": b, "group.id": "ends", "isolation.level": level})
        try:
            assert c.get_watermark_offsets(tp, timeout=30) == (0, end), level
        finally:
            c.close()
    if KCAT is None:
        pytest.skip("kcat is not on the PATH (Debian: apt-get install kcat); confluent-kafka checked")
    assert pairs(kcat_read(b, topic, "-o", "beginning")) == COMMITTED
    got = kcat_read(b, topic, "-o", "beginning", "-X", "isolation.level=read_uncommitted")
    assert pairs(got) == UNCOMMITTED
    assert KCAT is not None
    for level, end in (("read_committed", 8), ("read_uncommitted", 10)):  # where -o end starts
        args = ["-m", "30", "-C", "-b", b, "-t", topic, "-o", "end", "-e", "-X", f"isolation.level={level}"]
        proc = subprocess.run([KCAT, *args], capture_output=True, timeout=DEADLINE_S, check=False)
        assert proc.returncode == 0 and proc.stdout == b"", proc
        assert f"Reached end of topic {topic} [0] at offset {end}".encode() in proc.stderr, proc.stderr
