"""Opening a partition's directory: what Kafka's ``LogLoader`` does at broker start.

1. ``*.deleted`` files are removed; ``*.swap`` files at or above the smallest ``*.cleaned``
   base offset belong to an interrupted replacement and are removed with every ``*.cleaned``;
   the remaining swaps are completed (the segments they replace are removed, the suffix is
   dropped).
2. Index files without a ``.log`` are removed; every segment's indexes are sanity-checked
   (whole entries, ascending, offsets within the segment, positions within its ``.log``, the
   last offset-index entry pointing at a batch; see :mod:`index`), and a segment whose offset
   or time index is missing or fails has its indexes rebuilt.
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

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from pylog.storage.backends.fs import Storage, join
from pylog.storage.config import LogConfig
from pylog.storage.errors import StorageError, os_error_fix, os_error_reason
from pylog.storage.partition import segment_checks
from pylog.storage.partition.listing import reader_segments
from pylog.storage.partition.log import Log, now_ms
from pylog.storage.partition.segment import LogSegment

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
) -> LoadResult:
    """Load (a writer: and recover) the log in ``directory``; see the module docstring.

    Raises :class:`StorageError` naming the file for an I/O error."""
    try:
        result = _load_log(
            storage, directory, config, recovery_point, log_start_offset, had_clean_shutdown, read_only
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
) -> LoadResult:
    rec = Recovery(directory)
    if not read_only:
        if not storage.isdir(directory):
            storage.makedirs(directory)
            parent = directory.rstrip("/").rpartition("/")[0]
            storage.fsync_dir(parent)  # the new directory's name is durable (test_power_loss.py)
        _remove_temp_files_and_complete_swaps(storage, directory, config, rec)
    names = [] if read_only else storage.listdir(directory)  # (a reader lists in reader_segments)
    logs = sorted({p[0] for n in names if (p := _parse(n)) and p[1] == "log" and not p[2]})
    if not read_only:
        for n in names:
            p = _parse(n)
            if p and not p[2] and p[1] in ("index", "timeindex", "txnindex") and p[0] not in logs:
                storage.delete(join(directory, n))
                rec.removed_files.append(n)
    nexts = [*logs[1:], None][: len(logs)]
    segments = [
        LogSegment(storage, directory, b, config, next_base_offset=n)
        for b, n in zip(logs, nexts, strict=True)
        if not read_only
    ]
    if read_only:  # a reader beside a live writer: see listing (and Log's "reading beside a writer")
        segments = reader_segments(storage, directory, config)
    else:
        # after an unclean shutdown, the segment holding the recovery point and all later ones
        # are recovered (their indexes rebuilt); the others' indexes are checked
        bases = [s.base_offset for s in segments]
        first = len(segments)
        if not had_clean_shutdown and segments:
            first = max((i for i, b in enumerate(bases) if b <= recovery_point), default=0)
        for seg in segments[:first]:
            if not storage.external_changes and seg is not segments[-1]:
                # an object store's files change only through its commits, which wrote these
                # indexes whole: only missing ones are rebuilt here, and each index is checked
                # when it is first loaded (a damaged one is then ignored and the segment
                # scanned), so opening a log costs no index read per sealed segment.  Kafka's
                # loader likewise skips the offset and time index sanity checks of segments
                # below the recovery point (lazy indexes).
                if segment_checks.missing_indexes(seg):
                    _sanity_check_or_rebuild(seg, rec, read_log=False)
                continue
            # each last offset-index entry is checked against the .log where files can be changed
            # from outside; on an object store (a read per segment: a request) only the active one's
            read_log = storage.external_changes or seg is segments[-1]
            _sanity_check_or_rebuild(seg, rec, read_log=read_log)
        if first < len(segments):
            _recover_from(segments, first, storage, directory, rec)
        elif segments and segments[-1].log_path not in rec.rebuilt_indexes:
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
        storage, directory, config, segments, log_start_offset=start, recovery_point=rp, read_only=read_only
    )
    return LoadResult(result, rec)


def _remove_temp_files_and_complete_swaps(
    storage: Storage, directory: str, config: LogConfig, rec: Recovery
) -> None:
    names = storage.listdir(directory)
    cleaned_bases = [p[0] for n in names if (p := _parse(n)) and p[2] == ".cleaned"]
    min_cleaned = min(cleaned_bases) if cleaned_bases else None
    swaps: list[int] = []
    for n in names:
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
    if not swaps and not stray:
        return
    storage.fsync_dir(directory)


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
    segments: list[LogSegment], first: int, storage: Storage, directory: str, rec: Recovery
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
