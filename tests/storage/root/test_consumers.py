"""Consumed-offset records of streaming queries (storage/root/consumers.py), on local disk and S3."""

from __future__ import annotations

import time

from pylog.storage.root.consumers import (
    CONSUMER_OFFSETS_RETENTION_MS,
    consumer_metadata_file,
    consumer_offsets_file,
    expire_consumer_offsets,
    read_consumer_metadata,
    read_consumer_offsets,
    write_consumer_metadata,
    write_consumer_offsets,
)
from tests.conftest import Backend


def test_records_of_groups_idle_for_the_retention_are_removed(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t")
        for g in ("ended-run", "this-run", "other"):
            write_consumer_offsets(root.storage, g, {("t", 0): 5})
        now = int(time.time() * 1000)
        assert expire_consumer_offsets(root.storage, now, keep="this-run") == []  # all fresh
        later = now + CONSUMER_OFFSETS_RETENTION_MS + 60_000
        assert sorted(expire_consumer_offsets(root.storage, later, keep="this-run")) == ["ended-run", "other"]
    with backend.open(read_only=True) as root:
        assert read_consumer_offsets(root.storage) == {"this-run": {("t", 0): 5}}


def test_kafka_group_ids_of_any_characters_and_their_metadata_round_trip(backend: Backend) -> None:
    """Kafka's group ids may hold any character: the file names encode them (never a path), the
    readers decode them; a group's committed metadata strings live beside its offsets and go
    with them when the group expires."""
    group = "team/app:1 ../x"
    with backend.open() as root:
        root.create_topic("t")
        write_consumer_metadata(root.storage, group, {("t", 0): "meta-0", ("t", 1): ""})
        write_consumer_offsets(root.storage, group, {("t", 0): 5, ("t", 1): 7})
        assert "/" not in consumer_offsets_file(group) and "/" not in consumer_metadata_file(group)
        assert read_consumer_offsets(root.storage) == {group: {("t", 0): 5, ("t", 1): 7}}
        assert read_consumer_metadata(root.storage, group) == {("t", 0): "meta-0"}
        later = int(time.time() * 1000) + CONSUMER_OFFSETS_RETENTION_MS + 60_000
        assert expire_consumer_offsets(root.storage, later, keep="another") == [group]
        assert not root.storage.exists(consumer_metadata_file(group))
        assert read_consumer_metadata(root.storage, group) == {}
