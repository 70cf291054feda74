"""Object-store faults (TESTING.md §4, checklist G45-G48, H49) against a real S3 server.

Every test runs against moto's S3 server on 127.0.0.1 (tests/conftest.py); faults are real:
the server is stopped and restarted, writers race from threads with their own clients, a
conditional create lands but its response is lost, a writer dies at each step of a commit."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from pylog.storage.backends.objectstore import commitlog
from pylog.storage.backends.objectstore.snapshot import LOG
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from tests.conftest import BUCKET, Backend


class Crash(BaseException):
    """The writer process dies here (nothing after this point of the commit runs)."""


def values(root: Root, topic: str = "t") -> list[bytes]:
    return root.read_table(topic).column("value").to_pylist()


def offsets_ok(root: Root, topic: str = "t") -> None:
    """Offsets of each partition are consecutive (no append lost or applied twice)."""
    t = root.read_table(topic)
    pairs = zip(t.column("offset").to_pylist(), t.column("partition").to_pylist(), strict=True)
    by_partition: dict[int, list[int]] = {}
    for o, p in pairs:
        by_partition.setdefault(p, []).append(o)
    for offs in by_partition.values():
        assert offs == list(range(offs[0], offs[0] + len(offs)))


def commits(backend: Backend) -> list[str]:
    assert backend.server is not None
    fs = backend.server.filesystem()
    prefix = backend.url[len("s3://") :] + "/" + LOG
    return sorted(p.rsplit("/", 1)[1] for p in fs.find(prefix))


def batch(tag: str, n: int) -> pa.Table:
    return pa.table({"value": [f"{tag}-{i}".encode() for i in range(n)]})


# ------------------------------------------------------------------ G45 / H49: racing writers


def test_two_writers_racing_on_one_partition_lose_nothing_and_duplicate_nothing(s3_backend: Backend) -> None:
    with s3_backend.open() as r:
        r.create_topic("t", 1)
    errors: list[BaseException] = []
    conflicts = Counter[str]()

    def writer(name: str) -> None:
        try:
            root = s3_backend.open()
            before = root.commits
            for i in range(12):
                root.append("t", batch(f"{name}{i}", 5), partition=0)
            conflicts[name] = root.commits - before
            root.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    with s3_backend.open(read_only=True) as r:
        got = values(r)
        expected = {f"{w}{i}-{j}".encode() for w in "ab" for i in range(12) for j in range(5)}
        assert len(got) == len(expected) == 120 and set(got) == expected  # all of both, none twice
        assert r.read_table("t").column("offset").to_pylist() == list(range(120))
        for w in "ab":  # each writer's appends keep their order
            mine = [v for v in got if v.startswith(w.encode())]
            assert mine == [f"{w}{i}-{j}".encode() for i in range(12) for j in range(5)]
    # every append was one manifest: 1 (create) + 24, whatever the retries
    assert len(commits(s3_backend)) == 25


def test_a_stale_writer_cannot_overwrite_a_newer_commit(s3_backend: Backend) -> None:
    a = s3_backend.open()
    a.create_topic("t", 1)
    b = s3_backend.open()  # opened at the same manifest as a
    b.append("t", batch("b", 3))
    a.append("t", batch("a", 3))  # a's snapshot is stale: its commit must not replace b's
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"b-0", b"b-1", b"b-2", b"a-0", b"a-1", b"a-2"]
    a.close()
    b.close()


def test_put_if_absent_holds_for_small_and_multipart_objects(s3_backend: Backend) -> None:
    """The guarantee the commit protocol rests on, on the s3fs and moto versions installed."""
    assert s3_backend.server is not None
    fs = s3_backend.server.filesystem()
    for size, chunk in ((10, 50 << 20), (11 << 20, 5 << 20)):  # one PUT; a multipart upload
        path = f"{BUCKET}/probe-{uuid.uuid4().hex}"
        fs.pipe_file(path, b"x" * size, mode="create", chunksize=chunk)
        with pytest.raises(FileExistsError):
            fs.pipe_file(path, b"y" * size, mode="create", chunksize=chunk)
        assert fs.cat_file(path)[:1] == b"x"


# ------------------------------------------------------------------ G46: lost response


def test_lost_response_after_a_successful_conditional_create_is_our_commit(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", 1)
    store = root.storage.store  # type: ignore[attr-defined]
    real = store._create_once
    lost = []

    def create_then_lose_the_response(key: str, data: bytes) -> None:
        real(key, data)
        if key.startswith(LOG) and not lost:
            lost.append(key)
            raise ConnectionResetError("connection reset by peer (response lost)")

    store._create_once = create_then_lose_the_response
    before = len(commits(s3_backend))
    root.append("t", batch("x", 4))
    assert lost  # the response of the create was lost; the retry saw 412 and read our token back
    assert len(commits(s3_backend)) == before + 1  # not reported as a lost race: no second commit
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"x-0", b"x-1", b"x-2", b"x-3"]
    root.close()


# ------------------------------------------------------------------ server down mid-operation


def _restart_later(backend: Backend, delay: float) -> threading.Thread:
    assert backend.server is not None
    server = backend.server
    server.stop()
    th = threading.Thread(target=lambda: (time.sleep(delay), server.start()))
    th.start()
    return th


@pytest.mark.parametrize("step", ["before-upload", "uploaded"])
def test_server_restarted_in_the_middle_of_a_publish(s3_backend: Backend, step: str) -> None:
    opts = {**s3_backend.options, "pylog.retry_timeout_s": "60"}
    root = Backend("s3", s3_backend.url, opts, s3_backend.server).open()
    root.create_topic("t", 2)
    root.append("t", batch("before", 3), partition=0)
    restarts: list[threading.Thread] = []

    def hook(name: str) -> None:
        if name == step and not restarts:
            restarts.append(_restart_later(s3_backend, 1.5))

    assert isinstance(root.storage, ObjectStorage)
    root.storage.faults.hook = hook
    staged = _stage(root, "sink", 0, {0: batch("s0", 3), 1: batch("s1", 2)})
    out = root.publish("sink", 0, staged)
    restarts[0].join()
    assert out is not None and sum(i.num_records for i in out.values()) == 5
    with s3_backend.open(read_only=True) as r:
        assert sorted(values(r)) == sorted(
            [b"before-0", b"before-1", b"before-2", b"s0-0", b"s0-1", b"s0-2", b"s1-0", b"s1-1"]
        )
        assert r.last_committed_batch("sink") == 0
    assert root.publish("sink", 0, staged) is None  # a replay after the retry: skipped
    root.close()


def test_server_restarted_in_the_middle_of_a_compaction(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": "1048576"})
    pad = b"." * 600  # 8 records of 600 bytes: each commit seals its segment (cleanable)
    for i in range(12):
        root.append(
            "t", pa.table({"key": [b"k%d" % (j % 4) for j in range(8)], "value": [b"v%d" % i + pad] * 8})
        )
    restarts: list[threading.Thread] = []

    def hook(name: str) -> None:
        if name == "uploaded" and not restarts:
            restarts.append(_restart_later(s3_backend, 1.5))

    assert isinstance(root.storage, ObjectStorage)
    root.storage.faults.hook = hook
    now = int(time.time() * 1000) + 10**9
    report = maintain(root, now=now, force=True)
    restarts[0].join()
    assert report.records_removed > 0
    with s3_backend.open(read_only=True) as r:
        t = r.read_table("t")
        latest = dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True))
        assert latest == {b"k%d" % j: b"v11" + pad for j in range(4)}
        assert len(r.log("t", 0).segments) < 12  # merged and cleaned
    root.close()


# ------------------------------------------------------------------ G47: crash at each commit step


def _stage(root: Root, sink: str, batch_id: int, parts: dict[int, pa.Table], attempt: int = 0) -> list[Any]:
    """What a Spark task does: encode and write staged objects (outside the published state)."""
    from pylog.storage.codec import records
    from pylog.storage.root.manager import partition_dir

    staged = []
    for p, table in parts.items():
        name = pub.stage_name(sink, batch_id, 0, attempt)
        enc = records.encode(table.column("value").combine_chunks())
        f = root.storage.open_append(f"{partition_dir('t', p)}/{name}")
        f.write(enc.buffer.data)
        f.close()
        staged.append(pub.StagedFile("t", p, name))
    return staged


STEPS = ["before-upload", "uploaded", "checkpoint-uploaded", "manifest-created", "hint-written", "committed"]


def _stage_segments(root: Root, sink: str, batch_id: int, parts: dict[int, pa.Table]) -> list[Any]:
    """What a Spark task does for a staging over 4 MiB: staged segments uploaded as objects,
    which the commit adopts."""
    from pylog.storage.codec import records
    from pylog.storage.root.stage import open_stager

    staged = []
    for p, table in parts.items():
        st = open_stager(root.storage, "t", p, pub.stage_name(sink, batch_id, 0, 0), root.config("t"))
        enc = records.encode(table.column("value").combine_chunks(), base_offset=st.next_offset)
        st.write(enc.buffer, enc.batches)
        staged.append(st.finish())
    return staged


@pytest.mark.parametrize("staging", ["objects", "segments adopted"])
@pytest.mark.parametrize("step", STEPS)
def test_writer_killed_at_each_step_of_a_commit(
    s3_backend: Backend, step: str, staging: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commitlog, "CHECKPOINT_INTERVAL", 1)  # every commit writes a checkpoint
    root = s3_backend.open()
    root.create_topic("t", 2)
    root.append("t", batch("old", 4), partition=1)
    stage = _stage if staging == "objects" else _stage_segments
    staged = stage(root, "q", 7, {0: batch("new", 3), 1: batch("new1", 2)})

    def hook(name: str) -> None:
        if name == step:
            raise Crash(name)

    assert isinstance(root.storage, ObjectStorage)
    root.storage.faults.hook = hook
    with pytest.raises(Crash):
        root.publish("q", 7, staged)
    # the process is gone: a new one opens the root (knowing nothing of it)
    commitlog.forget(root.storage.store)
    visible = step in ("manifest-created", "hint-written", "committed")
    with s3_backend.open(read_only=True) as r:
        got = sorted(values(r))
        old = [b"old-0", b"old-1", b"old-2", b"old-3"]
        new = [b"new-0", b"new-1", b"new-2", b"new1-0", b"new1-1"]
        assert got == sorted(old + new if visible else old)  # the previous or the next state
        assert r.last_committed_batch("q") == (7 if visible else -1)
        offsets_ok(r)
    again = s3_backend.open()
    out = again.publish("q", 7, staged)  # Spark retries the commit of the batch
    assert (out is None) == visible
    with s3_backend.open(read_only=True) as r:
        assert sorted(values(r)) == sorted(old + new)  # exactly once either way
        assert r.last_committed_batch("q") == 7
    # nothing the dead writer left behind survives a sweep, and nothing referenced goes
    again.sweep_orphans(now_ms=int(time.time() * 1000) + 10**9)
    base = s3_backend.url[len("s3://") :] + "/"
    data_objects = {k[len(base) :] for k in _keys(s3_backend) if not k[len(base) :].startswith("_pylog/")}
    assert data_objects <= again.storage.snapshot.keys()  # none unreferenced (small data stays inline)
    held = again.storage.snapshot.keys()
    left = [k[len(base) :] for k in _keys(s3_backend) if "/.pylog-stage." in k]
    assert all(k in held for k in left)  # staged objects swept, but those the state adopted
    assert bool(left) == (staging != "objects")
    with s3_backend.open(read_only=True) as r:
        assert sorted(values(r)) == sorted(old + new)
    again.close()


def _keys(backend: Backend) -> list[str]:
    assert backend.server is not None
    return sorted(backend.server.filesystem().find(backend.url[len("s3://") :]))


def test_staged_objects_of_failed_attempts_are_swept_by_the_commit(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", 1)
    _stage(root, "q", 3, {0: batch("lost-attempt", 2)}, attempt=0)  # a task attempt that failed
    _stage(root, "q", 2, {0: batch("abandoned", 2)}, attempt=0)  # an aborted earlier batch
    good = _stage(root, "q", 3, {0: batch("ok", 2)}, attempt=1)
    assert len([k for k in _keys(s3_backend) if "/.pylog-stage." in k]) == 3
    root.publish("q", 3, good)
    assert [k for k in _keys(s3_backend) if "/.pylog-stage." in k] == []
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"ok-0", b"ok-1"]
    root.close()


# ------------------------------------------------------------------ G48: stale listings


def test_a_listing_cache_never_hides_a_newer_manifest(s3_backend: Backend) -> None:
    cached = Backend(
        "s3",
        s3_backend.url,
        {**s3_backend.options, "use_listings_cache": "true", "listings_expiry_time": "3600"},
        s3_backend.server,
    )
    with s3_backend.open() as w:
        w.create_topic("t", 1)
        w.append("t", batch("a", 1))
    reader = cached.open(read_only=True)
    assert values(reader) == [b"a-0"]
    with s3_backend.open() as w:
        w.append("t", batch("b", 1))
    assert values(reader) == [b"a-0"]  # a consistent snapshot, until refreshed
    reader.refresh()
    assert values(reader) == [b"a-0", b"b-0"]
    assert values(cached.open(read_only=True)) == [b"a-0", b"b-0"]


def test_multipart_upload_of_a_dead_writer_is_aborted_by_the_sweep(s3_backend: Backend) -> None:
    """A writer killed in the middle of a large (multipart) upload leaves nothing visible; the
    orphan sweep aborts the upload once it is older than the grace period."""
    root = s3_backend.open()
    root.create_topic("t", 1)
    root.append("t", batch("kept", 3))
    store = root.storage.store  # type: ignore[attr-defined]
    bucket, key, _ = store.fs.split_path(store.path("t-0/00000000000000000003.log.deadbeefdeadbeef"))
    up = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    store.fs.call_s3(
        "upload_part", Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 100
    )
    assert key.rsplit("/", 1)[1] not in [k.rsplit("/", 1)[1] for k in _keys(s3_backend)]  # invisible
    # (moto reports every upload as initiated in 2010, so "too young to abort" is not testable here)
    root.sweep_orphans(now_ms=int(time.time() * 1000) + 10**9)
    assert root.storage.uploads_aborted == 1
    left = store.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key.rsplit("/", 2)[0])
    assert not left.get("Uploads")
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"kept-0", b"kept-1", b"kept-2"]
    root.close()


# ------------------------------------------------------------------ review findings (regressions)


def _stale_writer(s3_backend: Backend, commits: int) -> tuple[Backend, Root, Root]:
    """A root with a delete delay of 300 ms; writer ``a`` holds the state after its first append
    while writer ``b`` commits ``commits`` times, each followed by more than the delay."""
    quick = Backend("s3", s3_backend.url, {**s3_backend.options, "pylog.file_delete_delay_ms": "300"})
    a = quick.open()
    a.create_topic("t", 1)
    a.append("t", batch("a", 1))
    b = quick.open()
    for i in range(commits):
        b.append("t", batch(f"b{i}", 1))
        time.sleep(0.35)
    return quick, a, b


def test_a_root_idle_while_old_commits_were_deleted_cannot_commit_into_the_gap(s3_backend: Backend) -> None:
    """A writer whose snapshot is older than the delete delay: commit N+1 it would create had
    been superseded and deleted, so a put-if-absent succeeds; the commit must still not count
    (readers resolve the newest state), and its garbage must not delete live objects."""
    quick, a, b = _stale_writer(s3_backend, 5)
    a.append("t", batch("late", 1))  # a's base is stale: the commit must land after b's
    with quick.open(read_only=True) as r:
        assert values(r) == [b"a-0", b"b0-0", b"b1-0", b"b2-0", b"b3-0", b"b4-0", b"late-0"]
        offsets_ok(r)
    time.sleep(0.35)
    maintain(a, now=int(time.time() * 1000), force=True)
    a.append("t", batch("after", 1))
    with quick.open(read_only=True) as r:  # every object the newest state names is there
        assert values(r)[-2:] == [b"late-0", b"after-0"]
    a.close()
    b.close()


def test_create_whose_response_never_comes_back_but_landed_is_not_repeated(s3_backend: Backend) -> None:
    short = Backend("s3", s3_backend.url, {**s3_backend.options, "pylog.retry_timeout_s": "0.2"})
    root = short.open()
    root.create_topic("t", 1)
    store = root.storage.store  # type: ignore[attr-defined]
    real = store._create_once
    calls = []

    def lands_then_times_out(key: str, data: bytes) -> None:
        if key.startswith(LOG) and not calls:
            calls.append(key)
            real(key, data)
            time.sleep(0.3)  # past the retry budget
            raise TimeoutError("read timeout")
        real(key, data)

    store._create_once = lands_then_times_out
    root.append("t", batch("once", 1))  # no error: the create is read back and recognised
    with short.open(read_only=True) as r:
        assert values(r) == [b"once-0"]
    root.close()


def test_a_long_lived_root_sweeps_the_staged_objects_of_each_publish(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", 1)
    for b in range(1, 4):
        staged = _stage(root, "q", b, {0: batch(f"v{b}", 1)})
        root.publish("q", b, staged)
        assert not [k for k in _keys(s3_backend) if "/.pylog-stage." in k], b
    with s3_backend.open(read_only=True) as r:
        assert values(r) == [b"v1-0", b"v2-0", b"v3-0"]
    root.close()


def test_an_orphan_sweep_does_not_make_a_stale_snapshot_look_confirmed(s3_backend: Backend) -> None:
    """The sweep resolves the newest state for its own judgement; that must not count as this
    root having confirmed its (older) snapshot, or its next commit skips the gap check and
    lands in the gap of a deleted commit, unseen by every reader."""
    quick, a, b = _stale_writer(s3_backend, 4)
    a.storage.sweep_orphans()  # a still holds its old snapshot
    a.append("t", batch("late", 1))
    with quick.open(read_only=True) as r:
        assert values(r) == [b"a-0", b"b0-0", b"b1-0", b"b2-0", b"b3-0", b"late-0"]
        offsets_ok(r)
    a.close()
    b.close()
