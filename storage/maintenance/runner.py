"""Maintenance: retention and compaction where due, for one log or a whole root.

:func:`maintain` is what a broker's log manager and cleaner threads do, as one call that takes
``now``: retention on every log (:mod:`retention`), then cleaning passes (:mod:`cleaner`) on the
compacted logs whose dirty ratio exceeds ``min.cleanable.dirty.ratio`` (or that hold a segment
older than ``max.compaction.lag.ms``), the filthiest first, until none qualifies or the time
budget is spent.  Cleaner checkpoints are read from and written to ``cleaner-offset-checkpoint``
at the root of the log's storage after every pass; a root's recovery-point and log-start
checkpoints are written at the end.

With ``log.cleaner.enable=false`` (``cleaner_config``, or the config of the ``cleaner`` passed)
compaction does not run, as Kafka's cleaner threads do not start; retention, the removal of
``.deleted`` files and the merging of small segments still run, and the report says why nothing
was cleaned (``compaction_skipped``).

The budget is checked between logs and while an offset map is built (a pass that runs out of
time covers fewer records but still completes and advances its checkpoint); a started segment
rewrite always completes.  ``now`` decides what is due; the budget is measured with
``clock`` (default ``time.monotonic``), which never influences what is kept.  The cleaner's I/O
throttle (``log.cleaner.io.max.bytes.per.second``) waits with ``sleep`` (default ``time.sleep``)
on the same ``clock``, so its waits count against the budget; a rewrite started near the end of
the budget may then outlast it by its bytes divided by the rate.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pylog.storage.config import CleanerConfig
from pylog.storage.errors import PylogError
from pylog.storage.maintenance.cleaner import Cleaner, CleanResult, LogToClean, log_to_clean
from pylog.storage.maintenance.merge import merge_small_segments
from pylog.storage.maintenance.retention import RetentionResult, partition_key, retain
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.log import Log
from pylog.storage.root.manager import Root

ProgressFn = Callable[[str, int, int], None]
"""``progress(what, done, total)``: bytes processed so far of the current log's work.  The
``pylog`` commands draw it on a terminal (``pylog.cli.progress``); storage draws nothing."""


@dataclass
class MaintenanceReport:
    """What :func:`maintain` did."""

    now: int
    retention: list[RetentionResult] = field(default_factory=list)  # logs where segments went
    cleaning: list[CleanResult] = field(default_factory=list)  # one per cleaning pass
    cleaner_checkpoints: dict[str, int] = field(default_factory=dict)  # "<topic>-<p>" -> first dirty
    uncleanable: dict[str, str] = field(default_factory=dict)  # directory -> error
    files_deleted: int = 0  # ``.deleted`` segments physically removed (file.delete.delay.ms passed)
    segments_merged: int = 0  # small segments merged away (object stores)
    orphans_deleted: int = 0  # unreferenced objects removed (object stores)
    compaction_skipped: str = ""  # why compaction did not run on the compacted logs, if it did not
    budget_exhausted: bool = False
    elapsed_s: float = 0.0

    @property
    def segments_deleted(self) -> int:
        return sum(r.segments_deleted for r in self.retention)

    @property
    def bytes_deleted(self) -> int:
        return sum(r.bytes_deleted for r in self.retention)

    @property
    def records_removed(self) -> int:
        return sum(c.records_removed for c in self.cleaning)

    @property
    def bytes_removed(self) -> int:
        return sum(c.bytes_removed for c in self.cleaning)

    @property
    def throttled_s(self) -> float:
        """Time the cleaner slept to stay within ``log.cleaner.io.max.bytes.per.second``."""
        return sum(c.throttled_s for c in self.cleaning)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            segments_deleted=self.segments_deleted,
            bytes_deleted=self.bytes_deleted,
            records_removed=self.records_removed,
            bytes_removed=self.bytes_removed,
            throttled_s=self.throttled_s,
        )
        return d

    def summary(self) -> str:
        lines = []
        for r in self.retention:
            lines.append(
                f"{r.directory}: deleted {r.segments_deleted} segments ({r.bytes_deleted} bytes; "
                f"{', '.join(r.reasons)}), log start offset {r.log_start_offset}"
            )
        for c in self.cleaning:
            lines.append(
                f"{c.directory}: cleaned offsets [{c.first_dirty_offset}, {c.end_offset}) in {c.groups} "
                f"groups: {c.records_removed} of {c.records_read} records and {c.bytes_removed} of "
                f"{c.bytes_read} bytes removed{' (offset map full: partial pass)' if c.map_full else ''}"
                f"{f'; throttled {c.throttled_s:.1f} s' if c.throttled_s else ''}"
            )
        if self.compaction_skipped:
            lines.append(f"compaction not run: {self.compaction_skipped}")
        for d, e in self.uncleanable.items():
            lines.append(f"{d}: uncleanable: {e}")
        if self.segments_merged:
            lines.append(f"merged away {self.segments_merged} small segments")
        if self.orphans_deleted:
            lines.append(f"deleted {self.orphans_deleted} orphaned objects")
        if self.budget_exhausted:
            lines.append("time budget exhausted: remaining work left for the next run")
        if not lines:
            lines.append("nothing to do")
        return "\n".join(lines)


def _targets(
    target: Log | Root, topics: Iterable[str] | None, partitions: Iterable[tuple[str, int]] | None
) -> list[tuple[tuple[str, int] | None, Log]]:
    if isinstance(target, Log):
        return [(partition_key(target), target)]
    if partitions is not None:
        keys = sorted({(t, int(p)) for t, p in partitions})
    else:
        names = target.topics() if topics is None else list(topics)
        keys = [(t, p) for t in names for p in range(target.partitions(t))]
    return [(k, target.writable_log(*k)) for k in keys]


def maintain(
    target: Log | Root,
    *,
    now: int,
    budget_s: float | None = None,
    retention: bool = True,
    compaction: bool = True,
    force: bool = False,
    topics: Iterable[str] | None = None,
    partitions: Iterable[tuple[str, int]] | None = None,
    high_watermarks: Mapping[tuple[str, int], int] | None = None,
    cleaner: Cleaner | None = None,
    cleaner_config: CleanerConfig | None = None,
    progress: ProgressFn | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    merge_below: int | None = None,
) -> MaintenanceReport:
    """Run retention and compaction where due on ``target`` (a log, or a root's logs, limited
    to ``topics`` or ``partitions``) at time ``now`` (ms).

    ``force`` cleans every compacted log with dirty data, whatever its dirty ratio.
    ``high_watermarks`` bounds retention per partition (see :func:`retention.retain`).
    ``cleaner`` may be reused across calls: it keeps the offset map's memory and the logs
    found uncleanable; without one, a cleaner is made from ``cleaner_config`` (default:
    Kafka's), pacing its I/O with ``clock`` and ``sleep``.  ``compaction=False``, or
    ``log.cleaner.enable=false`` in the cleaner's config, leaves compaction out.  On an object
    store, runs of small segments are merged; ``merge_below`` caps what is small (default
    :data:`~pylog.storage.maintenance.merge.SMALL_MAX`;
    :data:`~pylog.storage.maintenance.merge.COMMIT_SMALL_MAX` for a run in a committing
    process).
    Returns a :class:`MaintenanceReport`."""
    run = functools.partial(
        _maintain, target, now, budget_s, retention, compaction, force, topics, partitions,
        high_watermarks, cleaner, cleaner_config, progress, clock, sleep, merge_below,
    )  # fmt: skip
    if not (isinstance(target, Root) and target.transactional):
        return run()
    # on an object store the whole run is one commit (re-run from the newest state if another
    # writer committed first), followed by a sweep of objects no manifest refers to
    report = target.transaction(run)
    if not report.budget_exhausted and _sweep_due(target, now):
        report.orphans_deleted = target.sweep_orphans(now)
    return report


_LAST_SWEEP: dict[str, int] = {}


def _sweep_due(root: Root, now: int) -> bool:
    """Orphan sweeps list the whole root: at most one per delete delay per root and process."""
    url = root.storage.describe()
    delay = getattr(getattr(root.storage, "store", None), "file_delete_delay_ms", 60_000)
    if now - _LAST_SWEEP.get(url, -(1 << 62)) < delay:
        return False
    _LAST_SWEEP[url] = now
    return True


def _maintain(
    target: Log | Root,
    now: int,
    budget_s: float | None,
    retention: bool,
    compaction: bool,
    force: bool,
    topics: Iterable[str] | None,
    partitions: Iterable[tuple[str, int]] | None,
    high_watermarks: Mapping[tuple[str, int], int] | None,
    cleaner: Cleaner | None,
    cleaner_config: CleanerConfig | None,
    progress: ProgressFn | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    merge_below: int | None,
) -> MaintenanceReport:
    t0 = clock()
    report = MaintenanceReport(now)
    cleaner = cleaner or Cleaner(cleaner_config, clock=clock, sleep=sleep)

    def out_of_time() -> bool:
        if budget_s is not None and clock() - t0 >= budget_s:
            report.budget_exhausted = True
        return report.budget_exhausted

    logs = _targets(target, topics, partitions)
    if retention:
        for key, lg in logs:
            if out_of_time():
                break
            hw = (high_watermarks or {}).get(key) if key is not None else None
            r = retain(lg, now=now, high_watermark=hw)
            if r.segments_deleted:
                report.retention.append(r)
    if compaction and logs:
        if cleaner.config.enable:
            _compact(logs, report, cleaner, now, force, progress, out_of_time)
        elif any(lg.config.compact for _, lg in logs):
            report.compaction_skipped = "log.cleaner.enable=false"
    if isinstance(target, Root) and target.transactional:
        for _, lg in logs:
            if out_of_time():
                break
            report.segments_merged += merge_small_segments(lg, now=now, small_max=merge_below)
    for _, lg in logs:
        report.files_deleted += lg.delete_pending(now)
    report.uncleanable.update(
        {d: e for d, e in cleaner.uncleanable.items() if any(d == lg.directory for _, lg in logs)}
    )
    if isinstance(target, Root):
        target.checkpoint()
    report.elapsed_s = clock() - t0
    return report


def _compact(
    logs: list[tuple[tuple[str, int] | None, Log]],
    report: MaintenanceReport,
    cleaner: Cleaner,
    now: int,
    force: bool,
    progress: ProgressFn | None,
    out_of_time: Callable[[], bool],
) -> None:
    storage = logs[0][1].storage
    if any(lg.config.compact for _, lg in logs):
        cleaner.offset_map  # noqa: B018 - allocate it now: a bad dedupe buffer size is a ConfigError
    checkpoints = ckpt.read_offsets(storage, ckpt.CLEANER_OFFSET)
    candidates = {
        lg.directory: (key, lg)
        for key, lg in logs
        if lg.config.compact and lg.directory not in cleaner.uncleanable
    }

    def qualifies(ltc: LogToClean) -> bool:
        return ltc.cleanable_bytes > 0 if force else ltc.should_clean()

    while candidates and not out_of_time():
        exact = []
        for d, (k, lg) in list(candidates.items()):
            point = checkpoints.get(k) if k else None
            try:  # cheap bound first (no last stable offset, which may need a scan), then exact
                if qualifies(log_to_clean(lg, point, now, with_lso=False)):
                    ltc = log_to_clean(lg, point, now)
                    if qualifies(ltc):
                        exact.append((d, ltc))
            except PylogError as e:
                cleaner.uncleanable[d] = str(e)
                del candidates[d]
        if not exact:
            break
        d, ltc = max(exact, key=lambda x: x[1].cleanable_ratio)
        key, lg = candidates[d]
        try:
            res = cleaner.clean(
                lg,
                now=now,
                first_dirty=ltc.first_dirty_offset,
                progress=pass_progress(progress, ltc),
                should_stop=out_of_time,
            )
        except PylogError as e:
            cleaner.uncleanable[d] = str(e)
            del candidates[d]
            continue
        report.cleaning.append(res)
        if key is not None:
            checkpoints[key] = res.end_offset
            report.cleaner_checkpoints[f"{key[0]}-{key[1]}"] = res.end_offset
            ckpt.write_offsets(storage, ckpt.CLEANER_OFFSET, checkpoints)
        if res.end_offset <= ltc.first_dirty_offset or not res.map_full:
            del candidates[d]  # clean up to its uncleanable point (or no progress possible)


def pass_progress(progress: ProgressFn | None, ltc: LogToClean) -> Callable[[int], None] | None:
    """The cleaner's byte counts of one pass over ``ltc``'s log, reported to ``progress`` as
    ``(log directory, bytes done, bytes to do)``: the dirty bytes and the segments below the
    first uncleanable offset, which the pass reads."""
    if progress is None:
        return None
    lg = ltc.log
    total = ltc.cleanable_bytes + sum(
        s.size for s in lg.segments if s.base_offset < ltc.first_uncleanable_offset
    )
    done = 0

    def steps(n: int) -> None:
        nonlocal done
        done += n
        progress(lg.directory, done, total)

    return steps
