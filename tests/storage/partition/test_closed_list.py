"""A writer opens a cleanly closed log of many segments without listing its directory, from the
segment list (``.pylog-segments``) its last writer left; anything that makes the list doubtful
makes it list the directory, and it then sees the files as they are.

Counted, never timed: the listings of the partition directory (through the storage seam).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition import closed_list
from pylog.storage.partition.loader import load_log
from pylog.storage.partition.log import Log
from pylog.storage.partition.names import scan
from pylog.storage.partition.segment import segment_name

DIR = "t-0"
N = 200  # segments: above closed_list.MIN_SEGMENTS
T0 = 1_700_000_000_000
CFG = LogConfig.from_dict({"segment.bytes": 200, "index.interval.bytes": 0})
COMPACT = LogConfig.from_dict({"segment.bytes": 200, "index.interval.bytes": 0, "cleanup.policy": "compact"})


class ListingStorage(LocalStorage):
    """A real local storage that counts the listings of each directory."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listings: Counter[str] = Counter()

    def listdir(self, path: str = "") -> list[str]:
        self.listings[path] += 1
        return super().listdir(path)


def build(root: Path, n: int = N, cfg: LogConfig = CFG) -> None:
    """One partition of ``n`` segments (one batch each, keyed), closed cleanly."""
    lg = load_log(LocalStorage(root), DIR, cfg, had_clean_shutdown=True).log
    keys = [b"k%d" % (i % 150) for i in range(n)]  # 50 replaced: cleaning keeps >= 128 segments
    enc = records.encode([b"x" * 80] * n, key=keys, timestamp=T0, base_offset=0, batch_bytes=100)
    lg.append_batches(enc.buffer.tobytes())
    lg.close()


def opened(root: Path, cfg: LogConfig = CFG, *, clean: bool = True) -> tuple[Log, int]:
    """The writer's log of ``root`` and how many times its directory was listed to open it."""
    storage = ListingStorage(root)
    lg = load_log(storage, DIR, cfg, had_clean_shutdown=clean).log
    return lg, storage.listings[DIR]


def listed_bases(root: Path) -> list[int]:
    scanned = scan(sorted(os.listdir(root / DIR)))
    assert scanned is not None
    return scanned.bases


def list_file(root: Path) -> Path:
    return root / DIR / closed_list.NAME


def state(lg: Log) -> tuple[list[int], int, int, list[tuple[int, bytes | None, bytes | None]]]:
    t = lg.read_table()
    rows = list(
        zip(
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )
    return bases_of(lg), lg.log_start_offset, lg.log_end_offset, rows


def bases_of(lg: Log) -> list[int]:
    return [int(b) for b in np.asarray(lg._bases)]


def test_a_clean_close_leaves_the_list_and_the_next_open_lists_nothing(tmp_path: Path) -> None:
    build(tmp_path)
    found = closed_list.decode(list_file(tmp_path).read_bytes())
    assert found is not None and found.bases == listed_bases(tmp_path)  # what the directory holds
    lg, listings = opened(tmp_path)
    assert listings == 0
    assert not list_file(tmp_path).exists()  # removed before the writer changes anything
    assert len(lg.segments) == N and lg.log_end_offset == N
    assert bases_of(lg) == listed_bases(tmp_path)
    lg.close()


def test_a_small_log_gets_no_list(tmp_path: Path) -> None:
    build(tmp_path, closed_list.MIN_SEGMENTS - 1)
    assert not list_file(tmp_path).exists()
    assert opened(tmp_path)[1] == 1


def _add_segment(root: Path) -> None:  # a segment past the end, by hand (empty)
    (root / DIR / f"{segment_name(N + 5)}.log").touch()


def _remove_first_segment(root: Path) -> None:  # as a hand-made retention
    for p in (root / DIR).glob(f"{segment_name(0)}.*"):
        p.unlink()


def _touch_directory(root: Path) -> None:
    st_ = os.stat(root / DIR)
    os.utime(root / DIR, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1))


def _corrupt_list(root: Path) -> None:
    data = bytearray(list_file(root).read_bytes())
    data[40] ^= 1  # a base offset
    st_ = os.stat(root / DIR)
    list_file(root).write_bytes(bytes(data))  # (in place: the directory's time is unchanged)
    assert os.stat(root / DIR).st_mtime_ns == st_.st_mtime_ns


def _truncate_list(root: Path) -> None:
    data = list_file(root).read_bytes()
    with open(list_file(root), "r+b") as f:
        f.truncate(len(data) - 1)


@pytest.mark.parametrize(
    "change, segments",
    [
        (_add_segment, N + 1),
        (_remove_first_segment, N - 1),
        (_touch_directory, N),
        (_corrupt_list, N),
        (_truncate_list, N),
    ],
)
def test_a_doubtful_list_makes_the_writer_list_the_directory(tmp_path: Path, change, segments: int) -> None:  # type: ignore[no-untyped-def]
    build(tmp_path)
    change(tmp_path)
    lg, listings = opened(tmp_path)
    assert listings == 1
    assert not list_file(tmp_path).exists()
    assert len(lg.segments) == segments and bases_of(lg) == listed_bases(tmp_path)
    lg.close()


