"""The log cleaner (after Kafka's LogCleanerTest) and its kernels."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pylog.storage.codec import batch as B
from pylog.storage.codec import records, rewrite
from pylog.storage.config import CleanerConfig
from pylog.storage.errors import ConfigError, CorruptRecordError, InvalidOffsetError
from pylog.storage.maintenance import offset_map
from pylog.storage.maintenance.cleaner import Cleaner, Throttler, group_segments_by_size, log_to_clean
from pylog.storage.maintenance.offset_map import OffsetMap
from pylog.storage.partition import producer_state
from pylog.storage.partition.segment import INT32_MAX
from tests.storage.compaction_util import (
    DAY,
    DIR,
    T0,
    Crash,
    assert_kafka_valid,
    batch_at,
    cleaner,
    crash_at,
    headers,
    latest_per_key,
    open_log,
    put,
    put_many,
    reopen,
    rows,
    segment_files,
)

KEYS = [b"k%d" % i for i in range(10)]


def write_dupes(root: Path, n: int = 120, **cfg: object):  # type: ignore[no-untyped-def]
    """A compacted log of ``n`` single-record batches over 10 keys, several segments."""
    lg = open_log(root, **cfg)
    put_many(lg, [(KEYS[i % 10], b"v%04d" % i) for i in range(n)])
    return lg


# ============================================================================ kernels


def test_murmur3_x64_128_reference_vectors(kernels: str) -> None:
    # PeterScott/murmur3 test.c (hash printed as 4 little-endian 32-bit words), seed 123
    vectors = [
        (b"Hello, world!", "8743acad421c8c73d373c3f5f19732fd"),
        (b"xxxxxxxxxxxxxxxxxxxxxxxxxxxx", "becf7e04dbcf74637751664ef66e73e0"),
        (b"", "4cd9597081679d1abd92f8784bace33d"),
    ]
    for text, expected in vectors:
        data = np.frombuffer(text + b"\0", np.uint8)
        h1, h2 = np.empty(1, np.int64), np.empty(1, np.int64)
        from pylog.storage.codec import _kernels

        _kernels.active().hash_keys(data, np.array([0]), np.array([len(text)]), 123, h1, h2)
        words = np.frombuffer(h1.astype("<i8").tobytes() + h2.astype("<i8").tobytes(), "<u4")
        assert "".join(f"{w:08x}" for w in words) == expected


def test_offset_map_put_get_capacity(kernels: str) -> None:
    m = OffsetMap((24 + 8 * 0.5) * 100, 0.5)  # 24 bytes a slot, 8 a key: all within the memory
    assert (m.slots, m.capacity) == (100, 50)
    keys = [b"key-%d" % i for i in range(60)]
    assert m.put(keys, np.arange(60)) == 50  # stops before the first new key that does not fit
    assert m.size == 50 and m.full
    assert m.put([b"key-3"], [1000]) == 1  # an existing key is still updated when full
    got = m.get([*keys, b"other"])
    assert got[3] == 1000 and got[10] == 10 and (got[50:] == -1).all()
    assert m.offsets().tolist() == [*range(3), *range(4, 50), 1000]  # sorted, one per key
    assert m.get([b"key-7"]).tolist() == [7]  # lookups still work ...
    with pytest.raises(ValueError, match="clear"):
        m.put([b"more"], [2000])  # ... but the slot list now holds the offsets
    m.clear()
    assert m.size == 0 and (m.get(keys) == -1).all() and m.offsets().size == 0
    with pytest.raises(ConfigError, match="holds no key"):
        OffsetMap(24, 0.9)


def test_walk_and_rebuild_keep_offsets_codecs_and_horizon(kernels: str) -> None:
    rng = np.random.default_rng(3)
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        n = 120
        keys = [b"k%d" % rng.integers(0, 9) for _ in range(n)]
        vals = [None if rng.random() < 0.2 else b"v" * int(rng.integers(0, 40)) for _ in range(n)]
        hdrs = [[("h", b"x")] if rng.random() < 0.3 else [] for _ in range(n)]
        enc = records.encode(
            vals, keys, T0 + np.arange(n), hdrs, base_offset=50, codec=codec, batch_bytes=400
        )
        sp = rewrite.walk(enc.buffer, enc.batches)
        assert sp.keys() == keys and (sp.offset == 50 + np.arange(n)).all()
        keep = rng.random(n) < 0.4
        nb = len(enc.batches)
        cnt = np.bincount(sp.batch_index[keep], minlength=nb)
        action = np.where(cnt == 0, rewrite.EMPTY, rewrite.REBUILD)
        action[0] = rewrite.COPY
        action[1] = rewrite.DROP
        horizon = np.full(nb, T0 + DAY)
        out, h = rewrite.rebuild(sp, keep, action, horizon)
        rs = records.decode(out)
        kept = (keep & (action[sp.batch_index] == rewrite.REBUILD)) | (action[sp.batch_index] == rewrite.COPY)
        assert rs.records.column("offset").to_pylist() == (50 + np.arange(n))[kept].tolist()
        assert rs.records.column("value").to_pylist() == [v for v, k in zip(vals, kept, strict=True) if k]
        assert rs.records.column("timestamp").to_pylist() == (T0 + np.arange(n))[kept].tolist()
        out_rows = np.nonzero(action != rewrite.DROP)[0]
        assert (rs.batches.last_offset == enc.batches.last_offset[out_rows]).all()
        rebuilt = action[out_rows] == rewrite.REBUILD
        assert (rs.batches.has_delete_horizon == rebuilt).all()
        assert (rs.batches.base_timestamp[rebuilt] == T0 + DAY).all()
        empty = action[out_rows] == rewrite.EMPTY
        assert (rs.batches.records_count[empty] == 0).all() and (rs.batches.base_timestamp[empty] == -1).all()
        assert (rs.batches.codec == np.where(empty, 0, enc.batches.codec[out_rows])).all()
        assert (h.size == rs.batches.size).all()


def test_walk_reports_corruption_like_decode(kernels: str) -> None:
    enc = records.encode([b"value"], [b"key"], 5)
    buf = enc.buffer.copy()
    buf[61 + 3] ^= 0xFF  # inside the first record
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        rewrite.walk(buf, enc.batches, path="x.log")


# ============================================================================ semantics


def test_clean_keeps_latest_value_per_key_with_original_offsets(tmp_path: Path, kernels: str) -> None:
    lg = write_dupes(tmp_path)
    before = rows(lg)
    leo = lg.log_end_offset
    res = cleaner().clean(lg, now=T0)
    assert res.end_offset == lg.active.base_offset == res.first_uncleanable_offset
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)
    assert lg.log_end_offset == leo
    assert res.records_removed == len(before) - len(rows(lg))
    assert_kafka_valid(tmp_path)


def test_b15_offsets_preserved_empty_batch_kept_read_at_gap(tmp_path: Path) -> None:
    lg = open_log(tmp_path, delete_retention_ms=1000)
    put_many(lg, [(k, b"old") for k in KEYS])  # 0..9
    put_many(lg, [(k, None) for k in KEYS])  # 10..19: tombstones for every key
    lg.roll()
    upper = lg.active.base_offset
    assert upper == 20
    cleaner().clean(lg, now=T0)
    assert rows(lg) == [(10 + i, k, None) for i, k in enumerate(KEYS)]  # tombstones kept (horizon set)
    assert rows(lg, 3) == rows(lg)  # a read at a gap starts at the next offset
    assert lg.read(3)[1] and records.decode(lg.read(3)[1]).batches.base_offset[0] == 10
    cleaner().clean(lg, now=T0 + 1000, first_dirty=0)  # horizon passed: tombstones go
    assert rows(lg) == []
    hs = headers(lg)
    # the batch ending right before the first uncleanable offset stays, empty (Kafka's RETAIN_EMPTY)
    assert len(hs) == 1 and int(hs.records_count[0]) == 0 and int(hs.last_offset[0]) == upper - 1
    assert lg.segments[-2].read_next_offset() == upper == lg.log_end_offset
    lg.close()
    again = reopen(tmp_path, delete_retention_ms=1000)
    assert again.log_end_offset == upper and rows(again) == []
    assert_kafka_valid(tmp_path)


def test_b16_active_segment_lso_and_min_lag_never_rewritten(tmp_path: Path) -> None:
    # min.compaction.lag.ms: segments with a record younger than the lag stay dirty and untouched
    lg = open_log(tmp_path, min_compaction_lag_ms=10_000)
    for i in range(60):
        put(lg, KEYS[i % 10], b"v%d" % i, ts=T0 + i * 1000)
    seg_ts = [(s.base_offset, s.largest_timestamp) for s in lg.segments[:-1]]
    now = T0 + 40_000
    young = next(b for b, ts in seg_ts if ts > now - 10_000)
    ltc = log_to_clean(lg, None, now)
    assert ltc.first_uncleanable_offset == young
    files = segment_files(tmp_path)
    res = cleaner().clean(lg, now=now)
    assert res.end_offset == young
    after = segment_files(tmp_path)
    for seg in lg.segments:
        if seg.base_offset >= young:
            name = os.path.basename(seg.log_path)
            assert after[name] == files[name]  # byte for byte: never rewritten
    assert [r for r in rows(lg) if r[0] >= young] == [(o, KEYS[o % 10], b"v%d" % o) for o in range(young, 60)]


def test_b16_open_transaction_bounds_the_cleanable_range(tmp_path: Path) -> None:
    lg = write_dupes(tmp_path, 30)
    txn_start = put(
        lg, b"t", b"in-txn", producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    put_many(lg, [(KEYS[i % 10], b"w%d" % i) for i in range(30)])
    lg.roll()
    assert producer_state.last_stable_offset(lg) == txn_start
    ltc = log_to_clean(lg, None, T0)
    holder = next(s for s in reversed(lg.segments) if s.base_offset <= txn_start)
    assert ltc.first_uncleanable_offset == holder.base_offset
    before = rows(lg)
    cleaner().clean(lg, now=T0)
    assert rows(lg) == latest_per_key(before, holder.base_offset)
    assert [r for r in rows(lg) if r[0] >= holder.base_offset] == [
        r for r in before if r[0] >= holder.base_offset
    ]


def test_b17_tombstone_kept_until_delete_horizon(tmp_path: Path) -> None:
    lg = open_log(tmp_path, delete_retention_ms=5000)
    put_many(lg, [(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"c", b"3")])
    lg.roll()
    cleaner().clean(lg, now=T0)
    assert rows(lg) == [(1, b"b", b"2"), (2, b"a", None), (3, b"c", b"3")]
    tomb = batch_at(lg, 2)
    assert bool(tomb.has_delete_horizon[0]) and int(tomb.base_timestamp[0]) == T0 + 5000
    cleaner().clean(lg, now=T0 + 4999, first_dirty=0)
    assert (2, b"a", None) in rows(lg)  # horizon not reached
    cleaner().clean(lg, now=T0 + 5000, first_dirty=0)
    assert rows(lg) == [(1, b"b", b"2"), (3, b"c", b"3")]
    assert_kafka_valid(tmp_path)


def _txn(lg, pid: int, key: bytes, value: bytes, ts: int = T0) -> int:  # type: ignore[no-untyped-def]
    return put(lg, key, value, ts, producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True)


def _marker(lg, kind: int, pid: int, ts: int = T0) -> int:  # type: ignore[no-untyped-def]
    return lg.append_batches(
        records.control_batch(kind, offset=0, producer_id=pid, producer_epoch=0, timestamp=ts)
    ).first_offset


def test_b17_aborted_data_removed_abort_marker_removed_after_horizon(tmp_path: Path) -> None:
    lg = open_log(tmp_path, delete_retention_ms=1000)
    put(lg, b"a", b"1")
    _txn(lg, 7, b"x", b"aborted-1")
    _txn(lg, 7, b"a", b"aborted-2")
    abort = _marker(lg, B.ABORT, 7)
    put(lg, b"b", b"2")
    lg.roll()
    now = T0 + 10 * DAY  # producer 7 has expired: its batches need not be kept as empty ones
    assert producer_state.read_table(lg).column("value").to_pylist() == [b"1", b"2"]
    cleaner().clean(lg, now=now)
    assert rows(lg) == [(0, b"a", b"1"), (4, b"b", b"2")]
    hs = headers(lg)
    assert abort in hs.base_offset.tolist()  # data removed in this pass: marker kept ...
    seg = next(s for s in lg.segments if s.base_offset <= abort < s.read_next_offset())
    assert seg.txn_index.entries().last_offset.tolist() == [abort]  # ... and still indexed
    cleaner().clean(lg, now=now, first_dirty=0)  # no data left: the marker gets a delete horizon
    h = batch_at(lg, abort)
    assert bool(h.is_control[0]) and bool(h.has_delete_horizon[0]) and int(h.base_timestamp[0]) == now + 1000
    cleaner().clean(lg, now=now + 999, first_dirty=0)
    assert abort in headers(lg).base_offset.tolist()
    cleaner().clean(lg, now=now + 1000, first_dirty=0)
    assert abort not in headers(lg).base_offset.tolist()
    assert rows(lg) == [(0, b"a", b"1"), (4, b"b", b"2")]
    assert_kafka_valid(tmp_path)


def test_b17_commit_marker_kept_while_its_data_remains(tmp_path: Path) -> None:
    lg = open_log(tmp_path, delete_retention_ms=1000)
    _txn(lg, 8, b"x", b"committed")
    commit = _marker(lg, B.COMMIT, 8)
    put(lg, b"y", b"1")
    lg.roll()
    now = T0 + 10 * DAY
    cleaner().clean(lg, now=now)
    assert commit in headers(lg).base_offset.tolist()
    assert producer_state.read_table(lg).column("value").to_pylist() == [b"committed", b"1"]
    put(lg, b"x", b"newer")  # the committed record is superseded ...
    lg.roll()
    cleaner().clean(lg, now=now, first_dirty=0)  # ... and removed; this pass still saw its batch
    h = batch_at(lg, commit)
    assert not bool(h.has_delete_horizon[0])
    cleaner().clean(lg, now=now, first_dirty=0)  # no batch of the transaction left: horizon set
    h = batch_at(lg, commit)
    assert bool(h.has_delete_horizon[0])
    cleaner().clean(lg, now=now + 1000, first_dirty=0)
    assert commit not in headers(lg).base_offset.tolist()
    assert rows(lg) == [(2, b"y", b"1"), (3, b"x", b"newer")]


def test_active_producer_last_batch_kept_empty(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    put(lg, b"a", b"1", producer_id=3, producer_epoch=2, base_sequence=0)
    put(lg, b"a", b"2", producer_id=3, producer_epoch=2, base_sequence=1)  # producer 3's last batch
    put(lg, b"a", b"3")
    lg.roll()
    cleaner().clean(lg, now=T0 + 1000)  # producer 3 is still active
    hs = headers(lg)
    assert hs.base_offset.tolist() == [1, 2]
    assert int(hs.records_count[0]) == 0 and int(hs.producer_id[0]) == 3 and int(hs.base_sequence[0]) == 1
    assert rows(lg) == [(2, b"a", b"3")]
    cleaner().clean(lg, now=T0 + 2 * DAY, first_dirty=0)  # expired: the empty batch goes
    assert headers(lg).base_offset.tolist() == [2]


def test_records_without_key_are_dropped(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="delete")
    put_many(lg, [(b"a", b"1"), (None, b"no-key"), (b"a", b"2")])  # type: ignore[list-item]
    lg.roll()
    lg.config = lg.config.with_overrides({"cleanup.policy": "compact"})
    cleaner().clean(lg, now=T0)
    assert rows(lg) == [(2, b"a", b"2")]


def test_codecs_are_preserved_and_kafka_valid(tmp_path: Path, kernels: str) -> None:
    lg = open_log(tmp_path, segment_bytes=4096)
    rng = np.random.default_rng(5)
    for i, codec in enumerate(["gzip", "snappy", "lz4", "zstd", "none"] * 6):
        keys = [b"k%d" % rng.integers(0, 15) for _ in range(8)]
        lg.append([b"value-%d-%d" % (i, j) for j in range(8)], key=keys, timestamp=T0 + i, codec=codec)
    lg.roll()
    before = rows(lg)
    h0 = headers(lg)
    codecs = dict(zip(h0.base_offset.tolist(), h0.codec.tolist(), strict=True))
    cleaner().clean(lg, now=T0)
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)
    h = headers(lg)
    for base, c, n in zip(h.base_offset.tolist(), h.codec.tolist(), h.records_count.tolist(), strict=True):
        assert n == 0 or c == codecs[base]
    assert_kafka_valid(tmp_path)


# ============================================================================ crash and recovery


STEPS_ORIGINAL = ["cleaned-written"]
STEPS_COMPACTED = ["all-swap", "renamed-deleted", "renamed-final"]


def _expected_states(tmp_path: Path) -> tuple[list, list]:  # type: ignore[type-arg]
    src = tmp_path / "src"
    lg = write_dupes(src, 40, segment_bytes=2048)
    lg.roll()
    lg.flush()
    original = rows(lg)
    probe = tmp_path / "probe"
    shutil.copytree(src, probe)
    plg = reopen(probe, clean=True, segment_bytes=2048)
    crash_at(plg, "done")  # the first group swapped in completely
    with pytest.raises(Crash):
        cleaner().clean(plg, now=T0)
    compacted = rows(reopen(probe, segment_bytes=2048))
    assert compacted != original
    return original, compacted


@pytest.mark.parametrize("step", STEPS_ORIGINAL + STEPS_COMPACTED)
def test_b13_crash_at_each_swap_step(tmp_path: Path, step: str) -> None:
    original, compacted = _expected_states(tmp_path)
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "src", work)
    lg = reopen(work, clean=True, segment_bytes=2048)
    crash_at(lg, step)
    with pytest.raises(Crash):
        cleaner().clean(lg, now=T0)
    again = reopen(work, segment_bytes=2048)
    assert rows(again) == (original if step in STEPS_ORIGINAL else compacted)
    assert not [n for n in os.listdir(work / DIR) if n.endswith((".cleaned", ".swap", ".deleted"))]
    assert_kafka_valid(work)


def test_b13_crash_with_only_some_files_swapped(tmp_path: Path) -> None:
    """Kafka's crash point 2: the .log renamed .swap, its indexes still .cleaned: rolled back."""
    original, _ = _expected_states(tmp_path)
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "src", work)
    lg = reopen(work, clean=True, segment_bytes=2048)
    crash_at(lg, "cleaned-written")
    with pytest.raises(Crash):
        cleaner().clean(lg, now=T0)
    d = work / DIR
    log_cleaned = next(n for n in os.listdir(d) if n.endswith(".log.cleaned"))
    os.rename(d / log_cleaned, d / log_cleaned.replace(".cleaned", ".swap"))
    assert rows(reopen(work, segment_bytes=2048)) == original


