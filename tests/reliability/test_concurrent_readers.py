"""Lock-free readers beside a writer that compacts, runs retention and merges segments.

A reader (``read_only=True``: Spark tasks, ``pylog consume``) lists a partition's segments and
opens their files by name afterwards, so a compaction swap can rename a segment between the two
(``StorageError ... .log: cannot read: No such file or directory``) or a listing can be taken in
the middle of a swap (offsets skipped silently).  A read never fails and never skips an offset
because of what the writer does beside it: files that vanish are found again on a fresh
listing, conclusions that offsets do not exist are checked against the directory, retention's
``.deleted`` files are read while they last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pylog
from pylog.storage.backends.local import LocalStorage
from pylog.storage.backends.objectstore import client as objectstore
from pylog.storage.errors import OffsetOutOfRangeError
from pylog.storage.maintenance.merge import merge_small_segments
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition.log import Log, now_ms
from pylog.storage.partition.segment import LogSegment, relative_headers
from pylog.storage.root.manager import Root
from tests.conftest import Backend
from tests.reliability.concurrent_readers import run

T = "c"
CONFIG = {
    "cleanup.policy": "compact,delete",
    "segment.bytes": 1024,
    "index.interval.bytes": 64,
    "min.cleanable.dirty.ratio": 0.01,
    "min.compaction.lag.ms": 0,
    "delete.retention.ms": 0,
}


# ---------------------------------------------------------------------- the reader loop


@pytest.mark.slow  # reader threads against a writer for a time budget, on local disk and S3
def test_reader_loop_beside_compaction_retention_and_merges(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's LogConcurrencyTest: readers in a loop (fresh roots, a long-lived root, Spark's
    read_task) beside a writer that appends, rolls, compacts, runs retention and merges."""
    options = dict(backend.options)
    if backend.is_local:
        fig = run(backend.url, options, seconds=3.0, seed=19, readers=3)
    else:
        # every reader slower than the delete delay: the objects of its snapshot that compaction
        # and merges supersede are deleted under it (without retention, which would remove
        # data they have not read yet: test_a_reader_slower_than_the_delete_delay_...)
        options["pylog.file_delete_delay_ms"] = "0"
        _as_other_processes(monkeypatch)
        # (moto's server shares this process: fewer readers, with pauses, leave the writer time)
        fig = run(
            backend.url,
            options,
            seconds=5.0,
            seed=19,
            readers=3,
            fetch_bytes=2048,
            pause=0.05,
            retention=False,
        )
    assert fig.failures == [], fig.as_dict()
    assert fig.failed_reads == fig.missing_offsets == fig.two_valued_offsets == fig.unordered_reads == 0
    assert fig.reads >= 20 and fig.records_read > 0
    assert fig.compaction_passes > 0 and fig.merges > 0, fig.as_dict()
    assert fig.retention_deletes > 0 or not backend.is_local, fig.as_dict()
    # the writer did change files under the readers; on an object store the segments of these
    # small appends stay under INLINE_MAX, inline in each reader's snapshot, so a reader never has
    # to list again there (test_a_reader_slower_than_the_delete_delay... covers that path)
    assert fig.relistings > 0 or not backend.is_local, fig.as_dict()


