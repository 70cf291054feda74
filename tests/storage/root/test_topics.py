"""Root.delete_topic (storage/root/topics.py): a deleted topic is gone with its data, state and
the consumer groups' offsets of its partitions; readers see it whole or gone, and a crash at any
step leaves a root whose next writer has it whole or finishes the deletion."""

from __future__ import annotations

import os
import random

import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import StorageError, UnknownTopicError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root.consumers import read_consumer_offsets, write_consumer_offsets
from pylog.storage.root.manager import Root
from pylog.storage.root.topics import INTENT_FILE, pending_deletes
from tests.conftest import Backend
from tests.reliability.memfs import Crash, MemStorage

GROUPS = {"both": {("a", 0): 1, ("a-1", 0): 1}, "only-a": {("a", 1): 1}}
"""Consumer offsets before the deletion of topic ``a`` ("a-1" is a topic whose name extends it)."""

STEPS = [
    "delete-intent-written",
    "topic-removed",
    "topic-state-dropped",
    "partition-deleted",
    "topic-deleted",
]


def fill(root: Root) -> None:
    root.create_topic("a", partitions=2, config={"cleanup.policy": "compact"})
    root.create_topic("a-1")
    root.append("a", [b"x", b"y", b"z"], key=[b"1", b"2", b"3"])
    root.append("a-1", [b"kept"])
    for group, offsets in GROUPS.items():
        write_consumer_offsets(root.storage, group, offsets)


def rows(root: Root, topic: str) -> list[bytes]:
    return sorted(root.read_table(topic).column("value").to_pylist())


def assert_deleted(root: Root) -> None:
    """Topic ``a`` is gone without a trace; ``a-1`` and its group offsets are intact."""
    assert root.topics() == ["a-1"] and rows(root, "a-1") == [b"kept"]
    st = root.storage
    assert not any(n.startswith(("a-0", "a-1-", "a-2")) and n != "a-1-0" for n in st.listdir(""))
    assert not any(n.startswith("a-") and n[2:].isdigit() for n in st.listdir(""))
    assert pending_deletes(st) == []
    assert read_consumer_offsets(st) == {"both": {("a-1", 0): 1}}
    assert all(t != "a" for t, _ in root._state.high_watermarks)
    for path in (ckpt.RECOVERY_POINT, ckpt.LOG_START_OFFSET, ckpt.CLEANER_OFFSET):
        assert all(t != "a" for t, _ in ckpt.read_offsets(st, path))


def test_a_deleted_topic_is_gone_with_its_data_state_and_group_offsets(backend: Backend) -> None:
    with backend.open() as root:
        fill(root)
        root.checkpoint()
        commits = root.commits
        assert root.delete_topic("a") is True
        if not backend.is_local:
            assert root.commits == commits + 1  # one manifest commit: all or nothing
        assert_deleted(root)
    with backend.open(read_only=True) as reader:
        assert_deleted(reader)
        with pytest.raises(UnknownTopicError, match="unknown topic 'a'"):
            reader.read_table("a")
    with backend.open() as root:  # created again: a new, empty topic
        root.create_topic("a", partitions=2)
        assert root.read_table("a").num_rows == 0
        assert [root.log_start_offset("a", p) for p in (0, 1)] == [0, 0]
        root.append("a", [b"new"], partition=1)
        assert rows(root, "a") == [b"new"] and root.log("a", 1).log_end_offset == 1


