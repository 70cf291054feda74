"""A commit on an object store costs what it changes, whatever the root's history.

Appends of 4 records to every partition, no maintenance in between (segment objects pile up):
the requests, the bytes of a commit, the segments it opens, the file entries it hands to the
commit log and the paths it indexes are counted, not timed, early and late in the run."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from pylog.storage.backends.objectstore import worktree
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.dirindex import DirIndex
from pylog.storage.backends.objectstore.snapshot import LOG
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.partition import segment
from pylog.storage.root.manager import Root
from tests.conftest import Backend

PARTITIONS = 6
COMMITS = 90
EARLY = range(5, 20)
LATE = range(COMMITS - 15, COMMITS)


def _storage(root: Root) -> ObjectStorage:
    assert isinstance(root.storage, ObjectStorage)
    return root.storage


def _table(i: int) -> pa.Table:
    part = [p for p in range(PARTITIONS) for _ in range(4)]
    return pa.table(
        {
            "key": [b"k%d" % j for j in range(len(part))],
            "value": [b"v-%05d-%03d-" % (i, j) + b"x" * 60 for j in range(len(part))],
            "partition": pa.array(part, pa.int32()),
        }
    )


def _run(root: Root, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Per commit: its requests by kind, the bytes of its commit document, the segments opened,
    the file entries the working tree hands to the commit log, the paths put into a names index,
    and whether the working tree after it shares the state's file map (no copy)."""
    commit_bytes: list[int] = []
    segments = [0]
    entries: list[int] = []
    indexed = [0]
    changes, index_add = worktree.WorkingTree.changes, DirIndex.add

    def counted_changes(self: worktree.WorkingTree, *args: Any) -> Any:
        files, uploads = changes(self, *args)
        entries.append(len(files))
        return files, uploads

    def counted_add(self: DirIndex, path: str) -> None:
        indexed[0] += 1
        index_add(self, path)

    create_once = ObjectClient._create_once

    def create(self: ObjectClient, key: str, data: bytes) -> Any:
        if key.startswith(LOG):
            commit_bytes.append(len(data))
        return create_once(self, key, data)

    init = segment.LogSegment.__init__

    def counted_init(self: segment.LogSegment, *args: Any, **kwargs: Any) -> None:
        segments[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(ObjectClient, "_create_once", create)
    monkeypatch.setattr(segment.LogSegment, "__init__", counted_init)
    monkeypatch.setattr(worktree.WorkingTree, "changes", counted_changes)
    monkeypatch.setattr(DirIndex, "add", counted_add)
    st = _storage(root)
    counts = st.store.requests.counts
    for i in range(COMMITS):
        counts.clear()
        commit_bytes.clear()
        entries.clear()
        segments[0] = indexed[0] = 0
        root.append("t", _table(i))
        tree = st._tree
        yield {
            "requests": dict(counts),
            "commit_bytes": sum(commit_bytes),
            "segments_opened": segments[0],
            "entries": sum(entries),
            "indexed": indexed[0],
            "shared": tree.files.base is st.snapshot.files and not tree.files.over,
        }


@pytest.fixture
def rows(s3_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    root = s3_backend.open()
    root.create_topic("t", partitions=PARTITIONS)
    out = list(_run(root, monkeypatch))
    sealed = {k for k in _storage(root).snapshot.files if k.endswith(".log") and k.startswith("t-")}
    assert len(sealed) >= 4 * PARTITIONS  # segment objects did pile up (the point of the test)
    root.close()
    with s3_backend.open(read_only=True) as r:
        assert r.read_table("t").num_rows == 4 * PARTITIONS * COMMITS
    return out


def _median(rows: list[dict[str, Any]], window: range, f: Any) -> float:
    return statistics.median(f(rows[i]) for i in window)


def test_requests_and_commit_bytes_do_not_grow_with_the_history(rows: list[dict[str, Any]]) -> None:
    assert all(r["requests"].get("list", 0) == 0 for r in rows[1:])
    for kind in ("get", "create"):
        early = max(rows[i]["requests"].get(kind, 0) for i in EARLY)
        late = max(rows[i]["requests"].get(kind, 0) for i in LATE)
        assert late <= early, (kind, early, late)
    # all requests (the puts are the segments sealed meanwhile, and the checkpoints): the same
    total = lambda r: sum(r["requests"].values())  # noqa: E731
    assert _median(rows, LATE, total) <= _median(rows, EARLY, total)
    early_bytes = _median(rows, EARLY, lambda r: r["commit_bytes"])
    late_bytes = _median(rows, LATE, lambda r: r["commit_bytes"])
    assert late_bytes <= 1.1 * early_bytes, (early_bytes, late_bytes)


def test_segments_opened_per_commit_do_not_grow(rows: list[dict[str, Any]]) -> None:
    early = _median(rows, EARLY, lambda r: r["segments_opened"])
    late = _median(rows, LATE, lambda r: r["segments_opened"])
    assert late <= early + PARTITIONS, (early, late)


def test_a_commit_handles_the_entries_it_changes_not_the_whole_file_map(rows: list[dict[str, Any]]) -> None:
    # the working tree shares the state's file map (never a copy of it) ...
    assert all(r["shared"] for r in rows)
    # ... hands the commit log the files the transaction touched (a few per partition), not the
    # map, which grew by the segments sealed meanwhile ...
    early = _median(rows, EARLY, lambda r: r["entries"])
    late = _median(rows, LATE, lambda r: r["entries"])
    assert 0 < late <= early + PARTITIONS, (early, late)
    # ... and keeps the names of each directory up to date instead of indexing the tree again
    assert max(rows[i]["indexed"] for i in LATE) <= max(rows[i]["indexed"] for i in EARLY) + 4 * PARTITIONS
