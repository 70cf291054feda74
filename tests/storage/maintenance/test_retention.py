"""Retention (Kafka's UnifiedLog.deleteOldSegments tests; TESTING.md checklist C22-C26)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.maintenance.retention import deletable_segments, partition_key, retain
from pylog.storage.partition import checkpoint as ckpt
from tests.storage.compaction_util import (
    DIR,
    T0,
    Crash,
    cleaner,
    crash_at,
    latest_per_key,
    open_log,
    put,
    put_many,
    reopen,
    rows,
)

HOUR = 3_600_000


def timed_log(root: Path, stamps: list[int], per_segment: int = 5, **cfg: object):  # type: ignore[no-untyped-def]
    """One segment per entry of ``stamps``, each holding ``per_segment`` records at that time;
    rolled so every segment is inactive, and flushed (nothing is above the recovery point)."""
    base: dict[str, object] = {"cleanup_policy": "delete", "segment_bytes": 1 << 20, "retention_ms": HOUR}
    lg = open_log(root, **{**base, **cfg})
    for i, ts in enumerate(stamps):
        for j in range(per_segment):
            put(lg, b"k%04d" % (i * per_segment + j), b"v", ts=ts)
        lg.roll()
    lg.flush()
    return lg


def log_start_checkpoint(root: Path) -> dict[tuple[str, int], int]:
    return ckpt.read_offsets(LocalStorage(root), ckpt.LOG_START_OFFSET)


def test_c22_time_retention_by_max_timestamp_and_contiguous_prefix(tmp_path: Path) -> None:
    now = T0 + 10 * HOUR
    # segment 2 holds a record from the future: it stays, and so does everything after it
    lg = timed_log(tmp_path, [T0, T0 + HOUR, now + HOUR, T0, T0])
    assert [s.largest_timestamp for s in lg.segments[:3]] == [T0, T0 + HOUR, now + HOUR]
    r = retain(lg, now=now)
    assert r.deleted_base_offsets == [0, 5] and r.reasons == ["retention.ms"]
    assert lg.log_start_offset == 10 == lg.segments[0].base_offset
    assert [o for o, _, _ in rows(lg)] == list(range(10, 25))
    assert log_start_checkpoint(tmp_path) == {("t", 0): 10}
    # a segment whose max timestamp is exactly retention.ms old is kept (strictly greater)
    lg2 = timed_log(tmp_path / "b", [T0, T0 + 1])
    assert retain(lg2, now=T0 + HOUR).segments_deleted == 0
    assert retain(lg2, now=T0 + HOUR + 1).deleted_base_offsets == [0]


def test_c23_size_retention_and_idempotency(tmp_path: Path) -> None:
    lg = timed_log(tmp_path, [T0] * 6, retention_ms=-1)
    seg = lg.segments[0].size
    lg.config = lg.config.with_overrides({"retention.bytes": 3 * seg + 10})
    r = retain(lg, now=T0)
    # Kafka's rule: delete the oldest while the excess (size - limit) still covers them
    assert r.deleted_base_offsets == [0, 5] and r.reasons == ["retention.bytes"]
    assert lg.size == 4 * seg and lg.size - lg.segments[0].size < 3 * seg + 10
    assert retain(lg, now=T0).segments_deleted == 0  # running it again deletes nothing
    lg.config = lg.config.with_overrides({"retention.bytes": lg.size + 1})
    assert retain(lg, now=T0).segments_deleted == 0


def test_c24_never_beyond_the_high_watermark_nor_unflushed_data(tmp_path: Path) -> None:
    now = T0 + 10 * HOUR
    lg = timed_log(tmp_path, [T0] * 4)
    r = retain(lg, now=now, high_watermark=12)  # offsets >= 12 are still needed
    assert r.deleted_base_offsets == [0, 5]  # segment [10, 15) reaches the watermark: kept
    # the active segment's unflushed records are never deleted, whatever their age
    lg2 = open_log(tmp_path / "b", cleanup_policy="delete", retention_ms=HOUR)
    put_many(lg2, [(b"a", b"1"), (b"b", b"2")], ts=T0)
    assert lg2.recovery_point < lg2.log_end_offset
    assert retain(lg2, now=now).segments_deleted == 0
    assert [o for o, _, _ in rows(lg2)] == [0, 1]
    lg2.flush()  # flushed: the whole log may go; an empty active segment remains at the end
    r2 = retain(lg2, now=now)
    assert r2.deleted_base_offsets == [0]
    assert lg2.log_start_offset == 2 == lg2.log_end_offset == lg2.active.base_offset and rows(lg2) == []
    assert put(lg2, b"c", b"3", ts=now) == 2


def test_log_start_offset_breach_applies_to_compacted_logs(tmp_path: Path) -> None:
    lg = timed_log(tmp_path, [T0] * 3, cleanup_policy="compact")
    assert retain(lg, now=T0 + 100 * HOUR).segments_deleted == 0  # no time/size rules for compact
    lg.log_start_offset = 7  # e.g. a reopened checkpoint, or DeleteRecords
    r = retain(lg, now=T0)
    assert r.deleted_base_offsets == [0] and r.reasons == ["log start offset"]
    assert lg.log_start_offset == 7


def test_deletable_segments_stops_at_empty_last_segment(tmp_path: Path) -> None:
    lg = timed_log(tmp_path, [T0, T0])
    assert lg.active.size == 0
    assert [s.base_offset for s in deletable_segments(lg, lambda s, n: True, lg.log_end_offset)] == [0, 5]
    assert partition_key(lg) == ("t", 0)


@pytest.mark.parametrize("step", ["log-start-advanced", "renamed-deleted"])
def test_c25_crash_mid_retention(tmp_path: Path, step: str) -> None:
    lg = timed_log(tmp_path, [T0, T0, T0, T0 + 100 * HOUR])
    crash_at(lg, step, occurrence=1)
    with pytest.raises(Crash):
        retain(lg, now=T0 + 10 * HOUR)
    # reopen as the log manager does: the log start offset from its checkpoint
    start = log_start_checkpoint(tmp_path)[("t", 0)]
    assert start == 15  # written before any file was renamed
    again = reopen(tmp_path, log_start_offset=start, cleanup_policy="delete", retention_ms=HOUR)
    assert again.log_start_offset == 15
    assert [o for o, _, _ in rows(again)] == list(range(15, 20))  # nothing resurrected
    assert not [n for n in os.listdir(tmp_path / DIR) if n.endswith(".deleted")]
    r = retain(again, now=T0 + 10 * HOUR)  # the next pass removes what the crash left behind
    assert again.segments[0].base_offset == 15 and r.log_start_offset == 15
    assert [o for o, _, _ in rows(again)] == list(range(15, 20))


def test_c26_retention_racing_with_a_compaction_swap(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="compact,delete", retention_ms=HOUR, segment_bytes=4096)
    for i in range(60):
        put(lg, b"k%d" % (i % 7), b"v%03d" % i, ts=T0 if i < 30 else T0 + 100 * HOUR)
        if i % 10 == 9:
            lg.roll()
    lg.flush()
    before = rows(lg)
    renames: list[str] = []
    storage = lg.storage
    real_rename = storage.rename

    def counting_rename(src: str, dst: str) -> None:
        renames.append(src)
        real_rename(src, dst)

    storage.rename = counting_rename  # type: ignore[method-assign]
    results = []

    def hook(name: str) -> None:
        if name == "all-swap" and not results:  # retention runs while the swap is half done
            results.append(retain(lg, now=T0 + 10 * HOUR))

    lg.faults.hook = hook
    res = cleaner().clean(lg, now=T0)
    assert results and results[0].deleted_base_offsets == [0, 10, 20]
    assert len(renames) == len(set(renames))  # no file renamed (deleted) twice
    start = lg.log_start_offset
    assert start == 30
    expected = [r for r in latest_per_key(before, res.first_uncleanable_offset) if r[0] >= start]
    assert rows(lg, start) == expected  # no key lost above the new log start
    lg.close()
    again = reopen(tmp_path, log_start_offset=start, cleanup_policy="compact,delete", segment_bytes=4096)
    assert rows(again, start) == expected
