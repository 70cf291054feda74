"""A partition of many segments opens, appends and reads at a cost independent of their number
(Kafka brokers hold 10^4 to 10^5 segments).

Counted, never timed: the files a writer's open + append reads or stats, the segment objects
it makes, the sealed segments whose deferred index checks run.  A sealed segment's indexes are
checked when it is first used (Kafka's lazy indexes): a damaged one is still found and rebuilt
then, and an unclean shutdown still recovers from the recovery point on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import pylog
from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.errors import DamagedLogError
from pylog.storage.partition import loader
from pylog.storage.partition.loader import load_log, open_log
from pylog.storage.partition.segment import LogSegment
from pylog.storage.partition.segments import SegmentList

DIR = "t-0"
CFG = LogConfig.from_dict({"segment.bytes": 200, "index.interval.bytes": 0})


class CountingStorage(LocalStorage):
    """A real local storage that counts the calls that touch a file, by file extension."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: Counter[tuple[str, str]] = Counter()

    def _count(self, what: str, path: str) -> None:
        self.calls[(what, path.rpartition(".")[2])] += 1

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self._count("read", path)
        return super().read(path, start, end)

    def size(self, path: str) -> int:
        self._count("size", path)
        return super().size(path)

    def exists(self, path: str) -> bool:
        self._count("exists", path)
        return super().exists(path)

    def listdir(self, path: str = "") -> list[str]:
        self._count("listdir", path or ".")
        return super().listdir(path)

    def per_segment_calls(self) -> int:
        """Calls on segment files (.log and the indexes)."""
        return sum(
            n for (_, ext), n in self.calls.items() if ext in ("log", "index", "timeindex", "txnindex")
        )


def build(root: Path, segments: int) -> None:
    """One partition of ``segments`` segments (one ~150-byte batch each), closed cleanly."""
    lg = open_log(LocalStorage(root), DIR, CFG, had_clean_shutdown=True)
    enc = records.encode([b"x" * 80] * segments, base_offset=0, batch_bytes=100)
    lg.append_batches(enc.buffer.tobytes())
    lg.close()


def open_and_append(root: Path) -> tuple[CountingStorage, loader.LoadResult]:
    storage = CountingStorage(root)
    res = load_log(storage, DIR, CFG, had_clean_shutdown=True)
    res.log.append([b"new"])
    res.log.flush()
    return storage, res


def test_open_and_append_touch_the_same_files_with_10_or_300_segments(tmp_path: Path) -> None:
    counts = {}
    for n in (10, 300):
        build(tmp_path / str(n), n)
        checks = loader.DEFERRED_CHECKS[0]
        storage, res = open_and_append(tmp_path / str(n))
        lg = res.log
        assert len(lg.segments) == n + 1 and lg.log_end_offset == n + 1
        assert isinstance(lg.segments, SegmentList)
        made = lg.segments.made()
        # the first one (its base offset only: the log start), the active one, the one rolled to
        assert [s.base_offset for s in made] == [0, n - 1, n], made
        assert loader.DEFERRED_CHECKS[0] == checks  # no sealed segment was checked
        counts[n] = (storage.per_segment_calls(), storage.calls[("listdir", DIR)])
        lg.close()
    # the 300-segment log opens from the segment list its clean close left (closed_list): its
    # directory is not listed; the list's first and last segments and the one named after its
    # log end offset are looked up instead
    assert counts[300] == (counts[10][0] + 3, 0) and counts[10][1] == 1, counts


def test_a_full_read_reads_no_index_of_a_sealed_segment(tmp_path: Path) -> None:
    build(tmp_path, 100)
    storage = CountingStorage(tmp_path)
    lg = load_log(storage, DIR, CFG, had_clean_shutdown=True).log
    storage.calls.clear()
    assert lg.read_table()["offset"].to_pylist() == list(range(100))
    assert storage.calls[("read", "index")] == 0 and storage.calls[("read", "timeindex")] == 0
    assert storage.calls[("read", "log")] == 100
    lg.close()


def _garble_last_entry(root: Path, base: int) -> Path:
    """The offset index of segment ``base`` gets a last entry pointing into the middle of a batch
    (in order, within the .log: only reading the .log there shows it)."""
    path = root / DIR / f"{base:020d}.index"
    data = path.read_bytes()
    assert len(data) >= 16
    previous = int.from_bytes(data[-12:-8], "big")
    path.write_bytes(data[:-4] + (previous + 7).to_bytes(4, "big"))
    return path


