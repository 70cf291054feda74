"""Offset, time and transaction indexes: lookups against brute force, append rules, files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import CorruptIndexError, IndexFullError, InvalidOffsetError
from pylog.storage.partition.index import OffsetIndex, TimeIndex
from pylog.storage.partition.txnindex import TxnIndex

INT32_MAX = 2**31 - 1
SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
BASE = st.integers(0, 2**40)


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path)


def fresh(tmp_path_factory: pytest.TempPathFactory) -> LocalStorage:
    return LocalStorage(tmp_path_factory.mktemp("idx"))


# --------------------------------------------------------------------------- brute force


def brute_offset_lookup(entries: list[tuple[int, int]], base: int, target: int) -> tuple[int, int]:
    best = (base, 0)
    for off, pos in entries:
        if off <= target:
            best = (off, pos)
    return best


def brute_time_lookup(entries: list[tuple[int, int]], base: int, target: int) -> tuple[int, int]:
    best = (-1, base)
    for ts, off in entries:
        if ts <= target:
            best = (ts, off)
    return best


@st.composite
def offset_entries(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    base = draw(BASE)
    rels = sorted(draw(st.sets(st.integers(0, INT32_MAX), max_size=40)))
    positions = sorted(draw(st.lists(st.integers(0, INT32_MAX), min_size=len(rels), max_size=len(rels))))
    return base, [(base + r, p) for r, p in zip(rels, positions, strict=True)]


@st.composite
def time_entries(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    base = draw(BASE)
    rels = sorted(draw(st.lists(st.integers(0, INT32_MAX), max_size=40)))
    stamps = sorted(draw(st.sets(st.integers(0, 2**62), min_size=len(rels), max_size=len(rels))))
    return base, [(ts, base + r) for ts, r in zip(stamps, rels, strict=True)]


def targets_around(values: list[int], extra: list[int]) -> list[int]:
    out = list(extra)
    for v in values:
        out += [v - 1, v, v + 1]
    return out


@SETTINGS
@given(data=offset_entries(), extra=st.lists(st.integers(-(2**41), 2**42), max_size=10))
def test_offset_lookup_matches_brute_force(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[int, list[tuple[int, int]]], extra: list[int]
) -> None:
    base, entries = data
    s = fresh(tmp_path_factory)
    idx = OffsetIndex(s, "0.index", base)
    for off, pos in entries:
        idx.append(off, pos)
    targets = targets_around([o for o, _ in entries], [*extra, base - 1, base, 2**63 - 1])
    for t in targets:
        assert idx.lookup(t) == brute_offset_lookup(entries, base, t)
    offs, poss = idx.lookup_many(np.array(targets, dtype=np.int64))
    assert list(zip(offs.tolist(), poss.tolist(), strict=True)) == [idx.lookup(t) for t in targets]
    # reload from disk: same entries, same answers
    idx.close()
    again = OffsetIndex(s, "0.index", base)
    o, p = again.entries()
    assert list(zip(o.tolist(), p.tolist(), strict=True)) == entries
    assert [again.lookup(t) for t in targets] == [idx.lookup(t) for t in targets]
    assert s.size("0.index") == 8 * len(entries) if entries else not s.exists("0.index")


@SETTINGS
@given(data=time_entries(), extra=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=10))
def test_time_lookup_matches_brute_force(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[int, list[tuple[int, int]]], extra: list[int]
) -> None:
    base, entries = data
    s = fresh(tmp_path_factory)
    idx = TimeIndex(s, "0.timeindex", base)
    for ts, off in entries:
        idx.maybe_append(ts, off)
    assert len(idx) == len(entries)
    targets = targets_around([t for t, _ in entries], [*extra, -1, 0])
    for t in targets:
        assert idx.lookup(t) == brute_time_lookup(entries, base, t)
    got_ts, got_off = idx.lookup_many(np.array(targets, dtype=np.int64))
    assert list(zip(got_ts.tolist(), got_off.tolist(), strict=True)) == [idx.lookup(t) for t in targets]
    idx.close()
    again = TimeIndex(s, "0.timeindex", base)
    ts, off = again.entries()
    assert list(zip(ts.tolist(), off.tolist(), strict=True)) == entries
    assert again.last_entry == (entries[-1] if entries else (-1, base))


@SETTINGS
@given(data=offset_entries(), cut=st.integers(-5, 2**32))
def test_offset_truncate_to(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[int, list[tuple[int, int]]], cut: int
) -> None:
    base, entries = data
    s = fresh(tmp_path_factory)
    idx = OffsetIndex(s, "0.index", base)
    for off, pos in entries:
        idx.append(off, pos)
    target = base + cut
    idx.truncate_to(target)
    keep = [(o, p) for o, p in entries if o < target]
    o, p = idx.entries()
    assert list(zip(o.tolist(), p.tolist(), strict=True)) == keep
    assert idx.last_offset == (keep[-1][0] if keep else base)
    idx.close()
    if s.exists("0.index"):
        assert s.size("0.index") == 8 * len(keep)
        again = OffsetIndex(s, "0.index", base)
        assert len(again) == len(keep)
    # appending after a truncation continues from the kept entries
    nxt = (keep[-1][0] + 1) if keep else base
    if nxt - base <= 2**31 - 1:  # the next offset must still fit the 32-bit relative range
        idx.append(nxt, keep[-1][1] if keep else 0)
        assert idx.last_offset == nxt


@SETTINGS
@given(data=time_entries(), cut=st.integers(-5, 2**32))
def test_time_truncate_to(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[int, list[tuple[int, int]]], cut: int
) -> None:
    base, entries = data
    s = fresh(tmp_path_factory)
    idx = TimeIndex(s, "0.timeindex", base)
    for ts, off in entries:
        idx.maybe_append(ts, off)
    target = base + cut
    idx.truncate_to(target)
    keep = [(t, o) for t, o in entries if o < target]
    t, o = idx.entries()
    assert list(zip(t.tolist(), o.tolist(), strict=True)) == keep
    assert idx.last_entry == (keep[-1] if keep else (-1, base))
    if s.exists("0.timeindex"):
        assert s.size("0.timeindex") == 12 * len(keep)


# --------------------------------------------------------------------------- append rules


def test_offset_append_rules(storage: LocalStorage) -> None:
    idx = OffsetIndex(storage, "100.index", 100)
    assert len(idx) == 0 and idx.last_offset == 100
    with pytest.raises(InvalidOffsetError):
        idx.append(99, 0)  # below the base offset
    with pytest.raises(InvalidOffsetError):
        idx.append(100 + INT32_MAX + 1, 0)  # relative offset overflows int32
    with pytest.raises(InvalidOffsetError):
        idx.append(100, -1)
    with pytest.raises(InvalidOffsetError):
        idx.append(100, INT32_MAX + 1)
    idx.append(100, 0)  # the first entry may be the base offset itself
    idx.append(100 + INT32_MAX, INT32_MAX)
    with pytest.raises(InvalidOffsetError):
        idx.append(100 + INT32_MAX, INT32_MAX)  # not above the last offset
    assert len(idx) == 2
    idx.flush()  # appends are buffered by the storage seam until flushed or closed
    assert storage.size("100.index") == 16
    assert storage.read("100.index") == struct.pack(">iiii", 0, 0, INT32_MAX, INT32_MAX)


def test_offset_index_full(storage: LocalStorage) -> None:
    idx = OffsetIndex(storage, "0.index", 0, max_index_bytes=8 * 3 + 5)
    assert idx.max_entries == 3
    for i in range(3):
        assert not idx.is_full()
        idx.append(i, i * 10)
    assert idx.is_full()
    with pytest.raises(IndexFullError):
        idx.append(3, 30)
    assert isinstance(IndexFullError("x"), InvalidOffsetError)


def test_time_append_rules_and_reserved_slot(storage: LocalStorage) -> None:
    idx = TimeIndex(storage, "10.timeindex", 10, max_index_bytes=12 * 3)
    assert idx.max_entries == 3
    assert idx.last_entry == (-1, 10)
    idx.maybe_append(-1, 10)  # NO_TIMESTAMP is never indexed
    assert len(idx) == 0
    idx.maybe_append(5, 10)
    idx.maybe_append(5, 11)  # same timestamp: ignored
    assert idx.entries()[1].tolist() == [10]
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(6, 9)  # offset goes backwards
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(4, 12)  # timestamp goes backwards
    idx.maybe_append(7, 12)
    # 2 of 3 slots used: the last one is reserved for the roll-time entry
    assert idx.is_full()
    with pytest.raises(IndexFullError):
        idx.maybe_append(8, 13)
    idx.maybe_append(8, 13, skip_full_check=True)
    assert len(idx) == 3
    assert idx.last_entry == (8, 13)
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(9, 10 + INT32_MAX + 1, skip_full_check=True)
    idx.close()
    assert storage.read("10.timeindex") == struct.pack(">qiqiqi", 5, 0, 7, 2, 8, 3)


def test_lookup_many_on_empty_and_with_ndarray_shapes(storage: LocalStorage) -> None:
    idx = OffsetIndex(storage, "5.index", 5)
    offs, pos = idx.lookup_many(np.array([0, 5, 100]))
    assert offs.tolist() == [5, 5, 5] and pos.tolist() == [0, 0, 0]
    t = TimeIndex(storage, "5.timeindex", 5)
    ts, o = t.lookup_many(np.array([0, 5]))
    assert ts.tolist() == [-1, -1] and o.tolist() == [5, 5]
    assert t.lookup(123) == (-1, 5)


def test_growth_is_amortized(storage: LocalStorage) -> None:
    idx = OffsetIndex(storage, "0.index", 0)
    capacities = set()
    for i in range(5000):
        idx.append(i, i * 7)
        capacities.add(idx._cols[0].shape[0])
    assert len(capacities) <= 12  # doubling, not one reallocation per append
    assert idx.lookup(4321) == (4321, 4321 * 7)
    idx.flush()
    assert storage.size("0.index") == 5000 * 8


# --------------------------------------------------------------------------- files


def test_lazy_load_and_partial_trailing_entry(storage: LocalStorage) -> None:
    raw = struct.pack(">iiii", 0, 0, 5, 100) + b"\x00\x00\x00"
    storage.write_atomic("7.index", raw)
    idx = OffsetIndex(storage, "7.index", 7)
    assert not idx._loaded
    assert len(idx) == 2
    offs, pos = idx.entries()
    assert offs.tolist() == [7, 12] and pos.tolist() == [0, 100]
    with pytest.raises(CorruptIndexError, match="19 bytes") as e:
        idx.sanity_check()
    assert e.value.path == "7.index"
    # the first append drops the partial entry so the file stays aligned
    idx.append(20, 200)
    idx.close()
    assert storage.size("7.index") == 24
    again = OffsetIndex(storage, "7.index", 7)
    again.sanity_check()
    assert again.entries()[0].tolist() == [7, 12, 20]


def test_offset_sanity_check_last_offset_below_base(storage: LocalStorage) -> None:
    storage.write_atomic("50.index", struct.pack(">iiii", 0, 0, -3, 10))
    idx = OffsetIndex(storage, "50.index", 50)
    with pytest.raises(CorruptIndexError, match="last offset is 47 which is less than the base offset 50"):
        idx.sanity_check()
    OffsetIndex(storage, "missing.index", 0).sanity_check()  # empty: fine


def test_time_sanity_checks(storage: LocalStorage) -> None:
    storage.write_atomic("a.timeindex", struct.pack(">qiqi", 100, 1, 50, 2))
    msg = "last timestamp is 50 which is less than the first timestamp 100"
    with pytest.raises(CorruptIndexError, match=msg):
        TimeIndex(storage, "a.timeindex", 0).sanity_check()
    storage.write_atomic("b.timeindex", struct.pack(">qiqi", 100, 1, 200, -1))
    with pytest.raises(CorruptIndexError, match="last offset is 9 which is less than the first offset 10"):
        TimeIndex(storage, "b.timeindex", 10).sanity_check()
    storage.write_atomic("c.timeindex", struct.pack(">qi", 100, 1) + b"\x01")
    with pytest.raises(CorruptIndexError, match="found 13 bytes") as e:
        TimeIndex(storage, "c.timeindex", 0).sanity_check()
    assert "c.timeindex" in str(e.value)
    storage.write_atomic("d.timeindex", struct.pack(">qiqi", 100, 1, 200, 2))
    TimeIndex(storage, "d.timeindex", 0).sanity_check()


def test_truncated_file_shorter_than_one_entry(storage: LocalStorage) -> None:
    storage.write_atomic("x.index", b"\x00\x01")
    storage.write_atomic("x.timeindex", b"\x00" * 11)
    storage.write_atomic("x.txnindex", b"\x00" * 33)
    for idx in (
        OffsetIndex(storage, "x.index", 0),
        TimeIndex(storage, "x.timeindex", 0),
        TxnIndex(storage, "x.txnindex", 0),
    ):
        assert len(idx) == 0
        assert all(a.shape == (0,) for a in idx.entries())
        with pytest.raises(CorruptIndexError):
            idx.sanity_check()


def test_reset_rename_delete(storage: LocalStorage) -> None:
    idx = OffsetIndex(storage, "0.index", 0)
    idx.reset()
    assert not storage.exists("0.index")  # reset does not create the file
    idx.create()
    assert storage.exists("0.index") and storage.size("0.index") == 0
    idx.append(1, 10)
    idx.append(2, 20)
    idx.flush()
    idx.rename("0.index.swap")
    assert not storage.exists("0.index") and storage.size("0.index.swap") == 16
    idx.append(3, 30)  # reopens under the new name
    idx.flush()
    assert storage.size("0.index.swap") == 24
    idx.reset()
    assert len(idx) == 0 and storage.size("0.index.swap") == 0
    idx.append(5, 0)
    idx.delete()
    assert not storage.exists("0.index.swap") and len(idx) == 0
    TxnIndex(storage, "never.txnindex", 0).rename("never.txnindex.deleted")  # missing file: fine
    assert not storage.exists("never.txnindex.deleted")


# --------------------------------------------------------------------------- txn index


def test_txn_index_roundtrip_and_rules(storage: LocalStorage) -> None:
    idx = TxnIndex(storage, "100.txnindex", 100)
    assert len(idx) == 0 and not storage.exists("100.txnindex")
    idx.append(7, 100, 105, 106)
    idx.append(8, 103, 110, 111)
    with pytest.raises(InvalidOffsetError):
        idx.append(9, 104, 110, 112)
    idx.append(9, 120, 130, 131)
    idx.flush()
    raw = storage.read("100.txnindex")
    assert len(raw) == 3 * 34
    assert raw[:34] == struct.pack(">hqqqq", 0, 7, 100, 105, 106)
    idx.close()
    again = TxnIndex(storage, "100.txnindex", 100)
    e = again.entries()
    assert e.producer_id.tolist() == [7, 8, 9]
    assert e.first_offset.tolist() == [100, 103, 120]
    assert e.last_offset.tolist() == [105, 110, 130]
    assert e.last_stable_offset.tolist() == [106, 111, 131]
    assert e.version.tolist() == [0, 0, 0]
    again.sanity_check()

    pids, firsts = again.aborted_in_range(106, 121)
    assert list(zip(pids.tolist(), firsts.tolist(), strict=True)) == [(8, 103), (9, 120)]
    pids, _ = again.aborted_in_range(0, 100)
    assert pids.tolist() == []
    pids, _ = again.aborted_in_range(105, 106)
    assert pids.tolist() == [7, 8]  # txn 8 spans 103..110
    pids, _ = again.aborted_in_range(100, 103)
    assert pids.tolist() == [7]

    again.truncate_to(110)
    assert again.entries().last_offset.tolist() == [105]
    again.flush()
    assert storage.size("100.txnindex") == 34
    again.append(10, 106, 107, 108)  # appends continue after the kept entry
    assert again.entries().producer_id.tolist() == [7, 10]


def test_txn_index_partial_entry_and_sanity(storage: LocalStorage) -> None:
    raw = struct.pack(">hqqqq", 0, 1, 5, 9, 10) + struct.pack(">hqqqq", 0, 2, 3, 4, 5) + b"\x00" * 20
    storage.write_atomic("8.txnindex", raw)
    idx = TxnIndex(storage, "8.txnindex", 8)
    assert len(idx) == 2  # the 20-byte tail is ignored
    with pytest.raises(CorruptIndexError, match=r"lastOffset=4.*less than start offset 8"):
        idx.sanity_check()
    storage.write_atomic("9.txnindex", raw[:34] + b"\x00" * 20)
    ok_but_partial = TxnIndex(storage, "9.txnindex", 8)
    assert len(ok_but_partial) == 1
    with pytest.raises(CorruptIndexError, match="partial entry of 20 bytes"):
        ok_but_partial.sanity_check()


@SETTINGS
@given(
    rows=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 1000), st.integers(1, 1000)), max_size=25),
    start=st.integers(0, 30000),
    width=st.integers(0, 3000),
)
def test_txn_aborted_in_range_matches_brute_force(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int, int]], start: int, width: int
) -> None:
    s = fresh(tmp_path_factory)
    idx = TxnIndex(s, "0.txnindex", 0)
    last = 0
    expected_rows = []
    for pid, back, step in rows:
        last += step
        first = max(0, last - back)
        idx.append(pid, first, last, last + 1)
        expected_rows.append((pid, first, last))
    end = start + width
    want = [(p, f) for p, f, lo in expected_rows if lo >= start and f < end]
    pids, firsts = idx.aborted_in_range(start, end)
    assert list(zip(pids.tolist(), firsts.tolist(), strict=True)) == want