def test_b13_crash_with_swap_partly_renamed_to_final(tmp_path: Path) -> None:
    """Kafka's crash point 5: old segments .deleted, the new .log and .index renamed to their
    final names but the .timeindex still .swap: rolled forward, compacted keys."""
    _, compacted = _expected_states(tmp_path)
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "src", work)
    lg = reopen(work, clean=True, segment_bytes=2048)
    crash_at(lg, "renamed-final")  # every old segment of the first group is .deleted
    with pytest.raises(Crash):
        cleaner().clean(lg, now=T0)
    d = work / DIR
    first = f"{0:020d}"
    assert (d / f"{first}.log").exists() and (d / f"{first}.log.deleted").exists()
    os.rename(d / f"{first}.timeindex", d / f"{first}.timeindex.swap")  # the rename not yet done
    assert rows(reopen(work, segment_bytes=2048)) == compacted


def test_b14_mixed_cleaned_and_swap_files(tmp_path: Path) -> None:
    lg = write_dupes(tmp_path, 60, segment_bytes=1024)
    lg.roll()
    lg.flush()
    original = rows(lg)
    bases = [s.base_offset for s in lg.segments]
    d = tmp_path / DIR
    lg.close()
    # a multi-output replacement interrupted: a .swap at or above the smallest .cleaned base
    # belongs to it and is deleted with the .cleaned files; the old segments stay
    shutil.copy(d / f"{bases[2]:020d}.log", d / f"{bases[2]:020d}.log.swap")
    shutil.copy(d / f"{bases[1]:020d}.log", d / f"{bases[1]:020d}.log.cleaned")
    shutil.copy(d / f"{bases[1]:020d}.index", d / f"{bases[1]:020d}.index.cleaned")
    assert rows(reopen(tmp_path)) == original
    assert not [n for n in os.listdir(d) if n.endswith((".cleaned", ".swap"))]
    # a .swap below every .cleaned is complete: it replaces the segments in its offset range
    merged = records.decode(
        (d / f"{bases[0]:020d}.log").read_bytes() + (d / f"{bases[1]:020d}.log").read_bytes()
    )
    (d / f"{bases[0]:020d}.log.swap").write_bytes(
        (d / f"{bases[0]:020d}.log").read_bytes() + (d / f"{bases[1]:020d}.log").read_bytes()
    )
    shutil.copy(d / f"{bases[3]:020d}.log", d / f"{bases[3]:020d}.log.cleaned")
    again = reopen(tmp_path)
    assert rows(again) == original
    assert [s.base_offset for s in again.segments][:2] == [bases[0], bases[2]]
    assert len(merged) == bases[2] - bases[0]


