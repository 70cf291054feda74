"""Consumed-offset records of streaming queries (storage/root/consumers.py), on local disk and S3."""

from __future__ import annotations

import time

from pylog.storage.root.consumers import (
    CONSUMER_OFFSETS_RETENTION_MS,
    expire_consumer_offsets,
    read_consumer_offsets,
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
