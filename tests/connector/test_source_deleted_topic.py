"""A streaming query subscribed to a topic that ``pylog delete-topic`` (Root.delete_topic)
deletes under it, on a real local SparkSession: as Spark's Kafka source, the deleted
partitions are data loss per failOnDataLoss; the other topics go on, and a topic created again
with the same name is read from offset 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pylog.storage.root.consumers import read_consumer_offsets
from tests.conftest import Backend
from tests.connector.source_helpers import Collector, append, start_stream


def fill(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", 2)
        root.create_topic("u", 1)
        append(root, "t", 0, 10)
        append(root, "t", 1, 5)
        append(root, "u", 0, 5)


def test_a_deleted_topic_is_skipped_as_lost_data_and_read_from_0_when_created_again(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    fill(backend)
    c = Collector()
    opts = {"subscribe": "t,u", "startingOffsets": "earliest", "failOnDataLoss": "false", "groupId": "q"}
    q = start_stream(spark, backend, tmp_path / "ck", c, **opts)
    try:
        q.processAllAvailable()
        assert len(c.rows()) == 20
        with backend.open() as root:
            assert root.delete_topic("t")
            append(root, "u", 0, 3)
        q.processAllAvailable()
        with backend.open() as root:
            root.create_topic("t", 1)
            append(root, "t", 0, 2)
        q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
    rows = c.rows()
    assert sorted((r[0], r[1], r[2]) for r in rows[20:]) == [("t", 0, 0), ("t", 0, 1)] + [
        ("u", 0, o) for o in range(5, 8)
    ]
    with backend.open(read_only=True) as root:  # the group's offsets of the old topic were dropped
        assert set(read_consumer_offsets(root.storage).get("q", {})) <= {("t", 0), ("u", 0)}


def test_a_deleted_topic_fails_the_query_naming_it_with_fail_on_data_loss(spark: Any, tmp_path: Path) -> None:
    backend = Backend("local", str(tmp_path / "root"))
    fill(backend)
    c = Collector()
    q = start_stream(spark, backend, tmp_path / "ck", c, subscribe="t,u", startingOffsets="earliest")
    try:
        q.processAllAvailable()
        with backend.open() as root:
            root.delete_topic("t")
        with pytest.raises(Exception, match=r"topic-partitions t-0, t-1 are gone \(deleted\)"):
            q.processAllAvailable()
    finally:
        q.stop()