# ============================================================================ bad input, progress, grouping


@pytest.mark.parametrize("damage", ["bad-magic", "truncated"])
def test_b18_corrupt_segment_raises_and_leaves_files_untouched(tmp_path: Path, damage: str) -> None:
    lg = write_dupes(tmp_path, 60)
    lg.roll()
    lg.flush()
    seg = lg.segments[1]
    path = tmp_path / seg.log_path
    data = bytearray(path.read_bytes())
    if damage == "bad-magic":
        data[16] = 0xFF  # Kafka's testMessageLargerThanMaxMessageSizeWithCorruptHeader
        path.write_bytes(bytes(data))
    else:  # a declared size runs past the end of the file
        path.write_bytes(bytes(data[:-7]))
    lg.close()
    lg = reopen(tmp_path, clean=True)
    files = segment_files(tmp_path)
    with pytest.raises(CorruptRecordError) as e:
        cleaner().clean(lg, now=T0)
    assert seg.log_path.split("/")[-1] in str(e.value)
    assert segment_files(tmp_path) == files


def test_b19_tiny_offset_map_progresses_and_matches_one_big_pass(tmp_path: Path, kernels: str) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    for root in (small, big):
        lg = write_dupes(root, 60)
        put_many(lg, [(b"t%d" % i, None) for i in range(3)])
        lg.roll()
        lg.close()
    lg_big = reopen(big, clean=True)
    res = cleaner().clean(lg_big, now=T0)
    assert not res.map_full
    lg_small = reopen(small, clean=True)
    tiny = cleaner(map_bytes=64)  # two slots: one key per pass
    assert tiny.offset_map.capacity == 1
    first_dirty, ends = 0, []
    while first_dirty < lg_small.active.base_offset:
        r = tiny.clean(lg_small, now=T0, first_dirty=first_dirty)
        assert r.end_offset > first_dirty  # every pass makes progress
        ends.append(r.end_offset)
        first_dirty = r.end_offset
    assert len(ends) > 5 and ends == sorted(ends)
    assert rows(lg_small) == rows(lg_big)
    hs, hb = headers(lg_small), headers(lg_big)
    assert hs.base_offset.tolist() == hb.base_offset.tolist()
    assert hs.records_count.tolist() == hb.records_count.tolist()


