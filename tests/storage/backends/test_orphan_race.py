"""The orphan sweep against a commit in flight, whatever its create takes and whatever any clock
does (against the real S3 server of tests/conftest.py)."""

from __future__ import annotations

import time
from typing import Any

from pylog.storage.backends.objectstore import orphans
from pylog.storage.root.manager import Root
from tests.conftest import Backend
from tests.storage.backends.test_objectstore import cold_cache, keys, now_ms


def values(root: Root) -> list[bytes]:
    return root.read_table("t").column("value").to_pylist()


def referenced_objects(root: Root) -> set[str]:
    """Every object key the newest state names (segments, indexes, checkpoints)."""
    root.storage.refresh()
    named: set[str] = root.storage.snapshot.keys()  # a Snapshot's, not a dict's
    return {k for k in named if not k.startswith("_pylog/log/")}


def test_a_sweep_while_a_create_stalls_never_takes_the_objects_of_the_acknowledged_commit(
    s3_backend: Backend,
) -> None:
    """A writer uploads its segment objects, then its conditional create of commit N+1 stalls
    (a slow request, a suspended host: ``time.monotonic`` stands still meanwhile).  A sweep runs in
    that window with its clock past the grace: the uploads are unreferenced and look old, so it
    deletes them.  The create then lands and the append is acknowledged: every object the commit
    names must be readable (the writer uploads them again before it acknowledges)."""
    writer = s3_backend.open()
    writer.create_topic("t", 2)
    writer.append("t", [b"first" + b"x" * 5000], partition=0)
    sweeper = s3_backend.open()
    swept: list[int] = []

    def stall(name: str) -> None:
        if name == "creating" and not swept:  # uploaded, the commit object not created yet
            later = now_ms() + int(sweeper.storage.orphan_grace_s() * 1000) + 60_000
            swept.append(sweeper.sweep_orphans(later))

    writer.storage.faults.hook = stall
    big = [b"v%d" % i + b"y" * 5000 for i in range(3)]  # larger than what stays inline: objects
    writer.append("t", big, partition=1)  # acknowledged
    writer.storage.faults.hook = None
    assert swept and swept[0] > 0  # the sweep did take the in-flight uploads for orphans

    present = set(keys(s3_backend))
    named = referenced_objects(writer)
    assert named <= present, sorted(named - present)
    cold_cache()
    with s3_backend.open(read_only=True) as reader:
        assert sorted(values(reader)) == sorted([b"first" + b"x" * 5000, *big])
    # and the next commits and sweeps go on as usual
    writer.append("t", [b"after"], partition=0)
    assert sweeper.sweep_orphans(now_ms()) == 0
    cold_cache()
    with s3_backend.open(read_only=True) as reader:
        assert len(values(reader)) == 5
    writer.close()
    sweeper.close()


def test_the_sweep_judges_ages_by_the_stores_clock(s3_backend: Backend, monkeypatch: Any) -> None:
    """A sweeper whose host clock runs hours ahead (or resumed from a suspend with a wrong clock)
    does not take young uploads for orphans: ages are measured by the store's clock."""
    root = s3_backend.open()
    root.create_topic("t")
    root.append("t", [b"a"])
    store = root.storage.store
    orphan = "t-0/00000000000000000042.log.0123456789abcdef"
    store.put(orphan, b"x" * 100)  # an upload of a commit in flight, or of a crashed writer
    ahead = time.time() + 10 * root.storage.orphan_grace_s()
    monkeypatch.setattr(time, "time", lambda: ahead)
    assert root.sweep_orphans() == 0
    assert orphan in keys(s3_backend)
    monkeypatch.undo()
    # the sweep mark is not an orphan, and a root is still judged by the store's clock afterwards
    assert root.sweep_orphans() == 0
    assert orphans.SWEEP_MARK in keys(s3_backend) and orphan in keys(s3_backend)
    assert root.sweep_orphans(now_ms() + int(root.storage.orphan_grace_s() * 1000) + 1000) == 1
    assert orphan not in keys(s3_backend)
    root.close()


def test_a_commit_costs_one_get_more_and_uploads_again_only_after_a_sweep(s3_backend: Backend) -> None:
    """The common path costs one GET of the sweep mark more than before; the objects are uploaded
    again only when a sweep began in the commit's window."""
    writer = s3_backend.open()
    writer.create_topic("t")
    writer.append("t", [b"a" * 5000])
    sweeper = s3_backend.open()
    store = writer.storage.store

    def cost(value: bytes) -> dict[str, int]:
        before = dict(store.requests.counts)
        writer.append("t", [value])
        return {k: v - before.get(k, 0) for k, v in store.requests.counts.items() if v != before.get(k, 0)}

    plain = cost(b"b" * 5000)
    assert plain.get("get", 0) == 1 and plain.get("put", 0) >= 1, plain  # the mark, after the create
    runs = []

    def stall(name: str) -> None:
        if name == "creating" and not runs:
            later = now_ms() + int(sweeper.storage.orphan_grace_s() * 1000) + 60_000
            runs.append(sweeper.sweep_orphans(later))

    writer.storage.faults.hook = stall
    swept = cost(b"c" * 5000)
    writer.storage.faults.hook = None
    assert runs and runs[0] > 0
    assert swept.get("put", 0) == 2 * plain["put"] and swept.get("get", 0) == 1, (plain, swept)
    assert cost(b"d" * 5000) == plain  # the mark read after that create serves the next commit
    cold_cache()
    with s3_backend.open(read_only=True) as reader:
        assert values(reader) == [v * 5000 for v in (b"a", b"b", b"c", b"d")]
    writer.close()
    sweeper.close()


def test_a_root_opened_anew_for_each_commit_reads_the_mark_once_per_commit(s3_backend: Backend) -> None:
    """A Spark sink opens a root per micro-batch: its commit reads the sweep mark once (after the
    create), the reading before the uploads coming from the process's last one; a sweep run in
    between still makes the next commit upload again."""
    with s3_backend.open() as first:
        first.create_topic("t")
        first.append("t", [b"a" * 5000])

    def commit(value: bytes) -> dict[str, int]:
        with s3_backend.open() as root:
            store = root.storage.store
            before = dict(store.requests.counts)
            root.append("t", [value])
            return {
                k: v - before.get(k, 0) for k, v in store.requests.counts.items() if v != before.get(k, 0)
            }

    plain = commit(b"b" * 5000)
    assert plain.get("get", 0) == 1, plain
    with s3_backend.open() as sweeper:
        sweeper.sweep_orphans(now_ms())
    after_sweep = commit(b"c" * 5000)  # the remembered mark is older than the sweep's: uploads again
    assert after_sweep.get("get", 0) == 1 and after_sweep.get("put", 0) == 2 * plain["put"], (
        plain,
        after_sweep,
    )
    assert commit(b"d" * 5000) == plain
    cold_cache()
    with s3_backend.open(read_only=True) as reader:
        assert values(reader) == [v * 5000 for v in (b"a", b"b", b"c", b"d")]
