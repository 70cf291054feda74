"""A cleaning pass that holds a local root's writer lock only to swap its result in.

Kafka's cleaner threads read and rewrite a log beside the appends and take the log's lock only
for the swap (``replaceSegments``).  A local root has one writer lock per root, held by a
streaming sink for each of its commits; a compaction job must not hold it for a whole pass, or
the sink would wait for the pass and the job's tasks for each other.  So a pass here runs in
three steps:

1. **Read and write, without the lock.**  The partition is opened read-only (as a reader beside
   a writer).  The identity of every sealed segment (:meth:`Storage.identity`: inode, size and
   modification time on a local disk) is taken *before* anything is read; the offset map is
   built and each group of segments is rewritten into a new segment staged in the partition's
   directory under ``.cleaning-<token>`` (a suffix recovery leaves alone, so that a writer that
   opens the partition meanwhile does not remove it; see below for its sweep).
2. **Swap, under the lock.**  The writer lock is taken (waiting up to ``lock_timeout``) and the
   partition opened as the writer.  Every group is checked: its segments must still be the
   log's segments of that range with the identities taken in step 1.  Only appends may happen
   meanwhile, and they never touch a sealed segment below the first uncleanable offset (the
   active segment may roll: that seals a segment above the range).  If every group checks out,
   the staged segments are renamed ``.cleaned`` and swapped in together with the usual
   protocol (``.cleaned`` → ``.swap`` → final, the old segments → ``.deleted``; recovery
   completes or undoes a crash in the middle; the groups are consecutive, so they replace one
   contiguous range), then the cleaner checkpoint is raised to the pass's end.  The files were
   fsynced in step 1, so the lock is held for renames and a few directory fsyncs.
3. **A conflict** (another cleaner, retention or a repair changed a segment of the range while
   the pass read) discards the staged segments and runs the pass again on the new state, up
   to ``attempts`` times; the log is never changed by a pass that read a state that is gone.

Offsets and values never change, appends made during the pass are untouched, and readers of
the old segments finish (the old files are deleted only after ``file.delete.delay.ms``).

Staged files of a pass that died (a killed task) are removed by a later pass of the same
partition once they are older than :data:`STALE_STAGE_S` (wall clock: how long a pass may
leave a finished group's file untouched while it writes the next ones), never by recovery.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from pylog.storage.backends.base import join
from pylog.storage.config import CleanerConfig
from pylog.storage.errors import CommitConflictError, CorruptRecordError, PylogError, StorageError
from pylog.storage.maintenance.cleaner import Cleaner, CleanResult, log_to_clean
from pylog.storage.maintenance.runner import MaintenanceReport, ProgressFn, pass_progress
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment, segment_name
from pylog.storage.root.manager import Root

STAGE_MARK = ".cleaning-"
"""Staged segment files are named ``<base>.<kind>.cleaning-<token>``."""
STALE_STAGE_S = 6 * 3600.0
"""Age (wall clock, by modification time) after which a staged file is a dead pass's."""

RootOpener = Callable[[bool], Root]
"""``opener(read_only)``: a new :class:`Root` of the same path (the caller closes it)."""


@dataclass
class DetachedReport:
    """What :func:`clean_detached` did for one partition."""

    passes: list[CleanResult] = field(default_factory=list)
    conflicts: int = 0  # passes discarded because a segment they read changed meanwhile
    stale_files_removed: int = 0
    lock_held_s: float = 0.0  # time the writer lock was held, in all
    error: str = ""  # the partition is uncleanable (corrupt): why


def _conflict(topic: str, partition: int) -> CommitConflictError:
    return CommitConflictError(f"{topic}-{partition}: a segment this pass read changed before its swap")


def clean_detached(
    opener: RootOpener,
    topic: str,
    partition: int,
    *,
    now: int,
    force: bool = False,
    cleaner: Cleaner | None = None,
    cleaner_config: CleanerConfig | None = None,
    attempts: int = 3,
    progress: ProgressFn | None = None,
) -> DetachedReport:
    """Clean one partition of a local root with the writer lock held only for the swaps (see
    the module doc).  ``force`` cleans whatever the dirty ratio; partial passes (offset map
    full) follow each other until the partition is clean up to its uncleanable point."""
    cleaner = cleaner or Cleaner(cleaner_config)
    report = DetachedReport()
    failures = 0
    while True:
        try:
            res = _one_pass(opener, topic, partition, now, force, cleaner, report, progress)
        except CommitConflictError:
            report.conflicts += 1
            failures += 1
            if failures >= attempts:
                report.error = (
                    f"{topic}-{partition}: its segments changed during {attempts} passes in a row "
                    "(another cleaner or retention ran meanwhile); left for the next run"
                )
                return report
            continue
        except PylogError as e:
            if isinstance(e, StorageError) and not isinstance(e, CorruptRecordError):
                raise  # an I/O error is not a property of the log: stop and name the file
            report.error = str(e)
            return report
        if res is None:
            return report
        report.passes.append(res)
        if not res.map_full or res.end_offset <= res.first_dirty_offset:
            return report


