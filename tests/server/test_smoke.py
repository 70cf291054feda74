"""The server starts, answers a client and stops cleanly."""

from __future__ import annotations

import pytest

import pylog

ck = pytest.importorskip(
    "confluent_kafka", reason="confluent-kafka is a dev dependency (pip install '.[dev]')"
)
ck_admin = pytest.importorskip("confluent_kafka.admin", reason="confluent-kafka is a dev dependency")


def test_produce_consume_and_a_clean_stop(serve) -> None:
    admin = ck_admin.AdminClient({"bootstrap.servers": serve.bootstrap})
    admin.create_topics([ck_admin.NewTopic("events", 2, 1)])["events"].result(30)
    p = ck.Producer({"bootstrap.servers": serve.bootstrap})
    acked = []
    for i in range(10):
        p.produce("events", key=b"k%d" % i, value=b"v%d" % i, on_delivery=lambda e, m: acked.append((e, m)))
    assert p.flush(30) == 0
    assert [e for e, _ in acked] == [None] * 10
    serve.stop()
    with pylog.open(serve.root, read_only=True) as root:
        table = root.read_table("events")
    assert sorted(table.column("value").to_pylist()) == sorted(b"v%d" % i for i in range(10))