def _as_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers of an object store in another process than the writer: none of the writer's
    uploads in the process-wide object cache (they would outlive their deletion)."""
    monkeypatch.setattr(objectstore, "_CACHE", objectstore._BlockCache(max_bytes=0))


# ---------------------------------------------------------------------- every step of a change


class _Stepping(LocalStorage):
    """The writer's storage: calls ``hook`` after each rename and deletion (the steps of a swap,
    of retention, of a merge)."""

    hook: Callable[[], None] | None = None

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self._step()

    def delete(self, path: str) -> None:
        super().delete(path)
        self._step()

    def _step(self) -> None:
        if self.hook is not None:
            hook, self.hook = self.hook, None  # (reads do not step)
            try:
                hook()
            finally:
                self.hook = hook


def _fill(root: Root, n: int) -> dict[int, bytes]:
    """``n`` appends of 3 records: a write-once key, then two updates of hot keys.  Returns the
    value at each offset of a write-once key (compaction never removes those)."""
    once: dict[int, bytes] = {}
    for _ in range(n):
        i = root.log(T, 0).log_end_offset  # (a key never used before)
        keys = [f"once-{i}".encode(), f"hot-{i % 3}".encode(), f"hot-{(i + 1) % 3}".encode()]
        values = [f"v{i}-{j}".encode() for j in range(3)]
        info = root.append(T, values, key=keys, partition=0)[0]
        once[info.first_offset] = values[0]
    return once


def _check(lg: Log, once: dict[int, bytes], what: str, fetch: int = 100) -> int:
    """Read all of ``lg`` (``fetch`` bytes at a time): every write-once offset in its range,
    with its value."""
    lo, hi = lg.log_start_offset, lg.log_end_offset
    got: dict[int, bytes] = {}
    for rs in lg.iter_record_sets(lo, hi, max_bytes=fetch):
        t = rs.data_records()
        for o, v in zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True):
            assert got.setdefault(o, v) == v, f"{what}: offset {o} served twice"
    want = {o: v for o, v in once.items() if lo <= o < hi}
    missing = sorted(set(want) - set(got))
    assert not missing, f"{what}: {len(missing)} offsets of [{lo}, {hi}) skipped, first {missing[0]}"
    wrong = [o for o in want if got[o] != want[o]]
    assert not wrong, f"{what}: offsets {wrong[:5]} served with other values"
    return len(want)


@contextlib.contextmanager
def _readers_at_every_step(
    tmp: Path, writer_storage: _Stepping, once: dict[int, bytes]
) -> Iterator[list[Root]]:
    """At every step of what the writer does inside the block, a reader opens the root, lists
    the partition and reads it whole at once (a listing in the middle of the change); another
    only lists it, and reads after the change (a listing that the rest of the change makes
    stale).  Yields the roots opened, to be read and closed by the caller."""
    opened: list[Root] = []

    def step() -> None:
        now = Root(LocalStorage(tmp), read_only=True)
        opened.append(now)
        _check(now.log(T, 0), once, f"reader at step {len(opened)}")
        later = Root(LocalStorage(tmp), read_only=True)
        later.log(T, 0)
        opened.append(later)

    writer_storage.hook = step
    try:
        yield opened
    finally:
        writer_storage.hook = None


@pytest.mark.parametrize("change", ["compaction", "merge", "retention"])
def test_readers_listing_at_every_step_of_a_change_read_everything(tmp_path: Path, change: str) -> None:
    """Deterministic: readers list the partition before the change, at each of its storage
    steps (renames to ``.cleaned``/``.swap``/``.deleted`` and back, deletions) and read at that
    step or after the change.  Every write-once offset of every reader's range is read, with
    its value, without an error."""
    st = _Stepping(tmp_path)
    writer = Root(st)
    writer.create_topic(T, 1, {**CONFIG, **({"retention.bytes": 800} if change == "retention" else {})})
    once = _fill(writer, 20)
    lg = writer.writable_log(T, 0)
    if change == "merge":
        for _ in range(6):  # small segments to merge
            once.update(_fill(writer, 1))
            lg.roll()
    before = Root(LocalStorage(tmp_path), read_only=True)
    before.log(T, 0)  # listed before the change, read after it
    with _readers_at_every_step(tmp_path, st, once) as opened:
        if change == "merge":
            merged = merge_small_segments(lg, now=now_ms(), min_segments=2)
            assert merged > 0
        else:
            report = maintain(writer, now=now_ms(), force=True, compaction=change == "compaction")
            assert report.segments_deleted if change == "retention" else report.cleaning
    assert len(opened) >= 6
    read = 0
    for i, r in enumerate([before, *opened]):
        read += _check(
            r.log(T, 0), once, f"reader {i} (listed {'before the change' if i == 0 else 'during it'})"
        )
        r.close()
    assert read > 0
    writer.close()


class _ChangedAfterListing(LocalStorage):
    """A reader's storage: the writer's ``change`` runs once, right after the reader listed a
    partition directory and before it opens the files it listed."""

    change: Callable[[], None] | None = None

    def listdir(self, path: str = "") -> list[str]:
        names = super().listdir(path)
        if self.change is not None and path:
            change, self.change = self.change, None
            change()
        return names


@pytest.mark.parametrize("change", ["compaction", "merge"])
def test_a_listing_stale_before_its_files_are_opened_skips_nothing(tmp_path: Path, change: str) -> None:
    """The silent gap of the issue (678 offsets of a partition whose keys compaction never
    removes): a reader listed the segments, the writer replaced some of them, and the reader
    opened what it had listed.  A listed file that was gone read as an empty segment, and its
    offsets were skipped without an error."""
    writer = Root(LocalStorage(tmp_path))
    writer.create_topic(T, 1, CONFIG)
    once = _fill(writer, 10)
    lg = writer.writable_log(T, 0)
    for _ in range(6):
        once.update(_fill(writer, 1))
        lg.roll()

    def run_change() -> None:
        if change == "merge":
            assert merge_small_segments(lg, now=now_ms(), min_segments=2) > 0
        else:
            assert maintain(writer, now=now_ms(), force=True).cleaning

    st = _ChangedAfterListing(tmp_path)
    st.change = run_change
    reader = Root(st, read_only=True)
    assert _check(reader.log(T, 0), once, f"reader whose listing the {change} made stale") == len(once)
    assert st.change is None  # (the change did run in between)
    reader.close()
    writer.close()


class _TornListing(LocalStorage):
    """A reader's storage whose first listing of a partition directory is torn, as one of a
    large directory can be (several ``getdents`` calls): the writer's ``change`` renames the
    files of segment ``base`` while the listing runs, and the listing has them under neither
    name."""

    change: Callable[[], None] | None = None
    base = 0

    def listdir(self, path: str = "") -> list[str]:
        names = super().listdir(path)
        if self.change is None or not path:
            return names
        change, self.change = self.change, None
        change()
        return [n for n in names if not n.startswith(f"{self.base:020d}.")]


def _rewrite(lg: Log, *segs: LogSegment) -> None:
    """Replace ``segs`` (adjacent) by one copy of their batches named after the first, with the
    swap protocol: what compaction does to a group that loses nothing, or a merge."""
    copy = LogSegment(lg.storage, lg.directory, segs[0].base_offset, lg.config, suffix=".cleaned")
    copy.open_for_append()
    for seg in segs:
        for loc in seg.iter_batches(0):
            copy.append(loc.data, relative_headers(loc.headers, loc.start))
    copy.on_become_inactive()
    lg.replace_segments([copy], list(segs), now=now_ms())


def test_a_torn_listing_skips_nothing(tmp_path: Path) -> None:
    """A listing that missed a segment being replaced (its files under neither name) lists a
    log with a hole whose other files are all there: the offsets of the missing segment were
    skipped silently."""
    writer = Root(LocalStorage(tmp_path))
    writer.create_topic(T, 1, CONFIG)
    once = _fill(writer, 20)
    lg = writer.writable_log(T, 0)
    assert len(lg.segments) >= 3
    middle = lg.segments[1]
    st = _TornListing(tmp_path)
    st.base = middle.base_offset
    st.change = lambda: _rewrite(lg, middle)
    reader = Root(st, read_only=True)
    assert _check(reader.log(T, 0), once, "reader whose listing was torn") == len(once)
    assert st.change is None
    reader.close()
    writer.close()


def test_retention_after_a_merge_under_a_reader(tmp_path: Path) -> None:
    """A reader listed segments A, B, C; the writer merged A and B into A', then retention
    removed A'.  The reader finds A.deleted (now A', covering B's offsets too) and B.deleted
    (the B it listed): overlapping files of two layouts, both right, read without a "damaged
    log" error and without a gap."""
    writer = Root(LocalStorage(tmp_path))
    writer.create_topic(T, 1, CONFIG)
    once = _fill(writer, 30)
    lg = writer.writable_log(T, 0)
    assert len(lg.segments) >= 4
    reader = Root(LocalStorage(tmp_path), read_only=True)
    view = reader.log(T, 0)
    _rewrite(lg, lg.segments[0], lg.segments[1])
    lg.delete_segments(lg.segments[:1], now=now_ms())
    assert _check(view, once, "reader beside a merge and retention", fetch=1 << 20) == len(once)
    assert view.relistings > 0
    reader.close()
    writer.close()


