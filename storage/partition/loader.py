"""Opening a partition's directory: what Kafka's ``LogLoader`` does at broker start.

1. ``*.deleted`` files are removed; ``*.swap`` files at or above the smallest ``*.cleaned``
   base offset belong to an interrupted replacement and are removed with every ``*.cleaned``;
   the remaining swaps are completed (the segments they replace are removed, the suffix is
   dropped).
2. Index files without a ``.log`` are removed.  The active segment's indexes are
   sanity-checked (whole entries, ascending, offsets within the segment, positions within its
   ``.log``, the last offset-index entry pointing at a batch; see :mod:`index`), and rebuilt
   when missing or failing.  A sealed segment's are checked the same way when its indexes are
   first used (a read inside it, a timestamp lookup, its end), not at the load, as Kafka's lazy
   indexes: opening a log reads no file of a sealed segment, and makes no segment object but
   the ones it uses (:mod:`segments`; the directory is listed once, or not at all when the
   last writer closed the log cleanly and left the list of its segments, :mod:`closed_list`).
   A damaged or missing one is then rebuilt from the ``.log``, whose bytes are kept.  (On an
   object store, whose files change only through commits, missing indexes are rebuilt at the
   load and the others are checked as they are loaded.)
3. After an unclean shutdown every segment from the one holding the recovery point on is
   recovered: CRCs and offsets checked batch by batch, indexes rebuilt, the log truncated at
   the first invalid byte, and every later segment deleted (before the truncation, so that an
   interrupted recovery finds the same damage again).  After a clean shutdown only the tail of
   the active segment is checked (from its last index entry: cheap); a damaged one is recovered
   the same way before anything is appended behind it.  What was found and lost is reported.
4. A log whose end is below the log start offset is emptied and restarted there.
5. Given the high watermark (the end of acknowledged data), a writer truncates what lies past
   it (written by a publish that never completed; reported as ``unpublished_bytes``).

Only content proven invalid (a bad CRC, size or offset) is ever truncated.  An I/O error (a full
disk, a failing one: any ``OSError``) stops the load with a :class:`StorageError` naming the
file; nothing is truncated or deleted because of it, and loading again once the fault is gone
recovers the same data.

Read-only loading (a reader beside a live writer) changes nothing on disk: it skips steps that
modify files, ignores torn tails and scans the ``.log`` instead of using an index that fails
its checks.
"""

from __future__ import annotations

import bisect
import functools
import logging
import re
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from typing import Any

from pylog.storage.backends.base import Storage, join
from pylog.storage.config import LogConfig
from pylog.storage.errors import StorageError, os_error_fix, os_error_reason
from pylog.storage.partition import closed_list, layout, segment_checks
from pylog.storage.partition.listing import reader_segments
from pylog.storage.partition.log import Log, now_ms
from pylog.storage.partition.names import scan
from pylog.storage.partition.segment import LogSegment
from pylog.storage.partition.segments import SegmentList, as_list

log = logging.getLogger("pylog.storage")

_SEGMENT_FILE = re.compile(
    r"^(\d{20})\.(log|index|timeindex|txnindex|snapshot)((?:\.cleaned|\.swap|\.deleted)?)$"
)


@dataclass
class Recovery:
    """What loading found and did."""

    directory: str
    removed_files: list[str] = field(default_factory=list)
    rebuilt_indexes: list[str] = field(default_factory=list)
    completed_swaps: list[str] = field(default_factory=list)
    recovered_segments: list[str] = field(default_factory=list)
    truncated_file: str | None = None
    truncated_bytes: int = 0
    deleted_segments: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    unpublished_bytes: int = 0  # past the high watermark: written by a publish that never completed
    problems: list[str] = field(default_factory=list)  # the damage found, naming file and byte

    @property
    def lost_bytes(self) -> int:
        return self.truncated_bytes + self.deleted_bytes

    def summary(self) -> str:
        if not self.lost_bytes:
            return f"{self.directory}: recovered without loss"
        return (
            f"{self.directory}: truncated {self.truncated_bytes} invalid bytes at the end of "
            f"{self.truncated_file} and deleted {len(self.deleted_segments)} later segments "
            f"({self.deleted_bytes} bytes)"
        )


@dataclass
class LoadResult:
    log: Log
    recovery: Recovery
    checked_from: int = 0
    """Index of the first segment whose files the load read (recovered, or the active one's
    checked); the ones before it are checked when first used."""


