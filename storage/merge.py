"""Merging small adjacent segments (object stores).

On an object store every commit writes whole segments, so frequent small commits (a
streaming sink's micro-batches) leave many small segments.  :func:`merge_small_segments`
rewrites each run of at least ``min_segments`` adjacent sealed segments whose total fits in
``segment.bytes`` into one segment, with the batches copied byte for byte (offsets,
timestamps, CRCs and producer state unchanged) and fresh offset/time indexes, then swaps it
in with Kafka's ``.cleaned`` -> ``.swap`` protocol (:meth:`Log.replace_segments`).  It applies
to every cleanup policy: no record is dropped, only the segment layout changes.

The number of segments of a partition stays bounded: full segments, plus fewer than
``min_segments`` small ones being accumulated, plus the active segment.
"""

from __future__ import annotations

from pylog.storage.config import INT32_MAX
from pylog.storage.log import Log
from pylog.storage.segment import LogSegment

MIN_SEGMENTS = 8
"""A run of fewer small segments is left as it is (merging too eagerly rewrites bytes often)."""


def _runs(lg: Log, min_segments: int) -> list[list[LogSegment]]:
    limit = lg.config.segment_bytes
    runs: list[list[LogSegment]] = []
    run: list[LogSegment] = []
    total = 0
    for seg in lg.segments[:-1]:  # never the active segment
        nxt = seg.read_next_offset()
        fits = bool(run) and total + seg.size <= limit and nxt - 1 - run[0].base_offset <= INT32_MAX
        if not fits:
            if len(run) >= min_segments:
                runs.append(run)
            run, total = [], 0
        if seg.size < limit:
            run.append(seg)
            total += seg.size
    if len(run) >= min_segments:
        runs.append(run)
    return runs


def merge_small_segments(lg: Log, *, now: int, min_segments: int = MIN_SEGMENTS) -> int:
    """Merge runs of small sealed segments of ``lg``; returns how many segments went away."""
    if min_segments < 2:
        raise ValueError(f"min_segments must be at least 2, got {min_segments}")
    removed = 0
    for run in _runs(lg, min_segments):
        first = run[0]
        LogSegment(lg.storage, lg.directory, first.base_offset, lg.config, suffix=".cleaned").delete()
        merged = LogSegment(
            lg.storage, lg.directory, first.base_offset, lg.config, suffix=".cleaned", created_ms=now
        )
        merged.open_for_append()
        for seg in run:
            for loc in seg.iter_batches(0):
                h = loc.headers.take(slice(None))
                h.position = h.position - loc.start
                merged.append(loc.data, h)
            txn = seg.txn_index.entries()
            for i in range(len(txn.producer_id)):
                merged.txn_index.append(
                    int(txn.producer_id[i]),
                    int(txn.first_offset[i]),
                    int(txn.last_offset[i]),
                    int(txn.last_stable_offset[i]),
                )
        merged.on_become_inactive()
        lg.replace_segments([merged], run, now=now)
        removed += len(run) - 1
    return removed


__all__ = ["MIN_SEGMENTS", "merge_small_segments"]