def test_an_unknown_topic_is_named_unless_if_exists(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t")
        with pytest.raises(UnknownTopicError, match=r"unknown topic 'nope' in .*; topics: t"):
            root.delete_topic("nope")
        assert root.delete_topic("nope", if_exists=True) is False
        assert root.topics() == ["t"]


class Stop(Exception):
    """Raised at a named step: the change stops there, as in a crash."""


@pytest.mark.parametrize("step", STEPS)
def test_stopped_at_a_named_step_the_topic_is_whole_or_deleted_by_the_next_writer(
    backend: Backend, step: str
) -> None:
    with backend.open() as root:
        fill(root)
    root = backend.open()
    seen: list[str] = []

    def stop(name: str) -> None:
        seen.append(name)
        if name == step:
            raise Stop(name)

    root.faults.hook = stop
    with pytest.raises(Stop):
        root.delete_topic("a")
    assert list(dict.fromkeys(s for s in seen if s in STEPS)) == STEPS[: STEPS.index(step) + 1]
    if backend.is_local:  # the process is gone: its lock with it, no clean shutdown
        assert root._writer is not None
        root._writer.close()
        root._writer = None
        with backend.open(read_only=True) as reader:
            whole = "a" in reader.topics()
            assert whole == (step == "delete-intent-written")
            if whole:
                assert rows(reader, "a") == [b"x", b"y", b"z"]
    else:  # the transaction was not committed: nothing of it is published
        root.close()
        with backend.open(read_only=True) as reader:
            assert rows(reader, "a") == [b"x", b"y", b"z"] and pending_deletes(reader.storage) == []
            assert read_consumer_offsets(reader.storage) == GROUPS
        return
    with backend.open() as root:
        root.become_writer()  # finishes the deletion
        assert_deleted(root)


def open_writer(storage: MemStorage) -> Root:
    """The next writer: it finishes a pending deletion, then recovers every partition left."""
    root = Root(storage)
    root.become_writer()
    for topic in root.topics():
        for p in range(root.partitions(topic)):
            root.writable_log(topic, p)
    return root


def build() -> MemStorage:
    st = MemStorage()
    root = Root(st)
    fill(root)
    root.close()
    return st


def test_a_crash_after_any_write_leaves_a_root_with_the_topic_whole_or_deleted() -> None:
    """Every mutating storage step of a deletion crashed in turn, recovered after a kill (all
    that was written survives) and after a power cut (only what was fsynced)."""
    st = build()
    before = st.step_count
    Root(st).delete_topic("a")
    count = st.step_count - before
    assert count > 10
    outcomes = set()
    for k in range(1, count + 1):
        for how in ("kill", "power cut"):
            st = build()
            st.crash_after(k)
            with pytest.raises(Crash):
                Root(st).delete_topic("a")
            after = st.kill() if how == "kill" else st.power_cut(random.Random(k))
            reader = Root(after, read_only=True)
            whole = "a" in reader.topics()
            if whole:
                assert rows(reader, "a") == [b"x", b"y", b"z"], (k, how)
            assert rows(reader, "a-1") == [b"kept"], (k, how)
            root = open_writer(after)
            if "a" in root.topics():  # the intent was not written yet: the topic is untouched
                assert whole and rows(root, "a") == [b"x", b"y", b"z"], (k, how)
                assert not after.exists(INTENT_FILE)
                assert read_consumer_offsets(after) == GROUPS
                outcomes.add("whole")
            else:
                assert_deleted(root)
                outcomes.add("deleted")
            root.close()
    assert outcomes == {"whole", "deleted"}


def test_a_topic_created_again_after_a_failed_deletion_is_new_and_kept(backend: Backend) -> None:
    """A deletion that failed midway (an I/O error) in a process that goes on: creating the
    topic again first completes the deletion, so the new topic holds none of the old data and
    the next writer does not delete it."""
    with backend.open() as root:
        fill(root)
    root = backend.open()

    def fail(name: str) -> None:
        if name == "partition-deleted":
            root.faults.hook = None
            raise Stop(name)

    root.faults.hook = fail
    with pytest.raises(Stop):
        root.delete_topic("a")
    if not backend.is_local:  # the transaction was not committed: the topic is whole
        assert rows(root, "a") == [b"x", b"y", b"z"]
        root.close()
        return
    root.create_topic("a", partitions=2)
    assert root.read_table("a").num_rows == 0
    root.append("a", [b"new"], partition=1)
    root.close()
    with backend.open() as root:
        root.become_writer()  # (finishes interrupted deletions: none left)
        assert rows(root, "a") == [b"new"]
        assert pending_deletes(root.storage) == []


def test_a_reader_opened_before_the_deletion_is_told_the_topic_was_deleted(backend: Backend) -> None:
    """A reader that learnt the topics before the deletion and opens its logs after it: an
    unknown topic, named as deleted (not damage that ``pylog recover`` would be asked to fix)."""
    with backend.open() as root:
        fill(root)
    reader = backend.open(read_only=True)
    with backend.open() as root:
        root.delete_topic("a")
    if not backend.is_local:  # a reader keeps its state, whose files outlive it a while
        assert rows(reader, "a") == [b"x", b"y", b"z"]
        return
    with pytest.raises(
        UnknownTopicError, match=r"^topic 'a' was deleted from .* \(a-0 is gone\): open the root again$"
    ):
        reader.read_table("a")
    assert rows(reader, "a-1") == [b"kept"]


def test_a_topic_created_again_has_no_committed_offsets_of_the_deleted_one(backend: Backend) -> None:
    """Offsets left for a topic's name after it was deleted (on an object store, a crash between
    the deletion's commit and the rewrite of the groups' offsets) are dropped when a topic of
    that name is created: its consumers never skip its first records."""
    if backend.is_local:
        pytest.skip("on local disk the deletion's intent file makes its next writer drop them")
    with backend.open() as root:
        fill(root)
        root.delete_topic("a")
        write_consumer_offsets(root.storage, "both", {("a", 0): 2, ("a-1", 0): 1})  # as a crash leaves
        write_consumer_offsets(root.storage, "only-a", {("a", 1): 1})
        root.create_topic("a", partitions=2)
        assert read_consumer_offsets(root.storage) == {"both": {("a-1", 0): 1}}
        root.create_topic("a", partitions=2, exist_ok=True)
        write_consumer_offsets(root.storage, "new", {("a", 0): 0})
        root.create_topic("a", partitions=2, exist_ok=True)  # (an existing topic's offsets are kept)
        assert read_consumer_offsets(root.storage)["new"] == {("a", 0): 0}


def test_a_reader_opened_before_a_deletion_and_recreation_is_told_to_open_again(backend: Backend) -> None:
    """A reader that read the state before the topic was deleted and created again, whose new
    partitions end below the old high watermarks: told the root changed (open it again), not
    that the log is damaged."""
    with backend.open() as root:
        fill(root)
    reader = backend.open(read_only=True)
    with backend.open() as root:
        root.delete_topic("a")
        root.create_topic("a", partitions=2)
        root.append("a", [b"new"], partition=0)
    if not backend.is_local:  # a reader keeps its state, whose files outlive it a while
        assert rows(reader, "a") == [b"x", b"y", b"z"]
        return
    with pytest.raises(
        StorageError, match=r"^a-\d: changed since this reader read the root's state .*: open"
    ):
        reader.read_table("a")
    with backend.open(read_only=True) as again:
        assert rows(again, "a") == [b"new"]


def test_a_deletion_whose_commit_fails_keeps_the_groups_offsets(backend: Backend) -> None:
    """On an object store the groups' offsets of a deleted topic are rewritten only after the
    deletion's commit: a commit that fails leaves the topic and its groups' offsets whole."""
    if backend.is_local:
        pytest.skip("local disk has no commit: the deletion's steps are covered by the intent file")
    with backend.open() as root:
        fill(root)
    root = backend.open()

    def fail(name: str) -> None:
        if name == "before-upload":
            raise Stop(name)

    root.storage.faults.hook = fail  # type: ignore[attr-defined]
    with pytest.raises(Stop):
        root.delete_topic("a")
    root.storage.faults.hook = None  # type: ignore[attr-defined]
    root.close()
    with backend.open(read_only=True) as reader:
        assert rows(reader, "a") == [b"x", b"y", b"z"]
        assert read_consumer_offsets(reader.storage) == GROUPS


def test_two_interrupted_deletions_are_both_finished_by_the_next_writer(tmp_path: object) -> None:
    """One intent file names every deletion under way; a writer's open checks it (no listing)
    and finishes each."""

    class Stop(Exception):
        pass

    def stop(step: str) -> None:
        if step == "topic-removed":
            raise Stop(step)

    path = str(tmp_path)
    root = Root(LocalStorage(path))
    root.create_topic("a", partitions=2)
    root.create_topic("b")
    root.create_topic("c")
    root.append("c", [b"kept"])
    root.faults.hook = stop
    for topic in ("a", "b"):
        with pytest.raises(Stop):
            root.delete_topic(topic)
    assert pending_deletes(root.storage) == ["a", "b"]
    assert root._writer is not None
    root._writer.close()  # the process is gone, and its lock with it
    with Root(LocalStorage(path)) as again:
        again.append("c", [b"more"])
        assert again.topics() == ["c"] and pending_deletes(again.storage) == []
        assert not [n for n in os.listdir(path) if n.startswith(("a-", "b-"))]


def test_an_intent_file_changed_by_hand_is_named(tmp_path: object) -> None:
    path = str(tmp_path)
    with Root(LocalStorage(path)) as root:
        root.create_topic("a")
    with open(os.path.join(path, INTENT_FILE), "w") as f:
        f.write("not json")
    with pytest.raises(StorageError, match=INTENT_FILE + ": not a list of topics being deleted"):
        Root(LocalStorage(path)).append("a", [b"x"])