@functools.lru_cache(maxsize=1 << 16)
def _parse(name: str) -> tuple[int, str, str] | None:
    """(base offset, kind, suffix) of a segment file name; None for other names.  Cached: a
    log is opened at every transaction on an object store, listing the same names again."""
    m = _SEGMENT_FILE.match(name)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None


def open_log(storage: Storage, directory: str, config: LogConfig | None = None, **kwargs: Any) -> Log:
    """Open (and recover, see :func:`load_log`) the log of one partition directory."""
    return load_log(storage, directory, config or LogConfig(), **kwargs).log


def load_log(
    storage: Storage,
    directory: str,
    config: LogConfig,
    *,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    had_clean_shutdown: bool = False,
    read_only: bool = False,
    high_watermark: int | None = None,
    refuse_misnamed: bool = False,
) -> LoadResult:
    """Load (a writer: and recover) the log in ``directory``; see the module docstring.

    Raises :class:`StorageError` naming the file for an I/O error."""
    try:
        result = _load_log(
            storage,
            directory,
            config,
            recovery_point,
            log_start_offset,
            had_clean_shutdown,
            read_only,
            refuse_misnamed,
        )
        lg = result.log
        lg.high_watermark = high_watermark
        if not read_only and high_watermark is not None and lg.log_end_offset > high_watermark:
            # written by a publish that never completed: never visible, so roll it back
            result.recovery.unpublished_bytes = lg.truncate_to(high_watermark)
            log.warning(
                "%s: removed %d unacknowledged bytes past the high watermark %d",
                directory,
                result.recovery.unpublished_bytes,
                high_watermark,
            )
        return result
    except OSError as e:
        where = e.filename if e.filename is not None else directory
        mode = "reading" if read_only else "loading and recovering"
        raise StorageError(
            f"{where}: {os_error_reason(e)} while {mode} the log in {directory}; "
            f"nothing was truncated or deleted because of it: fix the cause ({os_error_fix(e)}) "
            "and open it again"
        ) from e


def _load_log(
    storage: Storage,
    directory: str,
    config: LogConfig,
    recovery_point: int,
    log_start_offset: int,
    had_clean_shutdown: bool,
    read_only: bool,
    refuse_misnamed: bool,
) -> LoadResult:
    rec = Recovery(directory)
    checked_from = 0
    segments: MutableSequence[LogSegment]
    if read_only:  # a reader beside a live writer: see listing (and Log's "reading beside a writer")
        segments = reader_segments(storage, directory, config)
    else:
        if not storage.isdir(directory):
            storage.makedirs(directory)
            parent = directory.rstrip("/").rpartition("/")[0]
            storage.fsync_dir(parent)  # the new directory's name is durable (test_power_loss.py)
        listed = closed_list.take(storage, directory)  # (the list a clean close left)
        bases = listed if listed is not None else _listed_bases(storage, directory, config, rec)
        # after an unclean shutdown, the segment holding the recovery point and all later ones
        # are recovered (their indexes rebuilt); the active one's indexes are checked
        first = len(bases)
        if not had_clean_shutdown and bases:
            first = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        lazy_below = bases[min(first, len(bases) - 1)] if bases and storage.external_changes else -1

        def make(base: int, next_base: int | None) -> LogSegment:
            seg = LogSegment(storage, directory, base, config, next_base_offset=next_base)
            if base < lazy_below:
                # a sealed segment's indexes are checked (and rebuilt when missing or damaged)
                # when first used, not at the load: opening a log reads no file of a sealed
                # segment, as Kafka's loader skips the index sanity checks of segments below the
                # recovery point (lazy indexes)
                seg.first_use_check = functools.partial(_check_on_first_use, seg)
            return seg

        segments = SegmentList(bases, make)
        checked_from = max(0, min(first, len(segments) - 1))
        if refuse_misnamed:
            # before recovery could take a misnamed segment for invalid bytes: the segments it
            # reads, and the one before them (whose end their base offset must be)
            problems = layout.misnamed_problems(segments[max(0, checked_from - 1) :])
            if problems:
                raise layout.damaged_log_error(directory, problems, writer=True)
        if lazy_below < 0:
            # an object store's files change only through its commits, which wrote these
            # indexes whole: only missing ones are rebuilt here, and each index is checked
            # when it is first loaded (a damaged one is then ignored and the segment scanned)
            for seg in segments[: min(first, len(segments) - 1)]:
                if segment_checks.missing_indexes(seg):
                    _sanity_check_or_rebuild(seg, rec, read_log=False)
        if first >= len(segments) and segments:
            # (with its last offset-index entry checked against the .log)
            _sanity_check_or_rebuild(segments[-1], rec, read_log=True)
        if first < len(segments):
            _recover_from(segments, first, storage, directory, rec)
        elif len(segments) and segments[-1].log_path not in rec.rebuilt_indexes:
            problem = segment_checks.tail_problem(segments[-1])
            if problem is not None:  # damage after a clean shutdown: recover the active segment
                rec.problems.append(problem)
                _recover_from(segments, len(segments) - 1, storage, directory, rec)
    if not segments:
        segments = [LogSegment(storage, directory, log_start_offset, config, created_ms=now_ms())]
        if not read_only:
            segments[0].open_for_append()
    leo = segments[-1].read_next_offset()
    if leo < log_start_offset and not read_only:
        for seg in segments:
            seg.delete()
            rec.deleted_segments.append(seg.log_path)
        segments = [LogSegment(storage, directory, log_start_offset, config, created_ms=now_ms())]
        segments[0].open_for_append()
        leo = log_start_offset
    start = max(log_start_offset, segments[0].base_offset)
    rp = leo if had_clean_shutdown else min(recovery_point, leo)
    if rec.lost_bytes:
        log.warning(rec.summary())
    result = Log(
        storage,
        directory,
        config,
        as_list(segments),
        log_start_offset=start,
        recovery_point=rp,
        read_only=read_only,
    )
    return LoadResult(result, rec, checked_from)