def _one_pass(
    opener: RootOpener,
    topic: str,
    partition: int,
    now: int,
    force: bool,
    cleaner: Cleaner,
    report: DetachedReport,
    progress: ProgressFn | None = None,
) -> CleanResult | None:
    token = secrets.token_hex(6)
    with contextlib.closing(opener(True)) as reader:
        log = reader.log(topic, partition)
        if not log.config.compact:
            return None
        report.stale_files_removed += _sweep_stale(log)
        identities = {s.base_offset: log.storage.identity(s.log_path) for s in log.segments[:-1]}
        point = ckpt.read_offsets(log.storage, ckpt.CLEANER_OFFSET).get((topic, partition))
        ltc = log_to_clean(log, point, now)
        if not (ltc.cleanable_bytes > 0 if force else ltc.should_clean()):
            return None
        try:
            res = cleaner.clean(
                log,
                now=now,
                first_dirty=ltc.first_dirty_offset,
                stage=STAGE_MARK + token,
                progress=pass_progress(progress, ltc),
            )
        except PylogError:
            _discard_stage(log, token)
            if _changed(log, identities):
                raise _conflict(topic, partition) from None
            raise
    try:
        _swap(opener, topic, partition, now, res, identities, report)
    except BaseException:
        for seg, _ in res.staged:
            with contextlib.suppress(PylogError, OSError):
                seg.delete()
        raise
    res.staged = []  # swapped in: the result describes the log now
    return res


def _swap(
    opener: RootOpener,
    topic: str,
    partition: int,
    now: int,
    res: CleanResult,
    identities: dict[int, str | None],
    report: DetachedReport,
) -> None:
    if not res.staged and res.end_offset <= res.first_dirty_offset:
        return
    replaced: list[LogSegment] = []
    held_from: float | None = None
    root = opener(False)
    try:
        root.become_writer()  # waits for a sink's commit to finish (the opener's lock timeout)
        held_from = time.monotonic()
        log = root.writable_log(topic, partition)
        current = {s.base_offset: s for s in log.segments[:-1]}
        plan: list[tuple[LogSegment, list[LogSegment]]] = []
        for staged, group in res.staged:
            bases = [s.base_offset for s in group]
            in_range = sorted(b for b in current if bases[0] <= b <= bases[-1])
            if in_range != bases or any(
                log.storage.identity(current[b].log_path) != identities.get(b) for b in bases
            ):
                raise _conflict(topic, partition)
            if not log.storage.exists(staged.log_path) or log.storage.size(staged.log_path) != staged.size:
                raise _conflict(topic, partition)  # swept as a dead pass's (a pass older than STALE_STAGE_S)
            plan.append((staged, [current[b] for b in bases]))
        if plan:  # one replacement of the whole (contiguous) range: a few directory fsyncs
            new = []
            for staged, _ in plan:
                seg = LogSegment(
                    log.storage,
                    log.directory,
                    staged.base_offset,
                    log.config,
                    suffix=staged.suffix,
                    created_ms=now,
                )
                seg.change_suffix(".cleaned")
                new.append(seg)
            log.replace_segments(new, [s for _, old in plan for s in old], now=now)
            replaced = log.take_pending_deletes()
        points = ckpt.read_offsets(log.storage, ckpt.CLEANER_OFFSET)
        key = (topic, partition)
        points[key] = max(points.get(key, 0), res.end_offset)
        ckpt.write_offsets(log.storage, ckpt.CLEANER_OFFSET, points)
    finally:
        root.close()
        if held_from is not None:
            report.lock_held_s += time.monotonic() - held_from
    for seg in replaced:  # the old files, now named .deleted, go without holding the lock
        seg.delete()


def maintain_detached(
    opener: RootOpener,
    *,
    now: int,
    topics: Iterable[str] | None = None,
    force: bool = False,
    budget_s: float | None = None,
    cleaner: Cleaner | None = None,
    progress: ProgressFn | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> MaintenanceReport:
    """Compaction of a local root's compacted partitions (``topics``, default all) by
    :func:`clean_detached` passes, one partition after another: what ``maintain(...,
    retention=False)`` does, but with the writer lock held only for each swap, so that a
    running sink's commits go on meanwhile.  ``budget_s`` is checked between partitions."""
    cleaner = cleaner or Cleaner()
    report = MaintenanceReport(now)
    t0 = clock()
    if not cleaner.config.enable:
        report.compaction_skipped = "log.cleaner.enable=false"
        return report
    with contextlib.closing(opener(True)) as reader:
        names = reader.topics() if topics is None else list(topics)
        todo = [(t, p) for t in names if reader.config(t).compact for p in range(reader.partitions(t))]
    for topic, partition in todo:
        if budget_s is not None and clock() - t0 >= budget_s:
            report.budget_exhausted = True
            break
        done = clean_detached(
            opener, topic, partition, now=now, force=force, cleaner=cleaner, progress=progress
        )
        report.cleaning.extend(done.passes)
        if done.passes:
            report.cleaner_checkpoints[f"{topic}-{partition}"] = done.passes[-1].end_offset
        if done.error:
            report.uncleanable[f"{topic}-{partition}"] = done.error
    report.elapsed_s = clock() - t0
    return report


def _changed(log: Log, identities: dict[int, str | None]) -> bool:
    return any(
        log.storage.identity(join(log.directory, f"{segment_name(b)}.log")) != i
        for b, i in identities.items()
    )


def _staged_names(log: Log) -> Iterator[str]:
    for n in log.storage.listdir(log.directory):
        if STAGE_MARK in n:
            yield n


def _discard_stage(log: Log, token: str) -> None:
    for n in _staged_names(log):
        if n.endswith(STAGE_MARK + token):
            log.storage.delete(join(log.directory, n))


def _sweep_stale(log: Log) -> int:
    """Remove staged files of dead passes (older than :data:`STALE_STAGE_S`)."""
    removed = 0
    cutoff_ms = (time.time() - STALE_STAGE_S) * 1000
    for n in list(_staged_names(log)):
        path = join(log.directory, n)
        mtime = log.storage.modified_ms(path)
        if mtime is not None and mtime < cutoff_ms:
            log.storage.delete(path)
            removed += 1
    return removed


__all__ = [
    "STAGE_MARK",
    "STALE_STAGE_S",
    "DetachedReport",
    "RootOpener",
    "clean_detached",
    "maintain_detached",
]