def test_b20_idempotent_and_checkpoint_reset(tmp_path: Path) -> None:
    lg = write_dupes(tmp_path, 80)
    lg.roll()
    before = rows(lg)
    r1 = cleaner().clean(lg, now=T0)
    once = rows(lg)
    assert once == latest_per_key(before, lg.active.base_offset)
    r2 = cleaner().clean(lg, now=T0, first_dirty=0)
    assert rows(lg) == once and r2.records_removed == 0
    lg.close()
    assert rows(reopen(tmp_path)) == once
    lg = reopen(tmp_path, clean=True)
    for bad in (lg.log_end_offset + 10, -5):
        ltc = log_to_clean(lg, bad, T0)
        assert ltc.checkpoint_reset and ltc.first_dirty_offset == lg.log_start_offset
        r = cleaner().clean(lg, now=T0, first_dirty=bad)
        assert r.first_dirty_offset == lg.log_start_offset and rows(lg) == once
    assert r1.end_offset == lg.active.base_offset


def test_b21_grouping_never_spans_more_than_2_31_offsets(tmp_path: Path) -> None:
    lg = open_log(tmp_path, segment_bytes=1 << 20)
    bases = [0, INT32_MAX - 5, INT32_MAX + 10, 2 * INT32_MAX + 100]
    for i, base in enumerate(bases):
        enc = records.encode([b"v%d" % i, b"w%d" % i], [b"k", b"k%d" % i], T0, base_offset=base)
        lg.append_batches(enc.buffer, assign_offsets=False)
    lg.roll()
    segs = lg.segments[:-1]
    assert [s.base_offset for s in segs] == [0, INT32_MAX + 10, 2 * INT32_MAX + 100]  # rolled on overflow
    groups = group_segments_by_size(segs, 1 << 20, 1 << 20, lg.active.base_offset)
    for g in groups:  # every group's offsets fit the 32-bit relative offsets of its first segment
        assert g[-1].read_next_offset() - 1 - g[0].base_offset <= INT32_MAX
    assert len(groups) == 3
    before = rows(lg)
    cleaner().clean(lg, now=T0)
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)
    with pytest.raises(InvalidOffsetError, match="32-bit relative offsets"):
        enc = records.encode([b"x"], [b"k"], T0, base_offset=segs[0].base_offset + INT32_MAX + 1)
        lg.segments[0].append(enc.buffer, enc.batches)


