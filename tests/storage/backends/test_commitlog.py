"""The commit log of a root on an object store (storage/backends/objectstore/commitlog.py, snapshot.py) on
moto's S3 server: no LIST in the steady state, checkpoints and the hint, bounded objects, newer
formats refused, and racing writers re-based instead of re-run."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from pylog.storage.backends.objectstore import commitlog
from pylog.storage.backends.objectstore.keys import INLINE_MAX
from pylog.storage.backends.objectstore.snapshot import CHECKPOINTS, HINT, LOG, Snapshot, commit_key
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.errors import UnsupportedFormatError
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_root
from tests.conftest import Backend
from tests.storage.backends.test_objectstore import client, cold_cache, keys, with_options


def storage(root: Root) -> ObjectStorage:
    assert isinstance(root.storage, ObjectStorage)
    return root.storage


def counts(root: Root) -> dict[str, int]:
    return dict(storage(root).store.requests.counts)


def reset_counts(root: Root) -> None:
    storage(root).store.requests.counts.clear()


def forget_process_state(root: Root) -> None:
    """What a new process knows: nothing (no cached state, no cached objects)."""
    commitlog.forget(storage(root).store)
    cold_cache()


def values(root: Root, topic: str = "t") -> list[bytes]:
    return root.read_table(topic).column("value").to_pylist()


# ------------------------------------------------------------------ no LIST in the steady state


def test_a_warm_writer_commits_with_one_request_and_never_lists(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", partitions=8)
    root.append("t", [b"warm-up"])
    reset_counts(root)
    for i in range(10):
        root.append("t", [b"v%d-%d" % (i, j) for j in range(4)], key=[b"k%d" % j for j in range(4)])
    c = counts(root)
    assert c.get("list", 0) == 0, c
    assert c.get("create") == 10 and c.get("get", 0) == 0, c  # small data: inline, one create each
    assert c.get("put", 0) <= 2, c  # a checkpoint and its hint at most once in 10 commits


def test_an_idle_refresh_costs_one_get_and_no_list(s3_backend: Backend) -> None:
    writer = s3_backend.open()
    writer.create_topic("t", partitions=4)
    writer.append("t", [b"a"])
    reader = s3_backend.open(read_only=True)
    reset_counts(reader)
    for _ in range(3):
        reader.refresh()
    c = counts(reader)
    assert c == {"get": 3}, c  # the next commit's key, missing each time
    writer.append("t", [b"b"])
    reader.refresh()  # learns of the new commit (known to this process already, or one GET)
    assert counts(reader).get("list", 0) == 0 and counts(reader)["get"] <= 5
    assert sorted(values(reader)) == [b"a", b"b"]


def test_a_cold_open_starts_from_the_hinted_checkpoint_without_listing(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", partitions=2)
    for i in range(commitlog.CHECKPOINT_INTERVAL + 5):
        root.append("t", [b"v%d" % i], partition=i % 2)
    forget_process_state(root)
    fresh = s3_backend.open(read_only=True)
    c = counts(fresh)
    assert c.get("list", 0) == 0, c
    # the hint, the checkpoint at 20, the commits after it (in doubling concurrent windows: at
    # most twice as many GETs, the missing next one included)
    after = root.storage.number - storage(fresh).snapshot.checkpoints[-1].number
    assert 2 + after + 1 <= c.get("get", 0) <= 2 + 2 * after + 1, (c, after)
    assert sorted(values(fresh)) == sorted(b"v%d" % i for i in range(commitlog.CHECKPOINT_INTERVAL + 5))


# ------------------------------------------------------------------ bounded objects


def test_small_commits_leave_no_objects_behind(s3_backend: Backend) -> None:
    backend = with_options(s3_backend, **{"pylog.file_delete_delay_ms": "200"})
    root = backend.open()
    root.create_topic("t", partitions=4)
    for i in range(3 * commitlog.CHECKPOINT_INTERVAL):
        root.append("t", [b"v%d-%d" % (i, j) for j in range(4)], key=[b"k%d" % j for j in range(4)])
        time.sleep(0.01)
    found = keys(backend)
    data = {k: n for k, n in found.items() if not k.startswith("_pylog/")}
    commits = [k for k in found if k.startswith(LOG)]
    checkpoints = [k for k in found if k.startswith(CHECKPOINTS)]
    # a few records per partition per commit stay inline in the state until a segment holds
    # more than INLINE_MAX bytes: no object of a commit's few records
    assert all(n > INLINE_MAX for k, n in data.items() if ".log." in k), data
    assert len(commits) <= 2 * commitlog.CHECKPOINT_INTERVAL + 1, len(commits)
    assert len(checkpoints) <= 3, checkpoints
    cold_cache()
    with backend.open(read_only=True) as r:
        assert r.read_table("t").num_rows == 4 * 3 * commitlog.CHECKPOINT_INTERVAL


# ------------------------------------------------------------------ damaged or foreign metadata


def test_a_checkpoint_that_is_not_what_its_commit_recorded_is_never_trusted(
    s3_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    root = s3_backend.open()
    root.create_topic("t")
    for i in range(2 * commitlog.CHECKPOINT_INTERVAL + 3):
        root.append("t", [b"v%d" % i])
    expected = values(root)
    newest = storage(root).snapshot.checkpoints[-1]
    base = s3_backend.url[len("s3://") :]
    raw = client(s3_backend).cat_file(f"{base}/{newest.key}")
    client(s3_backend).pipe_file(f"{base}/{newest.key}", raw[: len(raw) // 2])  # torn
    # and a checkpoint uploaded by a writer that lost its race (never named by a commit)
    client(s3_backend).pipe_file(f"{base}/{CHECKPOINTS}{newest.number + 1:020d}.0123456789abcdef.json", b"{}")
    forget_process_state(root)
    with caplog.at_level("WARNING", logger="pylog.storage"), s3_backend.open(read_only=True) as r:
        assert values(r) == expected  # from the checkpoint before, and the commits after it
        assert r.storage.snapshot.number == root.storage.number
    assert "not the one its commit recorded" in caplog.text


def test_without_the_hint_the_commit_log_is_listed(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t")
    for i in range(5):
        root.append("t", [b"v%d" % i])
    client(s3_backend).rm_file(f"{s3_backend.url[len('s3://') :]}/{HINT}")
    forget_process_state(root)
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"v%d" % i for i in range(5)]
        assert counts(r).get("list", 0) >= 1


@pytest.mark.parametrize("which", ["commit", "hint"])
def test_a_newer_format_is_refused_naming_the_object(s3_backend: Backend, which: str) -> None:
    root = s3_backend.open()
    root.create_topic("t")
    root.append("t", [b"a"])
    base = s3_backend.url[len("s3://") :]
    if which == "commit":
        key = commit_key(root.storage.number + 1)
        doc: dict[str, Any] = {"format": "pylog-commit", "version": 4, "number": root.storage.number + 1}
    else:
        key = HINT
        doc = {"format": "pylog-hint", "version": 4, "checkpoint": {}}
    client(s3_backend).pipe_file(f"{base}/{key}", json.dumps(doc).encode())
    forget_process_state(root)
    with pytest.raises(
        UnsupportedFormatError, match=rf"{key}: written by a newer pylog .*version 4.*upgrade pylog"
    ):
        s3_backend.open(read_only=True)


# ------------------------------------------------------------------ racing writers


def test_a_writer_of_another_topic_rebases_instead_of_running_again(s3_backend: Backend) -> None:
    setup = s3_backend.open()
    setup.create_topic("x", partitions=2)
    setup.create_topic("y", partitions=2)
    a, b = s3_backend.open(), s3_backend.open()  # both at the same state
    a.append("x", [b"a"], partition=0)
    runs = []
    real = b.append

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return real(*args, **kwargs)

    b.transaction(lambda: counted("y", [b"b"], partition=1))
    assert len(runs) == 1 and storage(b).rebases == 1  # re-based on a's commit, not re-run
    forget_process_state(setup)
    with s3_backend.open(read_only=True) as r:
        assert values(r, "x") == [b"a"] and values(r, "y") == [b"b"]
        state = pub.read_state(r.storage)
        assert state.high_watermarks[("x", 0)] == 1 and state.high_watermarks[("y", 1)] == 1
        assert r.log("x", 0).log_end_offset == 1 and r.log("y", 1).log_end_offset == 1


def test_writers_of_one_partition_run_the_operation_again(s3_backend: Backend) -> None:
    setup = s3_backend.open()
    setup.create_topic("t", partitions=1)
    a, b = s3_backend.open(), s3_backend.open()
    a.append("t", [b"a"])
    runs = []

    def op() -> None:
        runs.append(1)
        b.append("t", [b"b"])

    b.transaction(op)
    assert len(runs) == 2 and storage(b).rebases == 0  # the same partition: re-run on the newest
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"a", b"b"]
        assert r.read_table("t").column("offset").to_pylist() == [0, 1]


def test_two_writers_of_different_topics_at_full_speed(s3_backend: Backend) -> None:
    """Both progress, re-bases are counted, every record exactly once (the 60 s version is the
    benchmark ``bench/object_store_commits.py --writers``)."""
    with s3_backend.open() as setup:
        setup.create_topic("x", partitions=4)
        setup.create_topic("y", partitions=4)
    stop = time.monotonic() + 6
    done: dict[str, int] = {}
    rebases: dict[str, int] = {}
    errors: list[BaseException] = []

    def writer(topic: str) -> None:
        try:
            root = s3_backend.open()
            i = 0
            while time.monotonic() < stop:
                root.append(
                    topic,
                    [b"%s-%d-%d" % (topic.encode(), i, j) for j in range(3)],
                    key=[b"%d" % j for j in range(3)],
                )
                i += 1
            done[topic], rebases[topic] = i, storage(root).rebases
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "xy"]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert done["x"] > 5 and done["y"] > 5, done
    assert rebases["x"] + rebases["y"] > 0, rebases  # they did race
    with s3_backend.open(read_only=True) as r:
        for t in "xy":
            got = values(r, t)
            assert len(got) == len(set(got)) == 3 * done[t]


def test_a_process_keeps_the_newest_state_of_a_bounded_number_of_roots() -> None:
    from types import SimpleNamespace

    stores = [SimpleNamespace(url=f"memory://bounded/{i}") for i in range(commitlog.KNOWN_ROOTS + 6)]
    try:
        for st in stores:
            commitlog.remember(st, Snapshot(number=3), 0.0)  # type: ignore[arg-type]
        known = set(commitlog._KNOWN)
        assert len(known) <= commitlog.KNOWN_ROOTS
        assert stores[-1].url in known and stores[1].url not in known  # the least recently used went
    finally:
        for st in stores:
            commitlog.forget(st)  # type: ignore[arg-type]


# ------------------------------------------------------------------ writers that trust a known state


def _staged(root: Root, query: str, batch: int, partition: int, tag: str, attempt: int = 0) -> list[Any]:
    """What a Spark task stages for one partition (a flat file of batches, outside the state)."""
    from pylog.storage.codec import records

    name = pub.stage_name(query, batch, 0, attempt)
    enc = records.encode([b"%s-%d" % (tag.encode(), i) for i in range(3)])
    f = root.storage.open_append(f"t-{partition}/{name}")
    f.write(enc.buffer.data)
    f.close()
    return [pub.StagedFile("t", partition, name)]


def test_a_writer_trusting_its_known_state_skips_the_get_and_never_publishes_a_batch_twice(
    s3_backend: Backend,
) -> None:
    """A sink's commit may start from the state its process confirmed newest moments ago (no
    request). If another process committed meanwhile, the commit loses its race; when that other
    commit published the same query (here: the same batch, into another partition, so that no
    file overlaps), the records are never merged: the operation runs again on the newest state,
    where the batch is found committed and skipped."""
    q = "0123456789abcdef0123456789abcdef"
    with s3_backend.open() as w:
        w.create_topic("t", partitions=2)
        w.publish(q, 0, _staged(w, q, 0, 0, "b0"))
    stale = commitlog.known(storage(w).store, 60.0)
    assert stale is not None
    other = s3_backend.open()  # another process commits batch 1 (into partition 0) ...
    now = int(time.time() * 1000)  # both record batch 1 of q at the same time: identical records
    other.publish(q, 1, _staged(other, q, 1, 0, "b1"), now=now)
    other.close()
    commitlog._KNOWN[storage(w).store.url] = (stale[0], time.monotonic())  # ... unknown to this one
    root = open_root(s3_backend.url, s3_backend.options, trust_known_s=30.0)
    assert counts(root) == {} and storage(root).number == stale[0].number  # no request: trusted
    assert root.last_committed_batch(q) == 0  # (stale)
    out = root.publish(q, 1, _staged(root, q, 1, 1, "replay", attempt=1), now=now)  # Spark's replay
    assert out is None  # skipped: found committed on the newest state
    assert storage(root).conflicts >= 1
    root.close()
    with s3_backend.open(read_only=True) as r:
        assert sorted(values(r)) == [b"b0-0", b"b0-1", b"b0-2", b"b1-0", b"b1-1", b"b1-2"]
        assert r.last_committed_batch(q) == 1


def test_a_known_state_is_trusted_only_under_half_the_delete_delay() -> None:
    """A writer may start from the state its process confirmed newest (no request) only while
    no commit or object it maps can have been deleted: under half the delete delay."""
    from types import SimpleNamespace

    store = SimpleNamespace(url="memory://trust/1", file_delete_delay_ms=1000)
    try:
        commitlog.remember(store, Snapshot(number=3), time.monotonic())  # type: ignore[arg-type]
        assert commitlog.known(store, 30.0) is not None  # type: ignore[arg-type]
        time.sleep(0.6)
        assert commitlog.known(store, 30.0) is None  # type: ignore[arg-type]  # older than 0.5 s
        store.file_delete_delay_ms = 60_000
        assert commitlog.known(store, 30.0) is not None  # type: ignore[arg-type]
        assert commitlog.known(store, 0.1) is None  # type: ignore[arg-type]
    finally:
        commitlog.forget(store)  # type: ignore[arg-type]
