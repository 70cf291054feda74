"""Staged segments on an object store (moto's S3 server): tasks upload them as objects with
their indexes, and the commit adopts the objects as the log's segment files - each batch's
``baseOffset`` set by a patch read over the object - without downloading or uploading any
record byte.  Replays, crashes, merges and the staged-object sweep keep every record exactly
once, and a newer reader's format is refused by an older one."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from pylog.storage.backends.objectstore.snapshot import LOG, PATCH_VERSION
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root import publish as pub
from pylog.storage.root.stage import ObjectSegmentStager
from pylog.tools.inspect import verify
from tests.conftest import Backend
from tests.storage.partition.test_staging import CONFIG, stage, value


def _objects(s3: Backend) -> dict[str, int]:
    assert s3.server is not None
    fs = s3.server.filesystem()
    prefix = s3.url[len("s3://") :]
    return {k[len(prefix) + 1 :]: int(v["size"]) for k, v in fs.find(prefix, detail=True).items()}


def _bytes_got(root: Any) -> list[int]:
    """Sizes of the objects the root's store fetched (by GET), recorded from now on."""
    store = root.storage.store
    got: list[int] = []
    real = store.get

    def get(key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = real(key, start, end)
        got.append(len(data))
        return data

    store.get = get
    return got


def test_a_commit_adopts_staged_objects_without_reading_them(s3_backend: Backend) -> None:
    with s3_backend.open() as root:
        root.create_topic("t", 1, CONFIG)
        staged = [stage(root, 0, task, 400) for task in range(2)]
    assert all(s.segments and s.segments[0].files for s in staged)
    for seg in (seg for s in staged for seg in s.segments or ()):  # small indexes travel inline
        assert [f.split(".")[-3] for f, _ in seg.files or ()] == ["log"]
        assert {k for k, _ in seg.inline} == {"index", "timeindex"}
    assert sum(len(s.segments or ()) for s in staged) >= 4  # rolled at segment.bytes
    staged_keys = {k for k in _objects(s3_backend) if ".pylog-stage." in k}
    with s3_backend.open() as root:
        assert isinstance(root.storage, ObjectStorage)
        got = _bytes_got(root)
        out = root.publish("q1", 0, staged)
        assert out is not None and out[("t", 0)].num_records == 800
        assert sum(got) < 4096, got  # metadata only (commit objects, small indexes), no batches
        t = root.read_table("t")
        assert t["offset"].to_pylist() == list(range(800))
        assert t["value"].to_pylist() == [value(0, task, i) for task in range(2) for i in range(400)]
        problems, counters = verify(root)
        assert not problems and counters["records"] == 800, problems
        refs = {r.key for r in root.storage.snapshot.files.values() if r.key}
    assert staged_keys & refs  # the segments are the staged objects themselves
    newest = max(k for k in _objects(s3_backend) if k.startswith(LOG))
    assert s3_backend.server is not None
    doc = json.loads(s3_backend.server.filesystem().cat_file(f"{s3_backend.url}/{newest}"))
    assert doc["version"] == PATCH_VERSION  # an older pylog refuses it instead of misreading
    with s3_backend.open(read_only=True) as r:
        assert r.storage.listdir_staged("t-0") == []  # adopted objects are not staged data
        assert r.read_table("t")["offset"].to_pylist() == list(range(800))


def test_a_replay_adopts_nothing_twice_and_merges_replace_the_adopted_objects(s3_backend: Backend) -> None:
    with s3_backend.open() as root:
        root.create_topic("t", 1, {**CONFIG, "file.delete.delay.ms": "0"})
        first = [stage(root, 0, 0, 400)]
        root.publish("q1", 0, first)
        assert root.publish("q1", 0, first) is None  # Spark replays the commit: skipped
        for batch in (1, 2):
            root.publish("q1", batch, [stage(root, batch, 0, 400)])
        expected = [value(b, 0, i) for b in range(3) for i in range(400)]
        assert root.read_table("t")["value"].to_pylist() == expected
        assert len(root.log("t", 0).segments) >= 9
    with s3_backend.open() as root:
        root.alter_config("t", {"segment.bytes": str(1 << 20)})
        report = maintain(root, now=int(time.time() * 1000), retention=False)
        assert report.segments_merged > 0
    with s3_backend.open() as root:
        t = root.read_table("t")
        assert t["offset"].to_pylist() == list(range(1200)) and t["value"].to_pylist() == expected
        assert not verify(root)[0]
        adopted = [r for r in root.storage.snapshot.files.values() if r.patch is not None]
        assert len(adopted) < 3  # merged into plain objects (the active one may remain)
        held = {r.key for r in root.storage.snapshot.files.values() if r.key}
        garbage = {k for k, _ in root.storage.snapshot.garbage}
    left = {k for k in _objects(s3_backend) if ".pylog-stage." in k}
    assert left - held and left - held <= garbage  # merged away: deleted a delete delay later


class Crash(BaseException):
    """The committing process dies here."""


def test_a_commit_that_dies_before_its_commit_object_leaves_the_staged_objects_unowned(
    s3_backend: Backend,
) -> None:
    with s3_backend.open() as root:
        root.create_topic("t", 1, CONFIG)
        staged = [stage(root, 0, 0, 300)]

    def step(name: str) -> None:
        if name == "uploaded":
            raise Crash(name)

    with s3_backend.open() as root:
        assert isinstance(root.storage, ObjectStorage)
        root.storage.faults.hook = step
        with pytest.raises(Crash):
            root.publish("q1", 0, staged)
        root.storage.faults.hook = None
    with s3_backend.open() as root:
        assert root.read_table("t").num_rows == 0  # nothing visible
        names = root.storage.listdir_staged("t-0")
        assert names  # still staged data: the retry adopts them, or a sweep removes them
        out = root.publish("q1", 0, staged)  # Spark retries the commit
        assert out is not None and root.read_table("t")["offset"].to_pylist() == list(range(300))
    with s3_backend.open() as root:  # a sweep of abandoned stagings spares what the state holds
        assert root.sweep_staged("q1", 5, ["t"], now=2**41, max_age_ms=0) == 0
        assert root.read_table("t").num_rows == 300 and not verify(root)[0]


def test_an_abandoned_task_removes_its_uploaded_objects(s3_backend: Backend) -> None:
    with s3_backend.open() as root:
        root.create_topic("t", 1, CONFIG)
        st = ObjectSegmentStager(root.storage, "t", 0, pub.stage_name("q1", 0, 0, 0), root.config("t"))
        from pylog.storage.codec import records

        enc = records.encode(
            [value(0, 0, i) for i in range(300)], None, 1000, base_offset=0, batch_bytes=2000
        )
        st.write(enc.buffer, enc.batches)
        st.finish()
        assert root.storage.listdir_staged("t-0")
        st.abandon()
        assert root.storage.listdir_staged("t-0") == []


def test_a_replayed_batch_restaged_after_its_commit_never_overwrites_the_adopted_objects(
    s3_backend: Backend,
) -> None:
    """A query restarted after its commit but before Spark recorded it runs the batch's tasks
    again, with the same attempt numbers: their objects must not replace the ones the state
    adopted (the rows may come back in another order, with other timestamps)."""
    with s3_backend.open() as root:
        root.create_topic("t", 1, CONFIG)
        first = [stage(root, 0, 0, 300)]
        root.publish("q1", 0, first)
        before = root.read_table("t")
        again = [stage(root, 0, 0, 200)]  # the re-run: same query, batch, task and attempt
        assert not {p for f in first for p in f.paths()} & {p for f in again for p in f.paths()}
        assert root.publish("q1", 0, again) is None  # the commit is a replay: skipped
    with s3_backend.open(read_only=True) as r:
        assert r.read_table("t").equals(before) and not verify(r)[0]


@pytest.mark.parametrize("damage", ["size", "batches"])
def test_a_staging_message_that_does_not_match_its_objects_is_refused_before_anything_changes(
    s3_backend: Backend, damage: str
) -> None:
    import dataclasses

    from pylog.storage.errors import CorruptRecordError

    with s3_backend.open() as root:
        root.create_topic("t", 1, CONFIG)
        root.publish("q1", 0, [stage(root, 0, 0, 100)])
        good = stage(root, 1, 0, 100)
        assert good.segments is not None
        seg = good.segments[0]
        bad_seg = (
            dataclasses.replace(seg, size=seg.size + 1)
            if damage == "size"
            else dataclasses.replace(seg, batches=(seg.batches or b"")[16:])  # first batch left out
        )
        bad = dataclasses.replace(good, segments=(bad_seg, *good.segments[1:]))
        with pytest.raises(
            CorruptRecordError,
            match=r"\.pylog-stage\.q1\.1\.0\.0\.0+\.log\.\w+\.staged: byte 0: staged segment 0: ",
        ):
            root.publish("q1", 1, [bad])
    with s3_backend.open() as root:
        assert root.read_table("t")["offset"].to_pylist() == list(range(100))  # as before
        assert root.publish("q1", 1, [good]) is not None  # the retry with the right message lands
        assert root.read_table("t")["offset"].to_pylist() == list(range(200)) and not verify(root)[0]