def test_grouping_respects_segment_and_index_bytes(tmp_path: Path) -> None:
    lg = write_dupes(tmp_path, 100, segment_bytes=1024)
    lg.roll()
    segs = lg.segments[:-1]
    upper = lg.active.base_offset
    one = group_segments_by_size(segs, 1024, 1 << 20, upper)
    assert all(len(g) == 1 for g in one)  # each segment is nearly full
    two = group_segments_by_size(segs, 4096, 1 << 20, upper)
    assert all(sum(s.size for s in g) <= 4096 for g in two) and len(two) < len(segs)
    idx = group_segments_by_size(segs, 1 << 20, 8 * max(1, len(segs[0].offset_index)), upper)
    assert all(sum(8 * len(s.offset_index) for s in g) <= 8 * max(1, len(segs[0].offset_index)) for g in idx)
    assert [s for g in two for s in g] == segs


def test_a_pass_groups_by_what_it_keeps_within_the_segment_and_index_limits(tmp_path: Path) -> None:
    """Kafka groups by the old sizes, so a log that compacts to a few percent would keep one
    nearly empty segment per old one; a pass here fills each new segment with what it keeps,
    never beyond ``segment.bytes`` or ``segment.index.bytes``."""
    lg = write_dupes(tmp_path, 400, segment_bytes=1024, index_interval_bytes=64)
    lg.roll()
    before = rows(lg)
    old = len(lg.segments) - 1
    assert old >= 20
    res = cleaner().clean(lg, now=T0)
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)
    sealed = lg.segments[:-1]
    assert res.groups == len(sealed) == 1 < old  # 10 keys kept: one segment, not one per old one
    assert res.segments_replaced == old
    # tight index limits (the log rolls on a full index too): each group stops before passing them
    lg2 = write_dupes(
        tmp_path / "b", 400, segment_bytes=1024, index_interval_bytes=16, segment_index_bytes=36
    )
    lg2.roll()
    before2 = rows(lg2)
    res2 = cleaner().clean(lg2, now=T0)
    assert rows(lg2) == latest_per_key(before2, lg2.active.base_offset)
    assert 1 < res2.groups < res2.segments_replaced
    for seg in lg2.segments[:-1]:
        assert seg.size <= 1024 and 8 * len(seg.offset_index) <= 36 and 12 * len(seg.time_index) <= 36


