"""The topic metadata file of a root (``pylog-topics.json``): what it holds, and that a damaged
one is refused with an error naming it rather than opening a root with wrong partition counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pylog
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptMetadataError
from pylog.storage.root.metadata import TOPICS_FILE


def test_the_file_holds_partition_counts_and_only_non_default_configs(tmp_path: Path) -> None:
    with pylog.open(tmp_path) as root:
        root.create_topic("events", partitions=3, config={"retention.ms": 1000, "cleanup.policy": "delete"})
        root.add_partitions("events", 1)
        root.alter_config("events", {"segment.bytes": 4096})
    doc = json.loads((tmp_path / TOPICS_FILE).read_text())
    assert doc == {
        "version": 1,
        "topics": {"events": {"partitions": 4, "config": {"retention.ms": "1000", "segment.bytes": "4096"}}},
    }
    with pylog.open(tmp_path, read_only=True) as reader:
        assert reader.partitions("events") == 4
        assert reader.config("events").segment_bytes == 4096


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"version": 2, "topics": {}}',
        b'{"version": 1, "topics": []}',
        b'{"version": 1, "topics": {"events": {"config": {}}}}',
        b'{"version": 1, "topics": {"events": {"partitions": 0}}}',
        b'{"version": 1, "topics": {"events": {"partitions": "3"}}}',
        b'{"version": 1, "topics": {"events": {"partitions": 1, "config": ["retention.ms"]}}}',
    ],
)
def test_a_damaged_metadata_file_is_refused_naming_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / TOPICS_FILE).write_bytes(content)
    with pytest.raises(CorruptMetadataError, match=TOPICS_FILE):
        pylog.open(tmp_path, read_only=True)


def test_without_the_file_topics_are_inferred_from_partition_directories(tmp_path: Path) -> None:
    for d in ("orders-0", "orders-2", "my-topic-0", "not-a-partition", "x-1.tmp"):
        (tmp_path / d).mkdir()
    (tmp_path / "stray-7").write_bytes(b"")  # a file, not a partition directory
    with pylog.open(tmp_path, read_only=True) as root:
        assert root.topics() == ["my-topic", "orders"]
        assert root.partitions("orders") == 3 and root.partitions("my-topic") == 1
        assert root.config("orders") == LogConfig()
