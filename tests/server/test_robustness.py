"""Bad input does not hurt a ``pylog serve`` process: a fuzz of its wire protocol under load.

One real server gets, from several threads at once and while a confluent-kafka producer
produces and is acknowledged:

* random bytes (size prefix included), frames that claim more bytes than are sent, size
  prefixes above 100 MiB or negative, frames shorter than a request header, unknown API keys,
  versions above and below the supported ranges, valid headers with garbage bodies, and
  structurally valid requests of every API and version with random field values, as sent and
  with a few bytes flipped or cut;
* compact arrays that claim 2**32 entries (kio's reader would reserve the memory first);
* the answers a broker owes: KIP-511's v0 reply to an ApiVersions of an unknown version,
  CORRUPT_MESSAGE for a bad CRC (and nothing appended), UNKNOWN_TOPIC_OR_PARTITION,
  OFFSET_OUT_OF_RANGE, UNSUPPORTED_FOR_MESSAGE_FORMAT for magic 0/1, MESSAGE_TOO_LARGE,
  a closed connection for a Fetch by topic id (v13+, not advertised);
* 500 connections open at once, each with an ApiVersions and a Metadata request pipelined.

Afterwards the server still serves a fresh client, its memory (VmRSS) and open files came
back near where they were, it stops cleanly (exit 0), every acknowledged record is in the root,
and its log holds no traceback: a bad frame is one info line.

The randomness is seeded (``SEED``, or ``PYLOG_FUZZ_SEED``); no fixed sleeps: every wait is
for an answer, an acknowledgement or a closed socket, with a deadline.  A soft RLIMIT_NOFILE
below 1000 is raised to 1000 for the 500 sockets (before the server starts: it inherits it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import os
import random
import resource
import select
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

import pylog

ck = pytest.importorskip(
    "confluent_kafka", reason="confluent-kafka is a dev dependency (pip install '.[dev]')"
)
ck_admin = pytest.importorskip("confluent_kafka.admin", reason="confluent-kafka is a dev dependency")
pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")

from kio.records.schema import NewRecordBatch, Record  # noqa: E402
from kio.records.writers import write_new_batch  # noqa: E402
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1  # noqa: E402
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402
from kio.serial._introspect import (  # noqa: E402
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from pylog.server import protocol  # noqa: E402
from pylog.server.context import make  # noqa: E402

SEED = int(os.environ.get("PYLOG_FUZZ_SEED", "20240611"))
"""The seed of every random choice; another one (PYLOG_FUZZ_SEED) explores other inputs."""
DEADLINE_S = 20.0
"""Longest wait for one answer or close: far above what a healthy server needs."""
CONCURRENT = 500
RSS_HEADROOM = 200 * 1024 * 1024

CORRUPT_MESSAGE, UNKNOWN_TOPIC, OUT_OF_RANGE, TOO_LARGE, UNSUPPORTED_VERSION, OLD_FORMAT = 2, 3, 1, 10, 35, 43

# ---------------------------------------------------------------------------- the wire


def frame_of(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def header_bytes(api_key: int, version: int, correlation: int, client_id: str | None = "robustness") -> bytes:
    entry = protocol.SUPPORTED[api_key]
    cls = RequestHeaderV2 if version >= entry[3] else RequestHeaderV1
    out = io.BytesIO()
    entity_writer(cls)(
        out,
        cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=correlation,
            client_id=client_id,
        ),
    )
    return out.getvalue()


def body_bytes(body: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    return out.getvalue()


def request(api_key: int, version: int, body: Any, correlation: int = 1) -> bytes:
    return frame_of(header_bytes(api_key, version, correlation) + body_bytes(body))


def req_mod(api_key: int, version: int) -> Any:
    return protocol.request_module(api_key, version)


def resp_mod(api_key: int, version: int) -> Any:
    return protocol.response_module(api_key, version)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes, or None if the server closed the connection first; fails at the deadline."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"no answer from the server in {DEADLINE_S} s ({len(buf)} of {n} bytes)"
        s.settimeout(left)
        try:
            chunk = s.recv(n - len(buf))
        except (ConnectionResetError, BrokenPipeError):
            return None
        except TimeoutError:
            continue
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(s: socket.socket, deadline: float) -> bytes | None:
    prefix = recv_exactly(s, 4, deadline)
    if prefix is None:
        return None
    (size,) = struct.unpack(">i", prefix)
    assert 4 <= size < 64 * 1024 * 1024, f"a response frame of {size} bytes"
    return recv_exactly(s, size, deadline)


def read_response(s: socket.socket, api_key: int, version: int, correlation: int = 1) -> Any:
    """The next response on ``s``, parsed as ``api_key`` v``version``'s (header checked)."""
    payload = recv_frame(s, time.monotonic() + DEADLINE_S)
    assert payload is not None, f"the server closed the connection instead of answering api {api_key}"
    (got,) = struct.unpack_from(">i", payload, 0)
    assert got == correlation
    pos = 4
    if api_key != protocol.API_VERSIONS and protocol.flexible(api_key, version):
        assert payload[pos] == 0  # no tagged fields in the response header
        pos += 1
    cls = getattr(resp_mod(api_key, version), protocol.SUPPORTED[api_key][0] + "Response")
    body, _ = entity_reader(cls)(memoryview(payload), pos)
    return body