def test_a_group_never_overfills_the_offset_index_of_its_new_segment(tmp_path: Path) -> None:
    """A log that rolled on full indexes (an entry per batch): the bytes since the last index
    entry carry over from one old segment to the next in a group, so a joined segment's first
    kept batch can take an entry its old segment did not have; the group must leave room."""
    for interval in (0, 100):
        d = tmp_path / f"i{interval}"
        lg = open_log(d, segment_bytes=1 << 20, index_interval_bytes=interval, segment_index_bytes=8 * 50)
        for i in range(204):
            put(lg, b"k", b"v%d" % i)
        for i in range(200):
            put(lg, b"u%03d" % i, b"v")
        lg.roll()
        assert len(lg.segments) > 3  # rolled on full indexes
        before = rows(lg)
        res = cleaner().clean(lg, now=T0)
        assert rows(lg) == latest_per_key(before, lg.active.base_offset)
        assert res.groups < res.segments_replaced  # the emptied segments still merged
        for seg in lg.segments:
            assert len(seg.offset_index) <= 50 and len(seg.time_index) <= 400 // 12


def test_offset_map_module_hashes_lists() -> None:
    h1, h2 = offset_map.hash_keys([b"a", b"bb", b""])
    assert h1.shape == (3,) and len({(a, b) for a, b in zip(h1, h2, strict=True)}) == 3


