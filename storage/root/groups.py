"""One consumer group of a root: its committed offsets against the log ends, and its removal
(``kafka-consumer-groups.sh --describe --group`` and ``--delete --group``).

A group is its offsets file, ``pylog-consumer-offsets.<group>``, and the metadata strings a
Kafka consumer committed with them (:mod:`~pylog.storage.root.consumers`); the lag of a
partition is :func:`~pylog.storage.root.consumers.consumer_lag`'s, as ``pylog describe`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from pylog.storage.errors import UnknownGroupError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root.consumers import (
    consumer_lag,
    consumer_metadata_file,
    consumer_offsets_file,
    read_consumer_offsets,
)
from pylog.storage.root.metadata import root_step

if TYPE_CHECKING:
    from pylog.storage.root.manager import Root


class GroupPartition(TypedDict):
    topic: str
    partition: int
    committed_offset: int | None
    """None: the group committed no offset for this partition of a topic it consumes."""
    log_end_offset: int | None
    """None: the topic no longer exists."""
    lag: int | None
    """Records from the committed offset (0 without one) to the log end; None without a topic."""


class GroupInfo(TypedDict):
    group: str
    lag: int
    partitions: list[GroupPartition]


def _unknown(root: Root, group: str) -> UnknownGroupError:
    groups = sorted(read_consumer_offsets(root.storage))
    return UnknownGroupError(
        f"unknown consumer group {group!r} in {root.storage.describe()}; "
        f"groups: {', '.join(groups) or 'none'}"
    )


def describe_group(root: Root, group: str) -> GroupInfo:
    """Per partition of the topics ``group`` committed offsets for: the committed offset, the
    log end offset and the lag (every partition of those topics, as Kafka lists them)."""
    path = consumer_offsets_file(group)
    with root_step(root.storage, path, "read it"):
        if not root.storage.exists(path):
            raise _unknown(root, group)
        consumed = ckpt.read_offsets(root.storage, path)
    existing = set(root.topics())
    latest = {
        (t, p): root.log(t, p).log_end_offset
        for t in sorted({t for t, _ in consumed} & existing)
        for p in range(root.partitions(t))
    }
    lag = consumer_lag(consumed, latest)
    rows: list[GroupPartition] = [
        {
            "topic": t,
            "partition": p,
            "committed_offset": consumed.get((t, p)),
            "log_end_offset": latest.get((t, p)),
            "lag": lag.get((t, p)),
        }
        for t, p in sorted(set(latest) | set(consumed))
    ]
    return {"group": group, "lag": sum(lag.values()), "partitions": rows}


def delete_group(root: Root, group: str) -> None:
    """Remove ``group``'s offsets and metadata strings (one transaction on an object store).
    The root becomes the writer first: ``pylog serve``, which coordinates the groups, holds the
    lock while it runs.  A Spark query still running under that group id writes it again at its
    next commit."""

    def run() -> None:
        root.become_writer()
        path = consumer_offsets_file(group)
        with root_step(root.storage, path, "remove it"):
            if not root.storage.exists(path):
                raise _unknown(root, group)
            if root.storage.exists(consumer_metadata_file(group)):
                root.storage.delete(consumer_metadata_file(group))
            root.storage.delete(path)

    root.transaction(run)