def test_a_damaged_sealed_index_is_found_and_rebuilt_when_the_segment_is_used(tmp_path: Path) -> None:
    root = tmp_path
    lg = open_log(
        LocalStorage(root), DIR, LogConfig.from_dict({"segment.bytes": 1000, "index.interval.bytes": 0})
    )
    for i in range(40):
        lg.append([b"v%03d" % i])
    bases = [s.base_offset for s in lg.segments]
    lg.close()
    assert len(bases) >= 4
    damaged = bases[1]
    path = _garble_last_entry(root, damaged)
    garbled = path.read_bytes()

    cfg = LogConfig.from_dict({"segment.bytes": 1000, "index.interval.bytes": 0})
    res = load_log(LocalStorage(root), DIR, cfg, had_clean_shutdown=True)
    assert res.recovery.rebuilt_indexes == [] and path.read_bytes() == garbled  # not at the load
    checks = loader.DEFERRED_CHECKS[0]
    middle = damaged + 2
    got = res.log.read_table(middle, bases[2])
    assert got["value"].to_pylist() == [b"v%03d" % i for i in range(middle, bases[2])]
    seg = res.log.segments[1]
    assert seg.base_offset == damaged and seg.rebuilt_indexes, seg.rebuilt_indexes
    assert "last entry" in seg.rebuilt_indexes[0] and str(path.name) in seg.rebuilt_indexes[0]
    assert path.read_bytes() != garbled  # rebuilt on disk
    assert loader.DEFERRED_CHECKS[0] == checks + 1
    res.log.close()
    # the rebuilt index is the one a full rebuild makes
    rebuilt = path.read_bytes()
    path.unlink()
    again = load_log(LocalStorage(root), DIR, cfg, had_clean_shutdown=False, recovery_point=0)
    assert path.read_bytes() == rebuilt
    again.log.close()


def test_an_unclean_shutdown_still_recovers_from_the_recovery_point(tmp_path: Path) -> None:
    build(tmp_path, 50)
    d = tmp_path / DIR
    last = sorted(d.glob("*.log"))[-1]
    with open(last, "ab") as f:
        f.write(b"\x00garbage")
    res = load_log(LocalStorage(tmp_path), DIR, CFG, had_clean_shutdown=False, recovery_point=45)
    assert res.recovery.truncated_bytes == 8
    assert res.recovery.recovered_segments == [f"{DIR}/{b:020d}.log" for b in range(45, 50)], (
        res.recovery.recovered_segments
    )
    assert res.log.read_table()["offset"].to_pylist() == list(range(50))
    res.log.close()


def test_a_writer_refuses_damage_an_append_depends_on_and_reads_report_older_damage(tmp_path: Path) -> None:
    """The writer checks the segments its load reads and the one before them; a hole further
    down is reported by the read that crosses it (never fewer rows)."""
    with pylog.open(tmp_path) as root:
        root.create_topic("t", 1, {"segment.bytes": "200"})
        root.append_batches(
            {("t", 0): records.encode([b"x" * 80] * 30, base_offset=0, batch_bytes=100).buffer.tobytes()}
        )
    d = tmp_path / DIR
    (d / f"{5:020d}.log").unlink()  # an old segment removed from outside: offset 5 held by none
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"new"], partition=0)[0].first_offset == 30
        with pytest.raises(DamagedLogError, match=r"offsets 5\.\.5 are held by no segment"):
            root.read_table("t")
        assert root.read_table("t", start_offset=6)["offset"].to_pylist() == list(range(6, 31))
    (d / f"{29:020d}.log").unlink()  # the one before the active one: refused
    with pylog.open(tmp_path) as root, pytest.raises(DamagedLogError, match="held by no segment"):
        root.append("t", [b"more"], partition=0)


def test_segment_list_makes_segments_on_demand_and_edits_like_a_list(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    made: list[int] = []

    def make(base: int, nxt: int | None) -> LogSegment:
        made.append(base)
        return LogSegment(storage, DIR, base, CFG, next_base_offset=nxt)

    segs = SegmentList([0, 10, 20, 30], make)
    assert len(segs) == 4 and made == []
    last = segs[-1]
    assert last.base_offset == 30 and last.next_base_offset is None and made == [30]
    assert segs[1].next_base_offset == 20 and segs[-1] is last
    assert last in segs and segs.index(last) == 3
    assert LogSegment(storage, DIR, 30, CFG) not in segs  # identity, not equality
    new = LogSegment(storage, DIR, 40, CFG)
    segs.append(new)
    assert segs.bases().tolist() == [0, 10, 20, 30, 40] and segs.pop() is new
    segs.remove(last)
    assert segs.bases().tolist() == [0, 10, 20]
    replacement = LogSegment(storage, DIR, 25, CFG)
    segs[-1] = replacement
    assert segs[-1] is replacement and segs.bases().tolist() == [0, 10, 25]
    del segs[:2]
    assert [s.base_offset for s in segs] == [25] and segs.made() == [replacement]
    assert [s.base_offset for s in SegmentList([1, 2, 3], make)[1:]] == [2, 3]