def test_legacy_entries_kept_whole_or_rewritten_as_v2(tmp_path: Path) -> None:
    from tests.storage.codec.test_legacy import make_message, make_wrapper

    inner = b"".join(
        make_message(offset=i, key=k, value=v)
        for i, (k, v) in enumerate([(b"a", b"3"), (b"c", b"4"), (b"b", b"5")])
    )
    legacy = (
        make_message(offset=0, key=b"a", value=b"1")
        + make_message(offset=1, key=b"b", value=b"2")
        + make_wrapper(inner, offset=4)  # v1 wrapper: inner offsets 2, 3, 4
        + make_message(offset=5, key=b"d", value=b"6")
    )
    (tmp_path / DIR).mkdir()
    (tmp_path / DIR / f"{0:020d}.log").write_bytes(legacy)
    lg = reopen(tmp_path)
    assert [o for o, _, _ in rows(lg)] == [0, 1, 2, 3, 4, 5]
    put(lg, b"c", b"7")  # offset 6, v2
    lg.roll()
    cleaner().clean(lg, now=T0)
    assert rows(lg) == [(2, b"a", b"3"), (4, b"b", b"5"), (5, b"d", b"6"), (6, b"c", b"7")]
    h = headers(lg)
    assert h.magic.tolist() == [2, 1, 2]  # the wrapper lost a record: v2; the whole message: verbatim
    assert h.base_offset.tolist()[0] == 2 and h.last_offset.tolist()[0] == 4 and h.codec.tolist()[0] == 1
    assert_kafka_valid(tmp_path)


