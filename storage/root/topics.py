"""Deleting a topic of a root (Kafka's ``DeleteTopics``, ``kafka-topics.sh --delete``).

A reader sees a topic whole or not at all: it learns the topics from ``pylog-topics.json``,
which is replaced atomically, so the topic is gone for readers the moment its entry is. On local
disk the deletion runs in steps, each durable before the next (the names in quotes are its
:class:`~pylog.storage.faults.Faults` steps)::

    1. <root>/pylog-deleting-topics names the topic: the intent       "delete-intent-written"
    2. pylog-topics.json without the topic   (readers no longer see it) "topic-removed"
    3. the topic's high watermarks, checkpoint entries and the consumer groups' offsets of its
       partitions dropped (Kafka removes a deleted topic's committed offsets) "topic-state-dropped"
    4. each <topic>-<partition>/ directory emptied and removed          "partition-deleted"
    5. the topic taken out of the intent file (removed when empty)   "topic-deleted"

Kafka renames the partition directories to ``<topic>-<p>.<uuid>-delete`` and removes them in
the background; pylog removes them at once (a root has no background threads) and records the
intent in one file instead (one fixed name: a writer's open checks for it without listing the
root), so a crash at any step leaves a root that opens: before step 2 it
still has the topic whole, and the next writer (:func:`finish_deletes`, run when a root becomes
the writer, and so also by ``pylog recover``) completes a deletion whose intent file it finds.
A directory ``<topic>-<p>`` is only ever removed for a topic named by an intent file, never
because no metadata names it (a partition directory copied into the root is data).

On an object store the deletion is one transaction (one manifest commit): readers and the
next writer see the topic whole or gone, and no intent file is ever published.  The consumer
groups' offsets are objects outside the manifest there (each rewritten by one PUT), so they are
rewritten after the commit: a crash between the two leaves the groups' offsets of the deleted
topic in place, until a topic of that name is created (:func:`finish_delete` drops them then).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from typing import Protocol, TypeVar

from pylog.storage.backends.base import Storage, join
from pylog.storage.errors import PylogError, StorageError
from pylog.storage.faults import Faults
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.log import Log
from pylog.storage.root import publish as pub
from pylog.storage.root.consumers import (
    consumer_metadata_file,
    consumer_offsets_file,
    read_consumer_metadata,
    read_consumer_offsets,
    write_consumer_metadata,
    write_consumer_offsets,
)
from pylog.storage.root.metadata import TopicMetadata, root_step

T = TypeVar("T")


class Root(Protocol):
    """What a deletion uses of :class:`~pylog.storage.root.manager.Root` (which imports this
    module: no import back)."""

    storage: Storage
    faults: Faults
    _meta: TopicMetadata
    _logs: dict[tuple[str, int], Log]
    _state: pub.PublishState
    _recovery_points: dict[tuple[str, int], int]
    _start_offsets: dict[tuple[str, int], int]

    @property
    def transactional(self) -> bool: ...

    def transaction(self, fn: Callable[[], T]) -> T: ...

    def _ensure_writer(self) -> None: ...

    def checkpoint(self) -> None: ...


INTENT_FILE = "pylog-deleting-topics"
"""The topics whose deletion is under way, as JSON ``{"topics": [...]}`` (a file, which Kafka
never takes for a partition directory); absent when no deletion is under way."""


def pending_deletes(storage: Storage) -> list[str]:
    """The topics whose deletion is under way or was interrupted by a crash (the intent file)."""
    with root_step(storage, INTENT_FILE, "check whether it exists"):
        if not storage.exists(INTENT_FILE):
            return []
    with root_step(storage, INTENT_FILE, "read it"):
        data = storage.read(INTENT_FILE)
    try:
        topics = json.loads(data)["topics"]
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise TypeError("topics is not a list of names")
    except (ValueError, KeyError, TypeError) as e:
        raise StorageError(
            f"{storage.describe()}/{INTENT_FILE}: not a list of topics being deleted ({e}); it is "
            "written atomically, so it was changed by hand: restore it or remove it"
        ) from e
    return sorted(set(topics))


def _write_intents(storage: Storage, topics: list[str]) -> None:
    if topics:
        with root_step(storage, INTENT_FILE, "write it"):
            storage.write_atomic(INTENT_FILE, json.dumps({"topics": sorted(topics)}).encode())
    else:
        with root_step(storage, INTENT_FILE, "remove it"):
            if storage.exists(INTENT_FILE):
                storage.delete(INTENT_FILE)


def delete_topic(root: Root, name: str, *, if_exists: bool = False) -> bool:
    """Delete topic ``name`` with its partitions' data and its consumer groups' offsets; see
    the module's docstring for the steps.  Returns False when there is no such topic and
    ``if_exists``; without it an unknown topic is an :class:`UnknownTopicError` naming it."""
    deleted = root.transaction(lambda: _delete(root, name, if_exists))
    if deleted and root.transactional:
        _drop_group_offsets(root.storage, name)
    return deleted


def _delete(root: Root, name: str, if_exists: bool) -> bool:
    root._ensure_writer()
    if name not in root._meta:
        if if_exists:
            return False
        root._meta.entry(name)  # raises UnknownTopicError, naming the topic and the root's topics
    storage = root.storage
    _write_intents(storage, [*pending_deletes(storage), name])
    root.faults.step("delete-intent-written")
    _finish(root, name)
    return True


def finish_delete(root: Root, name: str) -> None:
    """Run before ``name`` is created: complete its deletion if one failed midway in this
    process (its intent file is there), so that the new topic takes none of the old
    partitions' files and the next writer does not delete it; and drop the groups' offsets
    left for a topic of that name (on an object store, by a crash between a deletion's commit
    and their rewrite), so that its consumers do not skip its first records."""
    if name in pending_deletes(root.storage):
        _finish(root, name)
    elif root.transactional and name not in root._meta:  # (on local disk the intent file covers it)
        _drop_group_offsets(root.storage, name)


def finish_deletes(root: Root) -> list[str]:
    """Complete the deletions a crash interrupted (run by a root that just became the writer:
    one check for the intent file, no listing of the root).  Returns the topics deleted."""
    pending = pending_deletes(root.storage)
    for topic in pending:
        _finish(root, topic)
    return pending


def _finish(root: Root, name: str) -> None:
    """Steps 2-5 of the deletion of ``name``, whose intent file exists; each is idempotent."""
    storage = root.storage
    root._meta.remove_topic(name)
    root.faults.step("topic-removed")
    for key in [k for k in root._logs if k[0] == name]:
        lg = root._logs.pop(key)
        lg._failed = lg._failed or PylogError(f"topic {name!r} was deleted")
        with contextlib.suppress(Exception):  # its files are removed next: nothing to keep
            lg.close()
    _drop_state(root, name)
    root.faults.step("topic-state-dropped")
    pattern = re.compile(rf"^{re.escape(name)}-(\d+)$")
    with root_step(storage, "", "list the partition directories of"):
        dirs = sorted(
            (int(m[1]), n) for n in storage.listdir("") if (m := pattern.match(n)) and storage.isdir(n)
        )
    for _, directory in dirs:
        with root_step(storage, directory, "remove it"):
            _remove_tree(storage, directory)
        root.faults.step("partition-deleted")
    with root_step(storage, "", "sync"):
        storage.fsync_dir("")
    _write_intents(storage, [t for t in pending_deletes(storage) if t != name])
    root.faults.step("topic-deleted")


def _drop_state(root: Root, name: str) -> None:
    """Forget the partitions of ``name`` in the state file, the checkpoints and the consumer
    groups' offsets (a topic created later with the same name starts from nothing)."""
    storage = root.storage

    def of_topic(d: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
        return [k for k in d if k[0] == name]

    hws = root._state.high_watermarks
    if gone := of_topic(hws):
        for key in gone:
            del hws[key]
        pub.write_state(storage, root._state)
    for d in (root._recovery_points, root._start_offsets):
        for key in of_topic(d):
            del d[key]
    root.checkpoint()
    cleaner = ckpt.read_offsets(storage, ckpt.CLEANER_OFFSET)
    if of_topic(cleaner):
        ckpt.write_offsets(storage, ckpt.CLEANER_OFFSET, {k: v for k, v in cleaner.items() if k[0] != name})
    if not root.transactional:
        _drop_group_offsets(storage, name)


def _drop_group_offsets(storage: Storage, name: str) -> None:
    """Remove the consumer groups' offsets (and metadata strings) of the partitions of
    ``name``; a group left without offsets is removed, as an empty group is in Kafka."""
    for group, offsets in read_consumer_offsets(storage).items():
        if all(k[0] != name for k in offsets):
            continue
        kept = {k: v for k, v in offsets.items() if k[0] != name}
        metadata = read_consumer_metadata(storage, group)
        if kept:
            write_consumer_offsets(storage, group, kept)
            if any(k[0] == name for k in metadata):
                write_consumer_metadata(storage, group, {k: v for k, v in metadata.items() if k[0] != name})
        else:
            for path in (consumer_metadata_file(group), consumer_offsets_file(group)):
                if storage.exists(path):
                    storage.delete(path)


def _remove_tree(storage: Storage, directory: str) -> None:
    if not storage.isdir(directory):
        return
    for name in storage.listdir(directory):
        path = join(directory, name)
        if storage.isdir(path):
            _remove_tree(storage, path)
        else:
            storage.delete(path)
    storage.rmdir(directory)
