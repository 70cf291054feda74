"""``pylog serve`` keeps its root maintained as a broker does: a compacted topic is cleaned after
producers go quiet (no further append needed to trigger it), with Kafka's semantics."""

from __future__ import annotations

import time

import pytest

import pylog

ck = pytest.importorskip(
    "confluent_kafka", reason="confluent-kafka is a dev dependency (pip install '.[dev]')"
)
ck_admin = pytest.importorskip("confluent_kafka.admin", reason="confluent-kafka is a dev dependency")

DEADLINE_S = 120.0
KEYS = 5
RECORDS = 300


def test_a_compacted_topic_is_cleaned_after_the_producers_go_quiet(serve) -> None:
    admin = ck_admin.AdminClient({"bootstrap.servers": serve.bootstrap})
    config = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"}
    admin.create_topics([ck_admin.NewTopic("latest", 1, 1, config=config)])["latest"].result(60)
    p = ck.Producer({"bootstrap.servers": serve.bootstrap, "linger.ms": 0})
    for i in range(RECORDS):
        p.produce("latest", key=b"k%d" % (i % KEYS), value=b"v%d" % i)
        p.poll(0)
        if i % 20 == 19:
            assert p.flush(DEADLINE_S) == 0  # many commits: segments roll at 2 KiB
    assert p.flush(DEADLINE_S) == 0
    latest = {b"k%d" % k: b"v%d" % max(i for i in range(RECORDS) if i % KEYS == k) for k in range(KEYS)}
    deadline = time.monotonic() + DEADLINE_S
    while True:  # nothing else is produced: the server's own timer runs the cleaner
        with pylog.open(serve.root, read_only=True) as root:
            table = root.read_table("latest")
        if table.num_rows < RECORDS / 2:
            break
        assert time.monotonic() < deadline, f"still {table.num_rows} records after {DEADLINE_S} s"
        time.sleep(0.2)
    rows = list(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))
    offsets = table.column("offset").to_pylist()
    assert offsets == sorted(offsets) and offsets[-1] == RECORDS - 1  # offsets kept, the active tail kept
    assert {k: v for k, v in rows} == latest  # every key's latest value
    serve.stop()
