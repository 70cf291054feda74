"""``pylog serve`` over a root on local disk and on an S3 server: concurrent producers' requests
share commits, and what was acknowledged is read back exactly once, by the Python API and by a
consumer group across a restart of the server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

ck = pytest.importorskip(
    "confluent_kafka", reason="confluent-kafka is a dev dependency (pip install '.[dev]')"
)
ck_admin = pytest.importorskip("confluent_kafka.admin", reason="confluent-kafka is a dev dependency")

PRODUCERS = 8
PER_PRODUCER = 25
DEADLINE_S = 120.0


def _produce_one_at_a_time(bootstrap: str, n: int, who: int, acked: list[bytes]) -> None:
    """One request in flight per producer: each record is flushed before the next."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    errors: list[Any] = []
    for i in range(n):
        value = b"p%d-%d" % (who, i)
        p.produce("events", key=b"k%d" % (i % 5), value=value, on_delivery=lambda e, m: errors.append(e))
        assert p.flush(DEADLINE_S) == 0
        assert errors == [None] * (i + 1), errors
        acked.append(value)


def _consume_all(bootstrap: str, group: str, expected: int) -> list[bytes]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe(["events"])
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < expected and time.monotonic() < deadline:
        for m in c.consume(100, timeout=0.5):
            assert m.error() is None, m.error()
            got.append(m.value())
        if got:
            c.commit(asynchronous=False)
    c.close()
    return got


def _produce_requests_logged(serve: Any, at_least: int) -> int:
    """The Produce requests the server counted (its ``--metrics`` lines), once at least ``at_least``."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        counts = [int(x.split("=")[1]) for x in serve.log().split() if x.startswith("Produce=")]
        if counts and max(counts) >= at_least:
            return max(counts)
        assert time.monotonic() < deadline, f"the server's metrics never counted {at_least} produce requests"
        time.sleep(0.05)


def test_concurrent_producers_share_commits_and_a_group_resumes_after_a_restart(
    serve_factory, backend
) -> None:
    serve = serve_factory(backend.url, storage_options=backend.options, extra=["--metrics", "0.1"])
    admin = ck_admin.AdminClient({"bootstrap.servers": serve.bootstrap})
    admin.create_topics([ck_admin.NewTopic("events", 3, 1)])["events"].result(60)
    acked: list[bytes] = []
    threads = [
        threading.Thread(target=_produce_one_at_a_time, args=(serve.bootstrap, PER_PRODUCER, i, acked))
        for i in range(PRODUCERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert len(acked) == PRODUCERS * PER_PRODUCER

    requests = _produce_requests_logged(serve, PRODUCERS * PER_PRODUCER)
    half = _consume_all(serve.bootstrap, "readers", len(acked))
    assert sorted(half) == sorted(acked)
    serve.restart()  # committed offsets are in the root: the group resumes after them
    extra = b"after-restart"
    p = ck.Producer({"bootstrap.servers": serve.bootstrap})
    p.produce("events", value=extra)
    assert p.flush(DEADLINE_S) == 0
    assert _consume_all(serve.bootstrap, "readers", 1) == [extra]
    serve.stop()

    with backend.open(read_only=True) as root:
        stored = root.read_table("events").column("value").to_pylist()
    assert sorted(stored) == sorted([*acked, extra])
    if not backend.is_local:
        # every commit is one object of the commit log: fewer commits than produce requests
        fs = backend.server.filesystem()
        commits = len(fs.ls(f"{backend.url[len('s3://') :]}/_pylog/log"))
        assert commits < 0.9 * requests, (commits, requests)
