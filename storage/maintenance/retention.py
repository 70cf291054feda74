"""Retention (``cleanup.policy`` includes ``delete``): Kafka's ``UnifiedLog.deleteOldSegments``.

Three rules run in Kafka's order, each deleting a prefix of the log's segments (walking from
the oldest and stopping at the first segment that must stay):

1. log start offset: a segment whose *next* segment starts at or below the log start offset
   holds nothing readable (this rule also applies to ``compact``-only logs);
2. ``retention.bytes`` (>= 0): while the log is larger than the limit, the oldest segments
   whose removal keeps it at or above the limit;
3. ``retention.ms`` (>= 0): segments whose largest record timestamp is more than
   ``retention.ms`` before ``now``.  A segment holding a future timestamp stays, and so does
   every later one.  A segment without records (emptied by the cleaner, or holding only its
   empty batches, whose timestamps stay out of the time index) counts as expired; a segment
   whose records have no timestamps (legacy magic 0) never expires by time (Kafka falls back
   on the file's mtime, which pylog's storage layer does not expose).

No segment whose records reach the *high watermark* is deleted: by default the base of the
active segment, or the recovery point when that is higher (rolled segments were flushed at
the roll, so only the active segment's tail may be unflushed, and it is never removed), and
never beyond the log's acknowledged end (``Log.high_watermark``, set by the log manager);
callers may pass a lower bound, e.g. the oldest offset a consumer still needs.  When every
segment may go, the active one is rolled first and an empty active segment remains at the
log end.

Deletion is Kafka's: the log start offset moves to the first surviving segment and is written
to ``log-start-offset-checkpoint`` *before* the files are renamed ``.deleted`` (so a crash in
between never resurrects a deleted segment: on reopen the checkpoint hides what is left and
the next pass deletes it); the files are removed after ``file.delete.delay.ms`` so readers
holding them can finish (``Log.delete_pending``), or at the next load.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment

_PARTITION_DIR = re.compile(r"^(?:.*/)?([a-zA-Z0-9._-]+)-(\d+)$")

Predicate = Callable[[LogSegment, "LogSegment | None"], bool]


@dataclass
class RetentionResult:
    """What one retention run on one log did."""

    directory: str
    log_start_offset: int  # after the run
    segments_deleted: int = 0
    bytes_deleted: int = 0
    deleted_base_offsets: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # one per rule that deleted something


def partition_key(log: Log) -> tuple[str, int] | None:
    """(topic, partition) from the log's ``<topic>-<partition>`` directory, if it is one."""
    m = _PARTITION_DIR.match(log.directory.rstrip("/"))
    return (m.group(1), int(m.group(2))) if m else None


def write_log_start_checkpoint(log: Log, offset: int) -> None:
    """Record ``offset`` as the log's start in the ``log-start-offset-checkpoint`` at the root
    of its storage (read-modify-write; a log outside a ``<topic>-<partition>`` directory has no
    entry)."""
    key = partition_key(log)
    if key is None:
        return
    entries = ckpt.read_offsets(log.storage, ckpt.LOG_START_OFFSET)
    if entries.get(key) == offset:
        return
    entries[key] = offset
    ckpt.write_offsets(log.storage, ckpt.LOG_START_OFFSET, entries)


def deletable_segments(log: Log, predicate: Predicate, high_watermark: int) -> list[LogSegment]:
    """The oldest segments, in order, for which ``predicate(segment, next_segment)`` holds,
    stopping at the first that fails, at an empty last segment, or at a segment whose records
    reach ``high_watermark`` (Kafka's ``deletableSegments``)."""
    segs = log.segments
    out: list[LogSegment] = []
    leo = log.log_end_offset
    for i, seg in enumerate(segs):
        nxt = segs[i + 1] if i + 1 < len(segs) else None
        upper = nxt.base_offset if nxt is not None else leo
        if nxt is None and seg.size == 0:
            break
        if not (high_watermark >= upper and predicate(seg, nxt)):
            break
        out.append(seg)
    return out


def retain(
    log: Log,
    *,
    now: int,
    high_watermark: int | None = None,
    checkpoint: bool = True,
) -> RetentionResult:
    """Apply the log's retention rules at ``now``; returns what was deleted.

    ``high_watermark`` (default: flushed data, see above) bounds what may go; ``checkpoint``
    writes the new log start offset to ``log-start-offset-checkpoint`` before deleting."""
    cfg = log.config
    default = max(log.recovery_point, log.active.base_offset)  # only the active segment may be unflushed
    if log.high_watermark is not None:  # the end of acknowledged data (the log manager's)
        default = min(default, log.high_watermark)
    hw = default if high_watermark is None else min(high_watermark, default)
    result = RetentionResult(log.directory, log.log_start_offset)

    def start_breached(seg: LogSegment, nxt: LogSegment | None) -> bool:
        return nxt is not None and nxt.base_offset <= log.log_start_offset

    rules: list[tuple[str, Predicate]] = [("log start offset", start_breached)]
    if cfg.delete:
        rules.append(("retention.bytes", _size_rule(log)))
        if cfg.retention_ms >= 0:

            def time_breached(seg: LogSegment, nxt: LogSegment | None) -> bool:
                ts = seg.largest_timestamp
                if ts < 0:  # no timestamp: expired only if it holds no record (emptied by the cleaner)
                    return _holds_no_record(seg)
                return now - ts > cfg.retention_ms

            rules.append(("retention.ms", time_breached))
    for reason, predicate in rules:
        segs = deletable_segments(log, predicate, hw)
        if not segs:
            continue
        _delete(log, segs, now=now, checkpoint=checkpoint, result=result)
        result.reasons.append(reason)
    result.log_start_offset = log.log_start_offset
    return result


def _holds_no_record(seg: LogSegment) -> bool:
    return seg.size == 0 or all(int(loc.headers.records_count.sum()) == 0 for loc in seg.iter_batches(0))


def _size_rule(log: Log) -> Predicate:
    limit = log.config.retention_bytes
    diff: list[int] = []  # size - limit, measured when the rule runs: after the log-start rule's deletions

    def size_breached(seg: LogSegment, nxt: LogSegment | None) -> bool:
        if limit < 0:
            return False
        if not diff:
            diff.append(log.size - limit)
        if diff[0] - seg.size >= 0:
            diff[0] -= seg.size
            return True
        return False

    return size_breached


def _delete(log: Log, segs: list[LogSegment], *, now: int, checkpoint: bool, result: RetentionResult) -> None:
    n = len(segs)
    if n == len(log.segments) and log.active.size > 0:
        log.roll(now=now)  # everything goes: keep an empty active segment at the log end
    new_start = max(log.log_start_offset, log.segments[n].base_offset) if n < len(log.segments) else None
    if checkpoint and new_start is not None:
        write_log_start_checkpoint(log, new_start)
        log.faults.step("log-start-checkpointed")
    bases = [s.base_offset for s in segs]
    result.bytes_deleted += log.delete_segments(segs, now=now)
    result.segments_deleted += len(bases)
    result.deleted_base_offsets.extend(bases)