def test_a_writer_that_stops_without_closing_leaves_no_list(tmp_path: Path) -> None:
    build(tmp_path)
    lg, listings = opened(tmp_path)
    assert listings == 0
    enc = records.encode([b"y" * 80] * 5, base_offset=N, batch_bytes=100)
    lg.append_batches(enc.buffer.tobytes())  # rolls five new segments
    lg.flush()
    # the process stops here (no close): the next writer recovers from a listing
    again, listings = opened(tmp_path, clean=False)
    assert listings == 1
    assert len(again.segments) == N + 5 and again.log_end_offset == N + 5
    assert bases_of(again) == listed_bases(tmp_path)
    again.close()
    lg._failed = RuntimeError("stopped")  # (its files are closed without a flush or a list)
    lg.close()


def test_a_temporary_file_at_the_close_leaves_no_list(tmp_path: Path) -> None:
    build(tmp_path)
    lg, _ = opened(tmp_path)
    stray = tmp_path / DIR / f"{segment_name(3)}.log.deleted"
    stray.write_bytes(b"")
    written = closed_list.WRITTEN[0]
    lg.close()
    assert closed_list.WRITTEN[0] == written and not list_file(tmp_path).exists()
    lg, listings = opened(tmp_path)
    assert listings >= 1 and not stray.exists()  # removed by recovery, as before
    lg.close()


def test_reads_appends_retention_and_compaction_after_a_listless_open_are_exact(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    build(a, cfg=COMPACT)
    shutil.copytree(a, b)
    list_file(b).unlink()  # b: opened by listing
    logs = []
    for root, expect in ((a, 0), (b, 1)):
        lg, listings = opened(root, COMPACT)
        assert listings == expect
        keys = [b"k%d" % i for i in range(20)]
        enc = records.encode([b"z" * 80] * 20, key=keys, timestamp=T0, base_offset=N, batch_bytes=100)
        lg.append_batches(enc.buffer.tobytes())  # rolls 20 segments
        lg.delete_segments(lg.segments[:10], now=T0)
        maintain(lg, now=T0, force=True, retention=False)
        logs.append(lg)
    (la, lb) = logs
    assert state(la) == state(lb)
    assert bases_of(la) == listed_bases(a)
    assert closed_list.MIN_SEGMENTS <= len(la.segments) < N  # compaction replaced segments
    for lg in logs:
        lg.close()
    # closed again: the list holds the files as maintenance left them
    found = closed_list.decode(list_file(a).read_bytes())
    assert found is not None and found.bases == listed_bases(a) == listed_bases(b)
    la, listings = opened(a, COMPACT)
    lb, _ = opened(b, COMPACT)
    assert listings == 0 and state(la) == state(lb)
    la.close()
    lb.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 2), min_size=1, max_size=300, unique=True), st.integers(0, 10))
def test_the_list_encodes_sorted_base_offsets(offsets: list[int], extra: int) -> None:
    bases = np.array(sorted(offsets), dtype=np.int64)
    leo = int(bases[-1]) + min(extra, 2**63 - 1 - int(bases[-1]))
    data = closed_list.encode(bases, leo, "1:2:3:4")
    found = closed_list.decode(data)
    assert found is not None and found.bases == bases.tolist() and found.log_end_offset == leo
    assert found.identity == "1:2:3:4"
    for i in range(0, len(data), max(1, len(data) // 40)):  # any flipped byte is refused
        bad = bytearray(data)
        bad[i] ^= 0x10
        assert closed_list.decode(bytes(bad)) is None


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.integers(0, 2**63 - 1), st.sampled_from([".log", ".index", ".timeindex", ".txnindex"])
            ).map(lambda t: f"{t[0]:020d}{t[1]}"),
            st.sampled_from(
                [
                    ".pylog-segments",
                    "leader-epoch-checkpoint",
                    "partition.metadata",
                    "x.log",
                    "1.index",
                    "a.log.deleted",
                ]
            ),
            st.text(alphabet="0123456789.abglnoxé\n", max_size=26),
        ),
        max_size=40,
    )
)
def test_the_scan_of_a_listing_finds_what_the_names_say(names: list[str]) -> None:
    names = sorted(set(names))
    scanned = scan(names)
    parsed = [(int(n[:20]), n[20:]) for n in names if len(n) > 20 and n[:20].isascii() and n[:20].isdigit()]
    if scanned is None:  # only for a name it cannot vouch for (the loader then looks at each)
        assert any(not n.isascii() or "\n" in n or n.endswith((".log", "index")) for n in names)
        return
    logs = sorted(b for b, suffix in parsed if suffix == ".log")
    assert scanned.bases == logs
    indexed = {b for b, suffix in parsed if suffix in (".index", ".timeindex", ".txnindex")}
    assert scanned.orphans == {f"{b:020d}" for b in indexed - set(logs)}
    assert scanned.has_temp == any(n.endswith((".deleted", ".cleaned", ".swap")) for n in names)
