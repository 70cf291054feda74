"""Which parts of a compacted log a cleaning pass may rewrite (Kafka's ``LogCleanerManager``
and ``Cleaner.groupSegmentsBySize``); see :mod:`cleaner` for the pass itself.

- ``first dirty offset``: the ``cleaner-offset-checkpoint`` entry, reset to the log start
  offset when it lies outside ``[log start, LEO]``;
- ``first uncleanable offset``: ``min(last stable offset, active segment base, base of the first
  dirty segment younger than min.compaction.lag.ms)``, rounded down to its segment's base;
- ``dirty ratio`` = dirty bytes / (clean + dirty bytes), and how far past
  ``max.compaction.lag.ms`` the oldest dirty segment is;
- groups of consecutive segments rewritten into one: within ``segment.bytes``,
  ``segment.index.bytes`` and the 2^31-1 offsets a segment's relative offsets can hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pylog.storage.config import INT32_MAX, INT64_MAX
from pylog.storage.partition import producer_state
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment


@dataclass(frozen=True)
class LogToClean:
    """A compacted log's clean/dirty split at ``now`` (Kafka's ``LogToClean``)."""

    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int  # rounded down to a segment base
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int
    checkpoint_reset: bool  # the checkpoint was outside [log start, LEO]

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def need_compaction_now(self) -> bool:
        """A dirty segment is older than ``max.compaction.lag.ms``."""
        return self.max_compaction_delay_ms > 0

    def should_clean(self, min_ratio: float | None = None) -> bool:
        """Kafka's selection rule (``grabFilthiestCompactedLog``)."""
        ratio = self.log.config.min_cleanable_dirty_ratio if min_ratio is None else min_ratio
        if self.total_bytes <= 0:
            return False
        return (self.need_compaction_now and self.cleanable_bytes > 0) or self.cleanable_ratio > ratio


def first_dirty_offset(log: Log, checkpoint: int | None) -> tuple[int, bool]:
    """The checkpointed first dirty offset, or the log start offset when it is missing or
    out of range: (offset, whether it was reset)."""
    start, leo = log.log_start_offset, log.log_end_offset
    if checkpoint is None:
        return start, False
    if checkpoint < start or checkpoint > leo:
        return start, True
    return checkpoint, False


def first_uncleanable_offset(log: Log, first_dirty: int, now: int, *, with_lso: bool = True) -> int:
    """``min(LSO, active segment base, first dirty segment younger than min.compaction.lag.ms)``,
    at least ``first_dirty`` (not rounded to a segment)."""
    candidates = [log.active.base_offset]
    if with_lso:
        candidates.append(producer_state.last_stable_offset(log))
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for seg in _non_active_from(log, first_dirty):
            if seg.largest_timestamp > now - lag:
                candidates.append(seg.base_offset)
                break
    return max(first_dirty, min(candidates))


def _non_active_from(log: Log, offset: int) -> list[LogSegment]:
    """Non-active segments from the one holding ``offset`` (Kafka's ``nonActiveLogSegmentsFrom``)."""
    segs = log.segments[:-1]
    start = max(0, int(np.searchsorted([s.base_offset for s in segs], offset, side="right")) - 1)
    return segs[start:]


def _floor_base(log: Log, offset: int) -> int:
    """Base offset of the segment holding ``offset``, the active segment's if ``offset`` is at
    or beyond it (Kafka's ``nonActiveLogSegmentsFrom(offset).headOption``)."""
    if offset >= log.active.base_offset:
        return log.active.base_offset
    bases = np.array([s.base_offset for s in log.segments], dtype=np.int64)
    return int(bases[max(0, int(np.searchsorted(bases, offset, side="right")) - 1)])


