"""Loading and crash recovery (Kafka's LogLoaderTest; TESTING.md checklist A and D27).

Each test writes a log, puts its files into a damaged or half-finished state by hand, reopens
it the way the log manager does after a crash (unclean shutdown, recovery point from the
checkpoint), and checks what survives.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.partition.loader import load_log, open_log
from pylog.storage.partition.log import Log

DIR = "t-0"
CFG = {"segment.bytes": 2048, "index.interval.bytes": 256}


def write_log(root: Path, n: int = 100, flush: bool = True, **cfg: object) -> Log:
    lg = open_log(LocalStorage(root), DIR, LogConfig.from_dict({**CFG, **cfg}), had_clean_shutdown=True)
    for i in range(n):
        lg.append([b"value-%05d" % i * 3], key=[b"k%d" % i], timestamp=1_000_000 + i)
    if flush:
        lg.flush()
    return lg


def reopen(
    root: Path, *, clean: bool = False, recovery_point: int = 0, log_start_offset: int = 0, **cfg: object
):  # type: ignore[no-untyped-def]
    return load_log(
        LocalStorage(root),
        DIR,
        LogConfig.from_dict({**CFG, **cfg}),
        had_clean_shutdown=clean,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
    )


def rows(lg: Log) -> list[tuple[int, bytes]]:
    t = lg.read_table()
    return list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def rows_from(lg: Log, start: int) -> list[tuple[int, bytes]]:
    t = lg.read_table(start)
    return list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def files(root: Path) -> list[str]:
    return sorted(os.listdir(root / DIR))


def test_a1_unflushed_appends_survive_a_process_kill(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 50, flush=False)
    before = rows(lg)
    leo = lg.log_end_offset
    # process killed: nothing closed, no marker; the page cache still has the bytes
    res = reopen(tmp_path, recovery_point=0)
    assert rows(res.log) == before and res.log.log_end_offset == leo
    assert res.log.recovery_point <= leo
    assert res.recovery.lost_bytes == 0


@pytest.mark.parametrize("seed", range(10))
def test_a3_garbage_appended_to_active_segment_and_index(tmp_path: Path, seed: int) -> None:
    lg = write_log(tmp_path, 60)
    before, leo = rows(lg), lg.log_end_offset
    active = lg.active
    lg.close()
    rng = random.Random(seed)
    for path in (active.log_path, active.offset_index.path):
        with open(tmp_path / path, "ab") as f:
            f.write(rng.randbytes(rng.randint(1, 1024)))
    res = reopen(tmp_path, recovery_point=active.base_offset)
    assert rows(res.log) == before
    assert res.log.log_end_offset == leo
    res.log.append([b"after"], timestamp=5)
    assert rows(res.log)[-1] == (leo, b"after")


def test_a4_cut_inside_last_batch_drops_only_that_batch(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 30)
    before = rows(lg)
    seg = lg.active
    lg.close()
    path = tmp_path / seg.log_path
    data = path.read_bytes()
    last = records.decode(data)
    start = int(last.batches.position[-1])
    for cut in range(start + 1, len(data)):
        path.write_bytes(data[:cut])
        res = reopen(tmp_path, recovery_point=seg.base_offset)
        assert rows(res.log) == before[:-1]
        assert path.stat().st_size == start
        res.log.close()


def test_a5_corruption_in_older_segment_truncates_and_drops_later_segments(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 200)
    assert len(lg.segments) >= 4
    victim = lg.segments[1]
    later = [s.log_path for s in lg.segments[2:]]
    lg.close()
    path = tmp_path / victim.log_path
    data = bytearray(path.read_bytes())
    hdr = records.decode(bytes(data)).batches
    mid = len(hdr) // 2
    data[int(hdr.position[mid]) + 70] ^= 0xFF  # inside the CRC-covered records
    path.write_bytes(bytes(data))
    res = reopen(tmp_path, recovery_point=0)
    assert res.recovery.truncated_file == victim.log_path
    assert res.recovery.deleted_segments == later and res.recovery.lost_bytes > 0
    assert "truncated" in res.recovery.summary()
    assert res.log.log_end_offset == int(hdr.base_offset[mid])
    assert [o for o, _ in rows(res.log)] == list(range(int(hdr.base_offset[mid])))
    for p in later:
        assert not (tmp_path / p).exists()


@pytest.mark.parametrize("damage", ["delete", "truncate2", "nonsense"])
def test_a6_damaged_indexes_are_rebuilt(tmp_path: Path, damage: str) -> None:
    lg = write_log(tmp_path, 150)
    before = rows(lg)
    probes = [(o, lg.offset_for_timestamp(1_000_000 + o)) for o in range(0, 150, 7)]
    segs = lg.segments
    lg.close()
    rng = random.Random(1)
    for seg in segs:
        for p in (seg.offset_index.path, seg.time_index.path):
            f = tmp_path / p
            if damage == "delete":
                f.unlink()
            elif damage == "truncate2":
                f.write_bytes(f.read_bytes()[:2])
            else:
                f.write_bytes(rng.randbytes(f.stat().st_size + 5))
    res = reopen(tmp_path, recovery_point=0)
    assert rows(res.log) == before
    for o, expect in probes:
        assert res.log.offset_for_timestamp(1_000_000 + o) == expect
        assert res.log.read_table(o, o + 1).column("offset").to_pylist() == [o]


def test_a6_missing_index_rebuilt_even_after_clean_shutdown(tmp_path: Path) -> None:
    """A sealed segment's missing index is rebuilt when the segment is first used (Kafka's lazy
    indexes), not by the load."""
    lg = write_log(tmp_path, 150)
    before = rows(lg)
    first = lg.segments[0]
    lg.close()
    (tmp_path / first.offset_index.path).unlink()
    res = reopen(tmp_path, clean=True)
    assert first.log_path not in res.recovery.rebuilt_indexes
    assert not (tmp_path / first.offset_index.path).exists()
    seg = res.log.segments[0]
    middle = (seg.base_offset + res.log.segments[1].base_offset) // 2
    assert rows_from(res.log, middle) == [r for r in before if r[0] >= middle]  # uses its index
    assert (tmp_path / first.offset_index.path).exists()
    assert seg.rebuilt_indexes == [str(first.offset_index.path)]
    assert rows(res.log) == before


def test_a7_orphan_indexes_and_deleted_files_removed(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 100)
    before, names = rows(lg), files(tmp_path)
    lg.close()
    extra = [
        "00000000000000099999.index",
        "00000000000000099999.timeindex",
        "00000000000000000000.log.deleted",
        "00000000000000000007.index.deleted",
    ]
    for n in extra:
        (tmp_path / DIR / n).write_bytes(b"junk")
    res = reopen(tmp_path, clean=True)
    assert files(tmp_path) == names
    assert sorted(res.recovery.removed_files) == sorted(extra)
    assert rows(res.log) == before


def test_a8_clean_shutdown_skips_recovery_unclean_recovers(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 40)
    first = lg.segments[0]
    assert len(lg.segments) > 1
    lg.close()
    path = tmp_path / first.log_path
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # inside the CRC-covered part of the first batch of an inactive segment
    path.write_bytes(bytes(data))
    clean = reopen(tmp_path, clean=True)
    assert clean.recovery.recovered_segments == []  # trusted, not scanned
    unclean = reopen(tmp_path, clean=False, recovery_point=0)
    assert unclean.recovery.recovered_segments and unclean.recovery.truncated_bytes == len(data)
    assert unclean.log.log_end_offset == 0


def test_a8_clean_shutdown_still_checks_the_tail_of_the_active_segment(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 40)
    seg = lg.active
    lg.close()
    with open(tmp_path / seg.log_path, "ab") as f:
        f.write(b"\x00" * 100)  # a torn / preallocated tail
    clean = reopen(tmp_path, clean=True)
    assert clean.recovery.recovered_segments == [seg.log_path]  # only the active one
    assert clean.recovery.truncated_bytes == 100 and clean.recovery.problems
    assert clean.log.log_end_offset == 40


def test_a10_log_start_above_all_data(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 30)
    lg.close()
    res = reopen(tmp_path, clean=True, log_start_offset=500)
    assert [s.base_offset for s in res.log.segments] == [500]
    assert res.log.log_end_offset == 500 and res.log.log_start_offset == 500
    res.log.append([b"x"])
    assert rows(res.log) == [(500, b"x")]


def test_a10_segments_removed_by_hand(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 200)
    first_kept = lg.segments[2]
    for seg in lg.segments[:2]:
        seg.delete()
    lg.close()
    res = reopen(tmp_path, clean=True, log_start_offset=0)
    assert res.log.log_start_offset == first_kept.base_offset
    assert rows(res.log)[0][0] == first_kept.base_offset


@pytest.mark.parametrize("state", ["empty-dir", "empty-active", "zero-byte-only", "preallocated"])
def test_a11_empty_and_preallocated_segments(tmp_path: Path, state: str) -> None:
    d = tmp_path / DIR
    expected_leo = 0
    if state == "empty-dir":
        d.mkdir()
    elif state == "empty-active":
        lg = write_log(tmp_path, 10)
        lg.roll()
        expected_leo = 10
        lg.close()
    elif state == "zero-byte-only":
        d.mkdir()
        (d / "00000000000000000000.log").write_bytes(b"")
    else:
        lg = write_log(tmp_path, 10)
        seg = lg.active
        lg.close()
        with open(tmp_path / seg.log_path, "ab") as f:
            f.write(b"\x00" * 4096)  # preallocated file after an unclean stop
        expected_leo = 10
    res = reopen(tmp_path, recovery_point=0)
    assert res.log.log_end_offset == expected_leo
    res.log.append([b"next"])
    assert rows(res.log)[-1] == (expected_leo, b"next")


def test_d27_bit_flip_is_a_crc_error_on_read_and_truncated_on_recovery(tmp_path: Path) -> None:
    from pylog.storage.errors import CorruptRecordError

    lg = write_log(tmp_path, 20)
    seg = lg.segments[0]
    lg.close()
    path = tmp_path / seg.log_path
    data = bytearray(path.read_bytes())
    h = records.decode(bytes(data)).batches
    target = int(h.position[5]) + 40  # in the CRC-covered part of batch 5
    data[target] ^= 0x10
    path.write_bytes(bytes(data))
    reader = reopen(tmp_path, clean=True)
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as ei:
        reader.log.read_table()
    assert ei.value.path and ei.value.path.endswith(".log") and ei.value.position == int(h.position[5])
    res = reopen(tmp_path, recovery_point=0)
    assert res.log.log_end_offset == int(h.base_offset[5])


def test_swap_completion_and_rollback(tmp_path: Path) -> None:
    """A .swap set complete (no .cleaned left) rolls forward; a .swap at or above the smallest
    .cleaned base rolls back (checklist B13/B14, placed by hand).  A compacted log: the offsets
    the "cleaned" copy drops are a gap there (in a delete-policy log, damage that reads report)."""
    compact = {"cleanup.policy": "compact"}
    lg = write_log(tmp_path, 60, **compact)
    before = rows(lg)
    seg0 = lg.segments[0]
    lg.close()
    d = tmp_path / DIR
    stem = f"{seg0.base_offset:020d}"
    # a "cleaned" copy of segment 0 that keeps only its first batch
    data = (d / f"{stem}.log").read_bytes()
    first = records.decode(data).batches
    keep = data[: int(first.size[0])]
    (d / f"{stem}.log.swap").write_bytes(keep)
    res = reopen(tmp_path, recovery_point=0, **compact)
    assert f"{DIR}/{stem}.log" in res.recovery.completed_swaps
    kept = int(first.records_count[0])
    assert rows(res.log)[:kept] == before[:kept]
    assert rows(res.log)[kept][0] == seg0.read_next_offset()  # the rest of segment 0 is gone
    res.log.close()
    # rollback: a .swap above a .cleaned of the same replacement is discarded
    seg1 = res.log.segments[1]
    s1 = f"{seg1.base_offset:020d}"
    (d / f"{stem}.log.cleaned").write_bytes(keep)
    (d / f"{s1}.log.swap").write_bytes(b"garbage")
    again = reopen(tmp_path, recovery_point=0, **compact)
    assert not any(n.endswith((".swap", ".cleaned")) for n in files(tmp_path))
    assert rows(again.log) == rows(res.log)


@pytest.mark.parametrize("seed", range(10))
def test_recovery_with_nonsense_from_a_random_record_to_eof(tmp_path: Path, seed: int) -> None:
    """Kafka's testRecoveryWithCorruptMessage: garbage from a random position inside a random
    batch to the end of the segment → only the batches before it remain."""
    lg = write_log(tmp_path, 30)
    seg = lg.segments[0]
    before = rows(lg)
    lg.close()
    path = tmp_path / seg.log_path
    data = path.read_bytes()
    h = records.decode(data).batches
    rng = random.Random(seed)
    b = rng.randrange(len(h))
    cut = int(h.position[b]) + rng.randrange(int(h.size[b]))
    path.write_bytes(data[:cut] + rng.randbytes(len(data) - cut))
    res = reopen(tmp_path, recovery_point=0)
    kept = int(h.base_offset[b])
    assert rows(res.log) == before[:kept]
    assert res.recovery.truncated_file == seg.log_path


def test_reopen_unclean_then_truncate(tmp_path: Path) -> None:
    lg = write_log(tmp_path, 50, flush=False)
    res = reopen(tmp_path, recovery_point=0)
    res.log.truncate_to(3)
    assert res.log.log_end_offset == 3 and len(res.log.segments) == 1
    assert [o for o, _ in rows(res.log)] == [0, 1, 2]
    del lg


def test_recovery_point_is_not_advanced_by_recovery(tmp_path: Path) -> None:
    write_log(tmp_path, 40, flush=False)
    res = reopen(tmp_path, recovery_point=10)
    assert res.log.recovery_point == 10  # only a flush advances it
    res.log.flush()
    assert res.log.recovery_point == res.log.log_end_offset == 40


def test_time_index_left_as_swap_is_completed(tmp_path: Path) -> None:
    """Kafka's crash point 5 of a swap: the .log and .index are final, the .timeindex is still
    .swap → loading completes it (the segment keeps its time index)."""
    lg = write_log(tmp_path, 60)
    seg = lg.segments[0]
    lg.close()
    ti = tmp_path / seg.time_index.path
    ti.rename(ti.with_name(ti.name + ".swap"))
    res = reopen(tmp_path, recovery_point=0)
    assert ti.exists() and not ti.with_name(ti.name + ".swap").exists()
    assert res.log.segments[0].time_index.last_entry[0] >= 1_000_000


def test_an_object_store_log_opens_without_reading_sealed_indexes_and_still_refuses_damaged_ones() -> None:
    """Opening a log on an object store reads no index of a sealed segment (its files change
    only through commits, which wrote them whole); an index damaged anyway is caught when it is
    first used: ignored, the segment scanned, the right records served."""
    import itertools

    import pyarrow as pa

    from pylog.storage.backends.objectstore.client import ObjectClient
    from pylog.storage.backends.objectstore.storage import ObjectStorage
    from pylog.storage.root.manager import Root

    url = f"memory://pylog-loader/{next(itertools.count())}-{id(object())}"
    root = Root(ObjectStorage(ObjectClient(url)))
    root.create_topic("t", 1, {"segment.bytes": "6000", "index.interval.bytes": "100"})
    for i in range(6):  # sealed segments with indexes of several entries
        root.append("t", pa.table({"value": [b"v%d-%03d-" % (i, j) + b"x" * 200 for j in range(20)]}))
    reads: list[str] = []
    st = ObjectStorage(ObjectClient(url))
    real = st.read
    st.read = lambda path, *a, **k: reads.append(path) or real(path, *a, **k)  # type: ignore[method-assign]
    lg = Root(st).writable_log("t", 0)
    sealed = lg.segments[:-1]
    assert len(sealed) >= 3
    active = (lg.active.offset_index.path, lg.active.time_index.path)
    assert not [p for p in reads if p.endswith("index") and p not in active], reads
    largest = sealed[1].largest_timestamp
    # damage a sealed segment's offset index (entries past its log), then read through it
    w = Root(ObjectStorage(ObjectClient(url)))

    def damage() -> None:
        w.storage.write_atomic(sealed[1].offset_index.path, (b"\x00\x00\x7f\xff" + b"\x7f\xff\xff\xff") * 4)
        w.storage.write_atomic(sealed[1].time_index.path, b"\x7f" * 24)  # entries past the segment

    w.transaction(damage)
    r = Root(ObjectStorage(ObjectClient(url), read_only=True), read_only=True)
    start = sealed[1].base_offset
    got = r.read_table("t", [0], start_offset=start + 5, end_offset=start + 8).column("value").to_pylist()
    assert [v[:6] for v in got] == [b"v%d-%03d" % divmod(start + k, 20) for k in range(5, 8)]
    # the damaged time index is ignored: the segment's largest timestamp (retention, the
    # compaction lag, timestamp lookups) is read from its batches instead
    again = Root(ObjectStorage(ObjectClient(url))).writable_log("t", 0)
    assert again.segments[1].time_index.rejected is None  # (not loaded yet: lazy)
    assert again.segments[1].largest_timestamp == largest
    assert again.segments[1].time_index.rejected is not None
