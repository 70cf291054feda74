"""Merging small adjacent segments (object stores).

On an object store every commit writes whole segments, so frequent small commits (a
streaming sink's micro-batches) leave many small segments.  :func:`merge_small_segments`
rewrites each run of at least ``min_segments`` adjacent small sealed segments whose total fits
in ``segment.bytes`` into one segment, with the batches copied byte for byte (offsets,
timestamps, CRCs and producer state unchanged) and fresh offset/time indexes, then swaps it
in with Kafka's ``.cleaned`` -> ``.swap`` protocol (:meth:`Log.replace_segments`).  It applies
to every cleanup policy: no record is dropped, only the segment layout changes.

The number of segments of a partition stays bounded by its size, not by the number of commits:
segments of at least ``segment.bytes / min_segments`` bytes (or :data:`SMALL_MAX`), plus fewer
than ``min_segments`` small ones being accumulated, plus the active segment.
"""

from __future__ import annotations

from pylog.storage.config import INT32_MAX
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment, relative_headers

MIN_SEGMENTS = 8
"""A run of fewer small segments is left as it is (merging too eagerly rewrites bytes often)."""
SMALL_MAX = 8 << 20
"""A segment of at least this many bytes is never small, whatever ``segment.bytes``: an object
of that size reads efficiently (a Spark task's staged segment adopted by the sink's commit, of
4 MiB or more, is usually left as it is)."""
COMMIT_SMALL_MAX = 1 << 20
"""The same bound for the maintenance a writer runs right after its commit, in the committing
process (the Spark sink's driver after each micro-batch): merging a micro-batch's segment of a
megabyte or more there would move its bytes through that process a second time, so those wait
for a maintenance run of their own (``pylog compact``, the maintenance job on the executors)."""


def _runs(lg: Log, min_segments: int, small_max: int) -> list[list[LogSegment]]:
    """Runs of adjacent sealed *small* segments to merge.  A segment is small below
    ``segment.bytes / min_segments`` (and :data:`SMALL_MAX`), so a merged segment (at least
    ``min_segments`` small ones) is rarely small again: each byte is rewritten about once, not
    once per merge (size tiers, as in an LSM tree).  A segment's offsets end before the next
    segment's base offset, so no segment needs to be read to plan."""
    limit = lg.config.segment_bytes
    small = max(1, min(limit // min_segments, small_max))
    runs: list[list[LogSegment]] = []
    run: list[LogSegment] = []
    total = 0
    segs = lg.segments
    for i, seg in enumerate(segs[:-1]):  # never the active segment
        end = segs[i + 1].base_offset  # exclusive bound of this segment's offsets
        fits = (
            seg.size < small
            and bool(run)
            and total + seg.size <= limit
            and end - 1 - run[0].base_offset <= INT32_MAX
        )
        if not fits:
            if len(run) >= min_segments:
                runs.append(run)
            run, total = [], 0
        if seg.size < small:
            run.append(seg)
            total += seg.size
    if len(run) >= min_segments:
        runs.append(run)
    return runs


def merge_small_segments(
    lg: Log, *, now: int, min_segments: int = MIN_SEGMENTS, small_max: int | None = None
) -> int:
    """Merge runs of small sealed segments of ``lg`` (small: under ``segment.bytes`` /
    ``min_segments`` and under ``small_max``); returns how many segments went away."""
    if min_segments < 2:
        raise ValueError(f"min_segments must be at least 2, got {min_segments}")
    removed = 0
    for run in _runs(lg, min_segments, SMALL_MAX if small_max is None else small_max):
        first = run[0]
        LogSegment(lg.storage, lg.directory, first.base_offset, lg.config, suffix=".cleaned").delete()
        merged = LogSegment(
            lg.storage, lg.directory, first.base_offset, lg.config, suffix=".cleaned", created_ms=now
        )
        merged.open_for_append()
        for seg in run:
            for loc in seg.iter_batches(0):
                merged.append(loc.data, relative_headers(loc.headers, loc.start))
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