def max_compaction_delay(log: Log, first_dirty: int, now: int) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest dirty segment is (0 if none is):
    its first batch's max timestamp against ``now`` (Kafka's ``maxCompactionDelay``)."""
    lag = max(log.config.max_compaction_lag_ms, 0)
    if lag >= INT64_MAX:
        return 0
    firsts = [t for t in (_first_batch_timestamp(s) for s in _non_active_from(log, first_dirty)) if t > 0]
    if not firsts:
        return 0
    until = now - lag
    return until - min(firsts) if min(firsts) < until else 0


def _first_batch_timestamp(seg: LogSegment) -> int:
    if seg.rolling_based_timestamp is None:
        first = next(seg.iter_batches(0, chunk=1 << 16), None)
        seg.rolling_based_timestamp = int(first.headers.max_timestamp[0]) if first is not None else -1
    return seg.rolling_based_timestamp


def log_to_clean(log: Log, checkpoint: int | None, now: int, *, with_lso: bool = True) -> LogToClean:
    """The clean/dirty split of ``log`` (``with_lso=False`` skips the last stable offset, which
    may need a scan of the log: a cheap upper bound of the dirty bytes for pre-selection)."""
    first_dirty, reset = first_dirty_offset(log, checkpoint)
    uncleanable = first_uncleanable_offset(log, first_dirty, now, with_lso=with_lso)
    upper = _floor_base(log, uncleanable)
    sizes = np.array([s.size for s in log.segments], dtype=np.int64)
    bases = np.array([s.base_offset for s in log.segments], dtype=np.int64)
    nexts = np.append(bases[1:], INT64_MAX)
    clean = int(sizes[bases < first_dirty].sum())  # Kafka: logSegments(-1, firstDirty)
    lo = min(first_dirty, upper)
    dirty = int(sizes[(bases < upper) & (nexts > lo)].sum())  # logSegments(lo, firstUncleanable)
    delay = max_compaction_delay(log, first_dirty, now)
    return LogToClean(log, first_dirty, upper, clean, dirty, delay, reset)


# ============================================================================ grouping


def fits_group(
    base_offset: int,
    log_size: int,
    index_entries: int,
    time_entries: int,
    nxt: LogSegment,
    last_offset: int,
    max_size: int,
    max_index_size: int,
) -> bool:
    """Whether segment ``nxt`` (whose last offset is at most ``last_offset``) may join a group
    starting at ``base_offset`` that already takes ``log_size`` bytes and ``index_entries`` /
    ``time_entries`` index entries: Kafka's test in ``groupSegmentsBySize``."""
    return (
        log_size + nxt.size <= max_size
        and 8 * (index_entries + len(nxt.offset_index)) <= max_index_size
        and 12 * (time_entries + len(nxt.time_index)) <= max_index_size
        and (nxt.size == 0 or last_offset - base_offset <= INT32_MAX)
    )


def last_offset_bound(segments: list[LogSegment], i: int, first_uncleanable_offset: int) -> int:
    """An upper bound of segment ``i``'s last offset: the next segment's base, or the first
    uncleanable offset for the last one, minus one."""
    return segments[i + 1].base_offset - 1 if i + 1 < len(segments) else first_uncleanable_offset - 1


def group_segments_by_size(
    segments: list[LogSegment], max_size: int, max_index_size: int, first_uncleanable_offset: int
) -> list[list[LogSegment]]:
    """Kafka's ``groupSegmentsBySize``: consecutive segments whose total log size stays within
    ``segment.bytes``, whose index sizes stay within ``segment.index.bytes``, and whose offsets
    fit the 32-bit relative offsets of the group's first segment (estimated from the next
    segment's base, or the first uncleanable offset for the last one).  The cleaner itself groups
    by what it keeps (see :mod:`cleaner`); this is the plan before anything is read."""
    groups: list[list[LogSegment]] = []
    i = 0
    n = len(segments)
    while i < n:
        group = [segments[i]]
        log_size = segments[i].size
        index_size = len(segments[i].offset_index)
        time_size = len(segments[i].time_index)
        i += 1
        while i < n:
            nxt = segments[i]
            last = last_offset_bound(segments, i, first_uncleanable_offset)
            if not fits_group(
                group[0].base_offset, log_size, index_size, time_size, nxt, last, max_size, max_index_size
            ):
                break
            group.append(nxt)
            log_size += nxt.size
            index_size += len(nxt.offset_index)
            time_size += len(nxt.time_index)
            i += 1
        groups.append(group)
    return groups


__all__ = [
    "LogToClean",
    "first_dirty_offset",
    "first_uncleanable_offset",
    "fits_group",
    "group_segments_by_size",
    "last_offset_bound",
    "log_to_clean",
    "max_compaction_delay",
]