def _listed_bases(storage: Storage, directory: str, config: LogConfig, rec: Recovery) -> list[int]:
    """Steps 1 and 2 (orphan indexes) of the module docstring on the listing of
    ``directory``; returns the base offsets of its segments, ascending.  The names are looked
    at in a few passes (:mod:`names`), one by one only when something is to be done."""
    names = storage.listdir(directory)
    scanned = scan(names)
    if scanned is None or scanned.has_temp:
        names = _remove_temp_files_and_complete_swaps(storage, directory, config, rec, names)
        scanned = scan(names)
    if scanned is None:  # a name the passes cannot vouch for: one by one
        logs = {n[:20] for n in names if len(n) == 24 and n.endswith(".log")}
        orphans = _orphan_indexes(names, logs)
        bases = sorted([int(b) for b in logs if b.isascii() and b.isdigit()])
    else:
        bases = scanned.bases
        orphans = _orphan_indexes(names, {f"{b:020d}" for b in bases}) if scanned.orphans else []
    for n in orphans:
        storage.delete(join(directory, n))
        rec.removed_files.append(n)
    return bases


def _remove_temp_files_and_complete_swaps(
    storage: Storage, directory: str, config: LogConfig, rec: Recovery, names: list[str]
) -> list[str]:
    """Step 1 of the module docstring on ``names`` (the listing of ``directory``); returns the
    names in ``directory`` afterwards (listed again only when something was changed)."""
    if not _TEMP_NAME.search("\n".join(names)):
        return names
    temp = [n for n in names if n.endswith((".deleted", ".cleaned", ".swap"))]
    cleaned_bases = [p[0] for n in temp if (p := _parse(n)) and p[2] == ".cleaned"]
    min_cleaned = min(cleaned_bases) if cleaned_bases else None
    swaps: list[int] = []
    for n in temp:
        p = _parse(n)
        if not p:
            if n.endswith((".deleted", ".cleaned")):
                storage.delete(join(directory, n))
                rec.removed_files.append(n)
            continue
        base, kind, suffix = p
        if suffix in (".deleted", ".cleaned") or (
            suffix == ".swap" and min_cleaned is not None and base >= min_cleaned
        ):
            storage.delete(join(directory, n))
            rec.removed_files.append(n)
        elif suffix == ".swap" and kind == "log":
            swaps.append(base)
    if swaps:
        swap_segments = [LogSegment(storage, directory, b, config, suffix=".swap") for b in sorted(swaps)]
        lo = swap_segments[0].base_offset
        hi = max(s.read_next_offset() for s in swap_segments)
        for n in storage.listdir(directory):
            p = _parse(n)
            if p and not p[2] and lo <= p[0] < hi:
                storage.delete(join(directory, n))
                rec.removed_files.append(n)
        for seg in sorted(swap_segments, key=lambda s: -s.base_offset):
            seg.change_suffix("")
            rec.completed_swaps.append(seg.log_path)
    stray = [n for n in storage.listdir(directory) if (p := _parse(n)) and p[2] == ".swap"]
    for n in stray:  # an index still .swap whose .log was already final (Kafka's last pass)
        storage.rename(join(directory, n), join(directory, n[: -len(".swap")]))
        rec.completed_swaps.append(join(directory, n))
    if swaps or stray:
        storage.fsync_dir(directory)
    return storage.listdir(directory)