# ============================================================================ I/O throttle


class FakeClock:
    """A monotonic clock that only moves when told to or when slept on (no real waiting)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.t += seconds


def test_throttler_sleeps_when_ahead_of_the_rate_and_banks_no_idle_time() -> None:
    clock = FakeClock()
    throttle = Throttler(1000.0, clock=clock, sleep=clock.sleep)  # 1000 bytes/s, checked every 0.1 s
    throttle(50)  # 0.05 s worth at the limit, no time passed: not yet a check
    assert clock.sleeps == []
    throttle(100)  # 150 bytes in no time: 0.15 s worth -> sleep until the period ran at the limit
    assert clock.sleeps == [pytest.approx(0.15)]
    clock.t += 2.0  # slow work: 500 bytes over 2 s is under the limit
    throttle(500)
    assert len(clock.sleeps) == 1
    throttle(1000)  # the idle time of the last period is not credited to this burst
    assert clock.sleeps[1:] == [pytest.approx(1.0)]
    clock.t += 0.04
    throttle(100)  # 100 bytes after 0.04 s: 0.1 s worth -> sleeps the remaining 0.06 s
    assert clock.sleeps[2:] == [pytest.approx(0.06)]
    assert throttle.slept_s == pytest.approx(0.15 + 1.0 + 0.06)


@pytest.mark.parametrize("rate", [1000.0, 5000.0])
def test_cleaning_pass_is_throttled_to_io_max_bytes_per_second(tmp_path: Path, rate: float) -> None:
    lg = write_dupes(tmp_path)
    lg.roll()
    before = rows(lg)
    clock = FakeClock()  # moves only when the cleaner sleeps: all the elapsed time is throttling
    config = CleanerConfig.from_dict(
        {"log.cleaner.dedupe.buffer.size": 1 << 20, "log.cleaner.io.max.bytes.per.second": rate}
    )
    read: list[int] = []
    res = Cleaner(config, clock=clock, sleep=clock.sleep).clean(lg, now=T0, progress=read.append)
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)  # throttling changes no result
    io_bytes = sum(read) + res.bytes_written  # the offset map's and the rewrite's reads, plus writes
    assert res.bytes_read > 0 and sum(read) > res.bytes_read  # both phases read
    # the pass took (fake) time for all its I/O at the rate, less at most one check interval
    assert io_bytes / rate - 0.1 <= clock.t - 100.0 <= io_bytes / rate + 1e-9
    assert res.throttled_s == pytest.approx(clock.t - 100.0)


def test_unlimited_io_rate_never_reads_the_clock(tmp_path: Path) -> None:
    def boom(*_: object) -> float:
        raise AssertionError("the default (unlimited) rate must not read the clock or sleep")

    lg = write_dupes(tmp_path)
    res = Cleaner(CleanerConfig(), clock=boom, sleep=boom).clean(lg, now=T0)
    assert res.records_removed > 0 and res.throttled_s == 0.0