def wait_closed(s: socket.socket, deadline: float | None = None) -> bytes:
    """Everything the server still sends, until it closes the connection (fails at the deadline)."""
    deadline = deadline or time.monotonic() + DEADLINE_S
    got = bytearray()
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the server kept the connection open for {DEADLINE_S} s"
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return bytes(got)
        except TimeoutError:
            continue
        if not chunk:
            return bytes(got)
        got += chunk


def send_and_close_write(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # closed already: checked next
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)


# ---------------------------------------------------------------------------- record sets


def batch(values: list[bytes], key: bytes | None = b"k") -> bytes:
    now = dt.datetime.now(dt.timezone.utc)
    recs = tuple(
        Record(attributes=0, timestamp=now, offset=i, key=key, value=v, headers=())
        for i, v in enumerate(values)
    )
    out = io.BytesIO()
    write_new_batch(
        out, NewRecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, records=recs, attributes=0)
    )
    return out.getvalue()


def legacy_message(magic: int, key: bytes, value: bytes) -> bytes:
    """One magic 0 or 1 message (a Kafka 0.10 message set entry), with its CRC-32 right."""
    body = struct.pack(">bb", magic, 0)
    if magic == 1:
        body += struct.pack(">q", int(time.time() * 1000))
    body += struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def produce_request(topic: str, sets: dict[int, bytes], correlation: int = 1, version: int = 9) -> bytes:
    m = req_mod(0, version)
    body = make(
        m,
        "ProduceRequest",
        transactional_id=None,
        acks=-1,
        timeout=dt.timedelta(seconds=10),
        topic_data=(
            make(
                m,
                "TopicProduceData",
                name=topic,
                partition_data=tuple(
                    make(m, "PartitionProduceData", index=p, records=r) for p, r in sets.items()
                ),
            ),
        ),
    )
    return request(0, version, body, correlation)


def produce_codes(s: socket.socket, topic: str, sets: dict[int, bytes], version: int = 9) -> dict[int, int]:
    s.sendall(produce_request(topic, sets, version=version))
    resp = read_response(s, 0, version)
    return {int(p.index): int(p.error_code) for t in resp.responses for p in t.partition_responses}