def test_retention_beyond_a_readers_high_watermark(tmp_path: Path) -> None:
    """A reader opened the root (its high watermark: 60), the writer appended up to 120 and
    retention removed every segment below 120 (bounded by the writer's newer high watermark);
    then the reader listed the partition.  Its log starts at 120: its range is empty, not an
    ``OffsetOutOfRangeError`` for an offset "above" the end of its snapshot."""
    writer = Root(LocalStorage(tmp_path))
    writer.create_topic(T, 1, {**CONFIG, "cleanup.policy": "delete", "retention.ms": 1000})
    _fill(writer, 20)
    reader = Root(LocalStorage(tmp_path), read_only=True)
    _fill(writer, 20)
    report = maintain(writer, now=now_ms() + 10**9)  # every record expired
    assert report.bytes_deleted and writer.log(T, 0).log_start_offset == 120
    lg = reader.log(T, 0)
    assert (lg.log_start_offset, lg.log_end_offset) == (120, 120)
    assert reader.read_table(T).num_rows == 0
    reader.close()
    writer.close()


@pytest.mark.parametrize("delay", ["0", "default"])
def test_a_reader_slower_than_the_delete_delay_gets_a_clear_error(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, delay: str
) -> None:
    """Retention removes segments a reader listed and has not read yet.  With the default
    delete delay (60 s) the reader reads them all the same (local disk: from the ``.deleted``
    files; object store: the objects of its manifest).  With a delay of 0 their files are
    deleted at once (``file.delete.delay.ms``; on an object store the storage option
    ``pylog.file_delete_delay_ms``): the reader cannot read them and says why, naming the
    delay, instead of skipping them."""
    options = dict(backend.options)
    config = {**CONFIG, "cleanup.policy": "delete", "segment.bytes": 16384}
    if delay == "0":
        config["file.delete.delay.ms"] = 0
        if not backend.is_local:
            options["pylog.file_delete_delay_ms"] = "0"
    if not backend.is_local:
        _as_other_processes(monkeypatch)
    writer = pylog.open(backend.url, options or None)
    writer.create_topic(T, 1, config)
    writer.transaction(  # (one commit on an object store)
        lambda: [  # each batch over INLINE_MAX: a segment object each on an object store
            writer.append(T, [f"v{i}-{j}-".encode() + b"." * 1500 for j in range(3)], partition=0)
            for i in range(40)
        ]
    )
    reader = pylog.open(backend.url, options or None, read_only=True)
    lg = reader.log(T, 0)
    writer.alter_config(T, {"retention.bytes": 20_000})
    report = maintain(writer, now=now_ms())
    assert report.segments_deleted > 0
    if delay == "0":
        name = "file.delete.delay.ms=0" if backend.is_local else "pylog.file_delete_delay_ms"
        with pytest.raises(OffsetOutOfRangeError, match=rf"\[0, \d+\) were removed by retention.*{name}"):
            lg.read_table()
    else:
        assert lg.read_table().column("offset").to_pylist() == list(range(120))
    reader.close()
    writer.close()