_TEMP_NAME = re.compile(r"\.(?:deleted|cleaned|swap)$", re.MULTILINE)
_INDEX_KINDS = ("index", "timeindex", "txnindex")


def _orphan_indexes(names: list[str], logs: set[str]) -> list[str]:
    """The index files among ``names`` whose segment has no ``.log`` (``logs``: the stems, base
    offsets as in the names, of the ``.log`` files)."""
    orphans = {n[:20] for n in names if n.endswith("index")} - logs
    if not orphans:
        return []
    return [n for n in names if (p := _parse(n)) and not p[2] and p[1] in _INDEX_KINDS and n[:20] in orphans]


def _check_on_first_use(seg: LogSegment) -> None:
    """A writer's check of a sealed segment, deferred from the load to the first use of its
    indexes: missing or damaged ones (their last offset-index entry checked against the
    ``.log``) are rebuilt from the ``.log``, whose bytes are kept (a read that reaches invalid
    ones raises, naming the file and byte).  Counted in :data:`DEFERRED_CHECKS`."""
    DEFERRED_CHECKS[0] += 1
    missing = segment_checks.missing_indexes(seg)
    damaged = segment_checks.index_problems(seg, read_log=True)
    if not missing and not damaged:
        return
    if damaged:
        log.warning("rebuilding the indexes of %s: %s", seg.log_path, "; ".join(damaged))
    else:
        log.info("rebuilding the indexes of %s: missing %s", seg.log_path, ", ".join(missing))
    seg.recover(truncate=False)
    seg.rebuilt_indexes = damaged or missing


DEFERRED_CHECKS = [0]
"""How many sealed segments' deferred checks ran in this process (tests count them)."""


def _sanity_check_or_rebuild(seg: LogSegment, rec: Recovery, *, read_log: bool) -> None:
    missing, damaged = (
        segment_checks.missing_indexes(seg),
        segment_checks.index_problems(seg, read_log=read_log),
    )
    if not missing and not damaged:
        return
    if damaged:  # reported; a missing index is routine (a crash before it was created)
        log.warning("rebuilding the indexes of %s: %s", seg.log_path, "; ".join(damaged))
        rec.problems.extend(damaged)
    else:
        log.info("rebuilding the indexes of %s: missing %s", seg.log_path, ", ".join(missing))
    truncated = seg.recover()
    rec.rebuilt_indexes.append(seg.log_path)
    if truncated:
        rec.truncated_file = seg.log_path
        rec.truncated_bytes += truncated


def _recover_from(
    segments: MutableSequence[LogSegment], first: int, storage: Storage, directory: str, rec: Recovery
) -> None:
    """Recover ``segments[first:]``; at the first invalid byte, delete the later segments and
    truncate (deletions first: a load interrupted between them finds the same damage again)."""
    i = first
    while i < len(segments):
        seg = segments[i]
        # an I/O error propagates (the caller names the file); only proven-invalid bytes are cut
        invalid = seg.recover(truncate=False)
        if seg.log_path not in rec.recovered_segments:
            rec.recovered_segments.append(seg.log_path)
        if invalid:
            valid = seg.size - invalid
            rec.problems.append(f"{seg.log_path}: invalid content from byte {valid} on ({invalid} bytes)")
            # later segments first, newest first: a load interrupted here finds the same damage
            later = segments[i + 1 :]
            for s in reversed(later):
                s.delete()
                rec.deleted_segments.insert(0, s.log_path)
                rec.deleted_bytes += s.size
                segments.remove(s)
            if later:
                storage.fsync_dir(directory)
            seg.cut(valid)
            rec.truncated_file = seg.log_path
            rec.truncated_bytes += invalid
            break
        i += 1
    storage.fsync_dir(directory)