def fetch_request(topic: str, partition: int, offset: int, version: int = 12) -> bytes:
    m = req_mod(1, version)
    body = make(
        m,
        "FetchRequest",
        cluster_id=None,
        replica_id=-1,
        replica_state=None,
        max_wait=dt.timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            make(
                m,
                "FetchTopic",
                topic=topic,
                topic_id=uuid.UUID(int=0),
                partitions=(
                    make(
                        m,
                        "FetchPartition",
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                        replica_directory_id=uuid.UUID(int=0),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    return request(1, version, body)


def fetch_one(s: socket.socket, topic: str, partition: int, offset: int) -> Any:
    s.sendall(fetch_request(topic, partition, offset))
    resp = read_response(s, 1, 12)
    assert resp.error_code == 0
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def api_versions_request(correlation: int = 1, version: int = 3) -> bytes:
    m = req_mod(18, version)
    body = make(m, "ApiVersionsRequest", client_software_name="robustness", client_software_version="1.0")
    return request(18, version, body, correlation)


def metadata_request(correlation: int = 2, version: int = 12) -> bytes:
    m = req_mod(3, version)
    body = make(
        m,
        "MetadataRequest",
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    return request(3, version, body, correlation)


# ---------------------------------------------------------------------------- random requests


def _sample_primitive(kafka_type: str, rng: random.Random) -> Any:
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16"):
        return rng.choice([-1, 0, 0, 1, 2, 3] if kafka_type != "uint16" else [0, 1, 2])
    if kafka_type == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    if kafka_type == "float64":
        return rng.random()
    if kafka_type == "string":
        return rng.choice(["fuzz", "fuzz", "", "group-fuzz", "unknown-topic", "x" * rng.randrange(1, 300)])
    if kafka_type == "bytes":
        return rng.randbytes(rng.randrange(0, 40))
    if kafka_type == "records":
        return rng.choice([batch([b"fuzzed"]), rng.randbytes(rng.randrange(0, 100)), b""])
    if kafka_type == "uuid":
        return rng.choice([uuid.UUID(int=0), uuid.UUID(int=rng.getrandbits(128))])
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return dt.timedelta(milliseconds=rng.choice([0, 1, 5, 50]))
    if kafka_type == "datetime_i64":
        return dt.datetime.now(dt.timezone.utc)
    raise AssertionError(f"no sampler for {kafka_type}")


def sample(cls: type, rng: random.Random, depth: int = 0) -> Any:
    """An instance of the kio dataclass ``cls`` with random (mostly small, plausible) values."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        if is_optional(f) and rng.random() < 0.15:
            values[f.name] = None
        elif isinstance(kind, EntityTupleField):
            n = rng.choice([0, 1, 1, 2]) if depth < 3 else 0
            values[f.name] = tuple(sample(kind.type_, rng, depth + 1) for _ in range(n))
        elif isinstance(kind, EntityField):
            values[f.name] = sample(kind.type_, rng, depth + 1)
        elif isinstance(kind, PrimitiveTupleField):
            values[f.name] = tuple(
                _sample_primitive(f.metadata["kafka_type"], rng) for _ in range(rng.choice([0, 1, 2]))
            )
        else:
            values[f.name] = _sample_primitive(f.metadata["kafka_type"], rng)
    return cls(**values)


def accepted(api_key: int) -> tuple[int, int]:
    """The versions of an API the server parses (some low ones are advertised only, KIP-896)."""
    _, lo, hi, _f = protocol.SUPPORTED[api_key]
    return max(lo, getattr(protocol, "ADVERTISED_ONLY", {}).get(api_key, lo)), hi


def random_request(rng: random.Random, correlation: int) -> tuple[int, int, bytes]:
    """A structurally valid request of a random supported API and version, random values."""
    api_key = rng.choice(sorted(protocol.SUPPORTED))
    name = protocol.SUPPORTED[api_key][0]
    version = rng.randint(*accepted(api_key))
    body = sample(getattr(req_mod(api_key, version), name + "Request"), rng)
    return api_key, version, header_bytes(api_key, version, correlation) + body_bytes(body)


def mutate(payload: bytes, rng: random.Random) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.6 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op < 0.8 and len(data) > 8:
            del data[rng.randrange(8, len(data)) :]
        else:
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.randbytes(rng.randint(1, 8))
    return bytes(data)


# ---------------------------------------------------------------------------- the server's process


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not waiting for a fixed time


@pytest.fixture
def nofile() -> Iterator[None]:
    """Room for 500 sockets in this process and in the server it starts (which inherits the
    limit): a soft RLIMIT_NOFILE below 1000 is raised to 1000 for the test (skipped if the hard
    limit does not allow it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CONCURRENT + 500
    if soft == resource.RLIM_INFINITY or soft >= want:
        yield
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} leaves no room for {CONCURRENT} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def server(nofile: None, serve_factory: Any) -> Any:
    return serve_factory()


# ---------------------------------------------------------------------------- a producer throughout


class BackgroundProducer:
    """A confluent-kafka producer producing to ``topic`` on a thread until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.p = ck.Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True}
        )
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(msg.value())
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        while not self._stop.is_set() and self.sent < 50_000:
            for _ in range(20):
                self.p.produce(
                    self.topic,
                    key=b"k%d" % (self.sent % 7),
                    value=b"acked-%d" % self.sent,
                    on_delivery=self._delivered,
                )
                self.sent += 1
            self.p.poll(0.02)

    def start(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive()
        assert self.p.flush(DEADLINE_S * 2) == 0, "the producer's records were not all acknowledged"


# ---------------------------------------------------------------------------- the cases


def check_broker_answers(port: int) -> None:
    """The replies a broker owes to requests that are well formed but wrong."""
    s = connect(port)
    try:
        # a bad CRC in one partition: CORRUPT_MESSAGE there, nothing appended; the other one appended
        bad = bytearray(batch([b"corrupt-crc"]))
        bad[-3] ^= 0xFF  # inside the value, after the CRC field
        codes = produce_codes(s, "probe", {0: bytes(bad), 1: batch([b"good-1"])})
        assert codes == {0: CORRUPT_MESSAGE, 1: 0}
        assert fetch_one(s, "probe", 0, 0).high_watermark == 0
        assert fetch_one(s, "probe", 1, 0).high_watermark == 1
        # a truncated batch, and bytes that are no batch: CORRUPT_MESSAGE
        good = batch([b"corrupt-cut"])
        assert produce_codes(s, "probe", {0: good[:-5]}) == {0: CORRUPT_MESSAGE}
        assert produce_codes(s, "probe", {0: b"\x00" * 70}) == {0: CORRUPT_MESSAGE}
        # unknown topic, unknown partition
        assert produce_codes(s, "no-such-topic", {0: batch([b"nowhere"])}) == {0: UNKNOWN_TOPIC}
        assert produce_codes(s, "probe", {7: batch([b"nowhere"])}) == {7: UNKNOWN_TOPIC}
        # magic 0 and 1 message sets
        for magic in (0, 1):
            got = produce_codes(s, "probe", {0: legacy_message(magic, b"k", b"old-format")})
            assert got == {0: OLD_FORMAT}, f"magic {magic}: {got}"
        # a batch above max.message.bytes (1024 on "small")
        assert produce_codes(s, "small", {0: batch([b"x" * 2000])}) == {0: TOO_LARGE}
        assert produce_codes(s, "small", {0: batch([b"fits"])}) == {0: 0}
        assert fetch_one(s, "probe", 0, 0).high_watermark == 0  # none of the refused sets appended
        # fetches out of range, above the end and below the start
        for offset in (1_000_000, -5):
            p = fetch_one(s, "probe", 1, offset)
            assert p.error_code == OUT_OF_RANGE, offset
        p = fetch_one(s, "no-such-topic", 0, 0)
        assert p.error_code == UNKNOWN_TOPIC
        # the connection still serves after all of that
        s.sendall(api_versions_request())
        assert read_response(s, 18, 3).error_code == 0
    finally:
        s.close()
    # Fetch v13+ names topics by id: topics have none here (Metadata gives the zero id), so those
    # versions are not advertised, and a request of one closes its connection like any version
    # not served
    s = connect(port)
    try:
        s.sendall(fetch_request("probe", 1, 0, version=13))
        assert s.recv(1) == b""
    finally:
        s.close()


def check_unknown_api_versions(port: int) -> None:
    """KIP-511: ApiVersions of a version above the supported ones gets v0's reply with
    UNSUPPORTED_VERSION and the supported ranges; the connection stays usable."""
    expected = [(k, lo, hi) for k, (_, lo, hi, _f) in sorted(protocol.SUPPORTED.items())]
    for version in (5, 77, 32767):
        s = connect(port)
        try:
            header = (
                struct.pack(">hhih", 18, version, 4242, 3)
                + b"cli"
                + b"\x00"
                + b"garbage-body-of-v%d" % version
            )
            s.sendall(frame_of(header))
            payload = recv_frame(s, time.monotonic() + DEADLINE_S)
            assert payload is not None, f"ApiVersions v{version}: closed without the KIP-511 reply"
            correlation, code, n = struct.unpack_from(">ihi", payload, 0)
            assert (correlation, code, n) == (4242, UNSUPPORTED_VERSION, len(expected))
            ranges = [struct.unpack_from(">hhh", payload, 10 + 6 * i) for i in range(n)]
            assert ranges == expected
            assert len(payload) == 10 + 6 * n
            s.sendall(api_versions_request(correlation=5))  # the client retries with a known version
            assert read_response(s, 18, 3, correlation=5).error_code == 0
        finally:
            s.close()


def bad_frames(rng: random.Random) -> list[tuple[str, bytes]]:
    """Frames that cannot be requests this server reads: it must close the connection on its
    own, answering nothing."""
    out: list[tuple[str, bytes]] = []
    for size in (protocol.MAX_FRAME + 1, 0x7FFFFFFF, -1, -(2**31), -8):
        out.append((f"size prefix {size}", struct.pack(">i", size) + rng.randbytes(64)))
    for size in range(8):
        out.append((f"a frame of {size} bytes", frame_of(rng.randbytes(size))))
    out.append(("a header cut in its client_id", frame_of(struct.pack(">hhih", 3, 1, 1, 50) + b"abc")))
    out.append(("a bad client_id length", frame_of(struct.pack(">hhih", 3, 1, 1, 32000))))
    cut = frame_of(struct.pack(">hhih", 3, 12, 1, -1) + b"\x05")
    out.append(("a flexible header cut in its tagged fields", cut))
    # compact arrays (flexible versions) that claim 2**32 - 2 entries: kio would reserve room
    # for them before reading one (a failed allocation aborts the process)
    huge = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])
    out.append(("Metadata v12 of 2**32 topics", frame_of(header_bytes(3, 12, 1) + huge)))
    nested = header_bytes(9, 7, 1) + b"\x02g" + b"\x02" + b"\x02t" + huge  # OffsetFetch partitions
    out.append(("OffsetFetch v7 of 2**32 partitions", frame_of(nested)))
    for key in (-1, 17, 36, 68, 1000, 32767):
        out.append((f"api key {key}", frame_of(struct.pack(">hhih", key, 0, 1, -1) + rng.randbytes(20))))
    for key in protocol.SUPPORTED:
        if key == protocol.API_VERSIONS:
            continue
        lo, hi = accepted(key)
        for version in sorted({lo - 1, -1, hi + 1, 32767}):
            header = struct.pack(">hhih", key, version, 1, -1)
            out.append((f"api {key} v{version}", frame_of(header + rng.randbytes(30))))
    return out


def run_bad_frame(port: int, what: str, data: bytes) -> None:
    s = connect(port)
    try:
        try:
            s.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            return
        got = wait_closed(s)  # no half-close: the server closes by itself
        assert got == b"", f"{what}: the server answered {got[:100]!r}"
    finally:
        s.close()


def run_fuzz_connection(port: int, seed: int) -> int:
    """One connection of random input; the server answers what it can, and closes the
    connection when we stop writing (or earlier, on a bad frame).  Returns frames answered."""
    rng = random.Random(seed)
    kind = rng.choice(
        ["random", "random", "garbage-body", "valid", "mutated", "mutated", "truncated", "pipelined"]
    )
    parts: list[bytes] = []
    if kind == "random":  # anything, size prefix included
        parts.append(rng.randbytes(rng.randrange(0, 200)))
    elif kind == "garbage-body":  # a valid header of a supported API and version, a random body
        key = rng.choice(sorted(protocol.SUPPORTED))
        v = rng.randint(*accepted(key))
        parts.append(frame_of(header_bytes(key, v, 1) + rng.randbytes(rng.randrange(0, 300))))
    elif kind in ("valid", "mutated", "pipelined"):
        for i in range(rng.randint(1, 4)):
            _, _, payload = random_request(rng, i)
            if kind == "mutated" or (kind == "pipelined" and rng.random() < 0.3):
                payload = mutate(payload, rng)
            parts.append(frame_of(payload))
    else:  # truncated: a frame that claims more than is sent
        _, _, payload = random_request(rng, 1)
        parts.append(frame_of(payload)[: rng.randrange(1, len(payload) + 4)])
    s = connect(port)
    try:
        send_and_close_write(s, b"".join(parts))
        got = wait_closed(s)
    finally:
        s.close()
    frames, pos = 0, 0
    while pos + 4 <= len(got):
        (size,) = struct.unpack_from(">i", got, pos)
        pos += 4 + size
        frames += 1
    return frames


def run_truncated_and_gone(port: int, rng: random.Random) -> None:
    """A frame that claims more bytes than are sent, then a close (no half-close, no reading)."""
    s = connect(port)
    try:
        s.sendall(struct.pack(">i", rng.choice([1000, 1 << 20, protocol.MAX_FRAME])) + rng.randbytes(10))
    finally:
        s.close()


def run_large_garbage(port: int, rng: random.Random) -> None:
    """A 16 MiB Produce frame whose body is garbage: read whole, refused, the buffer freed."""
    payload = header_bytes(0, 9, 1) + rng.randbytes(16 * 1024 * 1024)
    s = connect(port)
    try:
        send_and_close_write(s, frame_of(payload))
        assert wait_closed(s) == b""
    finally:
        s.close()


def run_pipelined_bad_after_good(port: int, rng: random.Random) -> None:
    """Good requests, then a bad one, then many more good and bad ones: the good ones before the
    bad one are answered in order before the close; what follows it (read ahead, up to 64
    requests) is dropped without a trace in the log."""

    def bad() -> bytes:
        return rng.choice(
            [
                frame_of(struct.pack(">hhih", 1000, 0, 3, -1)),
                frame_of(struct.pack(">hhih", 3, 99, 3, -1)),
                frame_of(header_bytes(3, 1, 3) + rng.randbytes(9)),
            ]
        )

    good = api_versions_request(correlation=1) + metadata_request(correlation=2)
    tail = b"".join(metadata_request(correlation=10 + i) if i % 2 else bad() for i in range(200))
    s = connect(port)
    try:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(good + bad() + tail)
        assert read_response(s, 18, 3, correlation=1).error_code == 0
        assert read_response(s, 3, 12, correlation=2).brokers[0].port == port
        wait_closed(s)
    finally:
        s.close()


def check_many_connections(port: int) -> None:
    """500 sockets open at once, each pipelining ApiVersions + Metadata; every one answered."""
    socks: list[socket.socket] = []
    try:
        for _ in range(CONCURRENT):
            socks.append(connect(port))
        data = api_versions_request(correlation=1) + metadata_request(correlation=2)
        for s in socks:
            s.sendall(data)
        pending = {s.fileno(): (s, bytearray()) for s in socks}
        deadline = time.monotonic() + DEADLINE_S * 2
        done = 0
        while pending:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(pending)} of {CONCURRENT} connections unanswered"
            ready, _, _ = select.select(list(pending)[:1000], [], [], min(left, 1.0))
            for fd in ready:
                s, buf = pending[fd]
                chunk = s.recv(1 << 16)
                assert chunk, "the server closed a connection that sent valid requests"
                buf += chunk
                if _frames_complete(buf) >= 2:
                    del pending[fd]
                    done += 1
        for s in socks[:: CONCURRENT // 20]:  # a sample of them, parsed in full
            s.sendall(api_versions_request(correlation=7) + metadata_request(correlation=8))
            assert read_response(s, 18, 3, correlation=7).error_code == 0
            md = read_response(s, 3, 12, correlation=8)
            assert {t.name for t in md.topics} >= {"events", "probe"}
        assert done == CONCURRENT
    finally:
        for s in socks:
            s.close()


def _frames_complete(buf: bytearray) -> int:
    n, pos = 0, 0
    while pos + 4 <= len(buf):
        (size,) = struct.unpack_from(">i", buf, pos)
        if pos + 4 + size > len(buf):
            break
        pos += 4 + size
        n += 1
    return n


def check_fresh_client(bootstrap: str) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap})
    acked: list[Any] = []
    p.produce("fresh", key=b"k", value=b"after-the-fuzz", on_delivery=lambda e, m: acked.append(e))
    assert p.flush(DEADLINE_S) == 0 and acked == [None]
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "robustness-fresh", "enable.auto.commit": False}
    )
    try:
        c.assign([ck.TopicPartition("fresh", 0, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert time.monotonic() < deadline, "a fresh consumer read nothing"
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                assert msg.value() == b"after-the-fuzz"
                break
    finally:
        c.close()


# ---------------------------------------------------------------------------- the test


def test_bad_input_under_load(server: Any) -> None:
    rng = random.Random(SEED)
    admin = ck_admin.AdminClient({"bootstrap.servers": server.bootstrap})
    topics = [
        ck_admin.NewTopic("events", 2, 1),
        ck_admin.NewTopic("probe", 2, 1),
        ck_admin.NewTopic("fuzz", 2, 1),
        ck_admin.NewTopic("fresh", 1, 1),
        ck_admin.NewTopic("small", 1, 1, config={"max.message.bytes": "1024"}),
    ]
    for f in admin.create_topics(topics).values():
        f.result(DEADLINE_S)
    pid = server.proc.pid

    producer = BackgroundProducer(server.bootstrap, "events").start()
    wait_until(lambda: len(producer.acked) > 0, "the producer's first acknowledgement")
    check_many_connections(server.port)  # warms up what the server keeps (kio's modules, buffers)
    rss_before, files_before = rss(pid), open_files(pid)
    acked_before = len(producer.acked)

    check_broker_answers(server.port)
    check_unknown_api_versions(server.port)
    port = server.port
    bad = bad_frames(rng)
    n_bad = len(bad)
    jobs: list[Callable[[], Any]] = [partial(run_bad_frame, port, *case) for case in bad]
    jobs += [partial(run_fuzz_connection, port, SEED + i) for i in range(600)]
    jobs += [partial(run_truncated_and_gone, port, random.Random(SEED - i)) for i in range(30)]
    jobs += [partial(run_pipelined_bad_after_good, port, random.Random(SEED * 3 + i)) for i in range(10)]
    jobs += [partial(run_large_garbage, port, random.Random(SEED * 7 + i)) for i in range(3)]
    random.Random(SEED).shuffle(jobs)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(job) for job in jobs]
        check_many_connections(server.port)  # while the fuzz goes on
        for fut in futures:
            fut.result()
    s = connect(server.port)
    try:
        assert fetch_one(s, "probe", 0, 0).high_watermark == 0  # the fuzz appended nothing there
    finally:
        s.close()

    check_fresh_client(server.bootstrap)
    assert len(producer.acked) > acked_before, "the producer made no progress during the fuzz"
    wait_until(lambda: open_files(pid) <= files_before + 5, f"open files back to {files_before}")
    rss_after = rss(pid)
    assert rss_after - rss_before < RSS_HEADROOM, (
        f"VmRSS grew from {rss_before >> 20} to {rss_after >> 20} MiB"
    )
    producer.stop()
    assert producer.failed == []

    server.stop()  # exit 0
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, _first_errors(log)
    closing = [line for line in log.splitlines() if "closing" in line and "connection" in line]
    assert len(closing) >= n_bad and all(" INFO " in line for line in closing)
    with pylog.open(server.root, read_only=True) as root:
        events = root.read_table("events").column("value").to_pylist()
        probe = root.read_table("probe").column("value").to_pylist()
        small = root.read_table("small").column("value").to_pylist()
    assert len(events) == len(set(events)), "a record was stored twice"
    missing = set(producer.acked) - set(events)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    assert probe == [b"good-1"]
    assert small == [b"fits"]


def _first_errors(log: str) -> str:
    """The first few tracebacks and error lines of a server log, for a failure's message."""
    lines = log.splitlines()
    hits = [i for i, line in enumerate(lines) if "Traceback" in line or " ERROR " in line]
    return "\n---\n".join("\n".join(lines[max(0, i - 1) : i + 25]) for i in hits[:3])
