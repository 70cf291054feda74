"""Becoming the writer of a root, recovering its logs, and leaving them ready for the next one.

    <root>/.lock                             writer lock (one writer process at a time)
    <root>/.kafka_cleanshutdown              present only after a clean close
    <root>/recovery-point-offset-checkpoint  <root>/log-start-offset-checkpoint

As a Kafka broker at start: the writer takes the lock, consumes the clean-shutdown marker (a
crash from then on is an unclean shutdown) and reads the checkpoints; each log it opens is
recovered from its recovery point unless the last shutdown was clean, and truncated back to
its high watermark (bytes past it were written by an append or publish that never completed).
On close it writes the checkpoints, then the marker.  Readers take no lock and recover nothing.

A writer never appends to a partition whose damage the append depends on (see
:mod:`~pylog.storage.partition.layout`): before a log is loaded, a log-start checkpoint beyond
the high watermark; as it is loaded, a segment recovery reads (the active one, or those from the
recovery point on) or the one before them whose first batch starts below its file's base offset
(renamed or copied: recovery would truncate it as invalid); after it is loaded, overlaps among
those segments, one of them that ends below the next one's base offset in a log with dense
offsets (cut short or removed from outside: offsets no segment holds, which recovery after a
clean shutdown does not look for; found from the segment's last index entry) or a log end below
the high watermark (segment files removed from outside: the next append would give acknowledged
offsets a second value) stop it.  The writer raises :class:`DamagedLogError` naming the files.
Older segments are not read to open a log (its cost does not grow with their number): damage
there is found by the read that reaches it, which raises the same error for the offsets
concerned (never fewer rows), as a reader does, and by ``pylog verify`` and ``pylog recover``.
:func:`plan_repair` and :func:`apply_repair` (``pylog recover``, :meth:`Root.recover`) make it
writable again, and find the damage a writer does not look for (a bad CRC or a batch cut short
in a segment recovery does not scan): a misnamed segment is renamed after its first batch and a
bogus log-start checkpoint entry dropped, which lose nothing; removing a segment whose offsets
another one holds, ending the log at its first invalid byte or at offsets no segment holds, or
lowering the high watermark to the log end, lose data and are only done when that is accepted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from pylog.storage.backends.base import Storage
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.errors import (
    CorruptCheckpointError,
    CorruptRecordError,
    LogLockedError,
    PylogError,
    StorageError,
    os_error_fix,
    os_error_reason,
)
from pylog.storage.faults import Faults
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition import layout
from pylog.storage.partition.checkpoint import Offsets
from pylog.storage.partition.loader import Recovery, load_log
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment, relative_headers, segment_name
from pylog.storage.partition.segments import made_segments
from pylog.storage.root.metadata import partition_dir, root_step
from pylog.storage.root.publish import STATE_FILE

log = logging.getLogger("pylog.storage")

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
CLEAN_SHUTDOWN_CONTENT = b'{"version":0,"brokerEpoch":-1}'
LOCK_RETRY_SECONDS = 0.02


def take_lock(storage: Storage, timeout: float) -> contextlib.ExitStack:
    """The root's writer lock, held until the returned stack is closed; with ``timeout`` > 0
    waits that many seconds for another writer (e.g. a second streaming query) to finish."""
    stack = contextlib.ExitStack()
    deadline = time.monotonic() + timeout
    while True:
        try:
            stack.enter_context(storage.lock(LOCK_FILE))
            return stack
        except LogLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(LOCK_RETRY_SECONDS)


@dataclass
class WriterStart:
    """What a new writer learns from the root before it opens a log."""

    had_clean_shutdown: bool
    recovery_points: Offsets
    start_offsets: Offsets


def start_writing(storage: Storage) -> WriterStart:
    """Consume the clean-shutdown marker and read the checkpoints (the lock must be held).

    A damaged checkpoint raises :class:`CorruptCheckpointError`: a writer never guesses."""
    with root_step(storage, CLEAN_SHUTDOWN, "delete it"):
        had_clean_shutdown = storage.exists(CLEAN_SHUTDOWN)
        storage.delete(CLEAN_SHUTDOWN)  # a crash from here on is an unclean shutdown
    with root_step(storage, "", "fsync the root directory"):
        storage.fsync_dir("")
    return WriterStart(
        had_clean_shutdown,
        ckpt.read_offsets(storage, ckpt.RECOVERY_POINT),
        ckpt.read_offsets(storage, ckpt.LOG_START_OFFSET),
    )


def read_start_offsets(storage: Storage) -> Offsets:
    """The log start offsets for readers: retention checkpoints a new start before it renames
    segments, so a reader honouring them never sees retention half done.  A damaged checkpoint
    reads as empty here (a reader goes on; ``pylog verify`` reports it)."""
    with contextlib.suppress(CorruptCheckpointError):
        return ckpt.read_offsets(storage, ckpt.LOG_START_OFFSET)
    return {}


def open_log(
    storage: Storage,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    writer: bool,
    had_clean_shutdown: bool,
    recovery_point: int,
    log_start_offset: int,
    high_watermark: int | None,
    faults: Faults | None = None,
    recoveries: list[Recovery] | None = None,
) -> tuple[Log, Recovery | None]:
    """The log of one partition, limited to ``high_watermark`` (None: up to its end).

    A reader (``writer`` False) opens it read-only as it is; damage it can see without reading
    more (log end below the high watermark, log start beyond it) is recorded in ``Log.damage``.
    The writer refuses a damaged log (:class:`DamagedLogError`, see the module docstring),
    recovers the others, and truncates what lies past the high watermark; it gets the
    :class:`Recovery` report too, also appended to ``recoveries`` (even when the log is then
    refused: what recovery truncated is reported).  ``faults`` (the root's) sees the named steps
    of the log's changes too (:mod:`pylog.storage.faults`)."""
    directory = partition_dir(topic, partition)
    if writer:
        problems = _start_problems(log_start_offset, high_watermark)
        if problems:
            raise layout.damaged_log_error(directory, problems, writer=True)
    result = load_log(  # (refuses misnamed segments before recovery could truncate them)
        storage,
        directory,
        config,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
        had_clean_shutdown=had_clean_shutdown or not writer,
        read_only=not writer,
        refuse_misnamed=writer and storage.external_changes,
    )
    lg = result.log
    lg.faults.parent = faults
    if writer and recoveries is not None:
        recoveries.append(result.recovery)
    if not writer:
        lg.damage = _reader_damage(lg, log_start_offset, high_watermark)
        lg.high_watermark = high_watermark
        return lg, None
    with _naming_io_errors(directory, "checking the segments of"):
        # the segments the load read and the one before them: what an append depends on (the
        # older ones are checked as they are read, see Log)
        checked = lg.segments[max(0, result.checked_from - 1) :]
        problems = layout.overlaps(checked) if storage.external_changes else []
        if storage.external_changes and not problems and not config.compact:
            # (the same ends read: a hole costs nothing more to find, the checkpoint is read then)
            holes = layout.holes(checked, below=high_watermark)  # (acknowledged offsets)
            problems += holes if holes and lg.offsets_dense() else []
        problems += _end_problems(lg, high_watermark)
    if problems:
        for seg in made_segments(lg.segments):  # closed as found: nothing flushed or indexed
            seg.close_files()
        raise layout.damaged_log_error(directory, problems, writer=True)
    lg.high_watermark = high_watermark
    if high_watermark is not None and lg.log_end_offset > high_watermark:
        # written by a publish that never completed: never visible, so roll it back
        with root_step(storage, directory, f"truncate what lies past the high watermark {high_watermark} in"):
            result.recovery.unpublished_bytes = lg.truncate_to(high_watermark)
        log.warning(
            "%s: removed %d unacknowledged bytes past the high watermark %d",
            lg.directory,
            result.recovery.unpublished_bytes,
            high_watermark,
        )
    return lg, result.recovery


@contextlib.contextmanager
def _naming_io_errors(directory: str, doing: str) -> Iterator[None]:
    """An ``OSError`` becomes a :class:`StorageError` naming the file (nothing was changed)."""
    try:
        yield
    except OSError as e:
        where = e.filename if e.filename is not None else directory
        raise StorageError(
            f"{where}: {os_error_reason(e)} while {doing} the log in {directory}; nothing "
            f"was truncated or deleted because of it: fix the cause ({os_error_fix(e)}) and "
            "open it again"
        ) from e


def _start_problems(log_start_offset: int, high_watermark: int | None) -> list[str]:
    """A log start beyond the end of acknowledged data: never written by retention (it stops at
    the high watermark); loading the log would delete every segment."""
    if high_watermark is not None and log_start_offset > high_watermark:
        return [
            f"{ckpt.LOG_START_OFFSET} says the log starts at offset {log_start_offset}, beyond its "
            f"high watermark {high_watermark} ({STATE_FILE})"
        ]
    return []


def _end_problems(lg: Log, high_watermark: int | None) -> list[str]:
    leo = lg.segments[-1].read_next_offset()
    if high_watermark is None or leo >= high_watermark:
        return []
    return [
        f"the log ends at offset {leo} ({lg.segments[-1].log_path}), below its high watermark "
        f"{high_watermark} ({STATE_FILE}): offsets {leo}..{high_watermark - 1} were acknowledged "
        "but no segment holds them (segment files removed, or invalid bytes removed by recovery)"
    ]


def _reader_damage(lg: Log, log_start_offset: int, high_watermark: int | None) -> list[layout.Damage]:
    damage = []
    first = lg.segments[0].base_offset
    problems = _start_problems(log_start_offset, high_watermark)
    if problems and high_watermark is not None:
        lg.log_start_offset = min(first, high_watermark)
        damage.append(layout.Damage(lg.log_start_offset, high_watermark, problems[0]))
    for problem in _end_problems(lg, high_watermark):
        assert high_watermark is not None
        damage.append(layout.Damage(lg.segments[-1].read_next_offset(), high_watermark, problem))
    return damage


def write_checkpoints(
    storage: Storage,
    logs: Mapping[tuple[str, int], Log],
    recovery_points: Offsets,
    start_offsets: Offsets,
    step: Callable[[str], None],
) -> None:
    """Write the recovery-point and log-start-offset checkpoints: those of ``logs``, and the
    entries read at start for the partitions not opened since."""
    rp = dict(recovery_points)
    lso = dict(start_offsets)
    for key, lg in logs.items():
        rp[key] = lg.recovery_point
        if lg.log_start_offset > lg.segments[0].base_offset:
            lso[key] = lg.log_start_offset
        else:
            lso.pop(key, None)
    ckpt.write_offsets(storage, ckpt.RECOVERY_POINT, rp)
    step("recovery-point-checkpointed")
    ckpt.write_offsets(storage, ckpt.LOG_START_OFFSET, lso)
    step("log-start-checkpointed")


def mark_clean_shutdown(storage: Storage) -> None:
    """The next writer may skip recovery (written after the logs were closed and checkpointed)."""
    with root_step(storage, CLEAN_SHUTDOWN, "write it"):
        storage.write_atomic(CLEAN_SHUTDOWN, CLEAN_SHUTDOWN_CONTENT)


# ---------------------------------------------------------------------- repairing damaged logs


@dataclass
class Repair:
    """What ``pylog recover`` does to make a damaged partition writable again, and what that
    loses (``lost`` empty: nothing).  File paths are relative to the root."""

    topic: str
    partition: int
    problems: list[str]
    """What is wrong (the :class:`DamagedLogError`'s problems)."""
    renames: list[tuple[str, str]] = field(default_factory=list)
    """``.log`` files renamed after their first batch (their offset indexes are rebuilt)."""
    removals: list[str] = field(default_factory=list)
    """``.log`` files removed with their indexes."""
    cut: tuple[str, int] | None = None
    """(``.log`` file, size): the file truncated to its valid batches (invalid bytes from there on:
    a bad CRC, offsets out of order, a batch cut short), its indexes rebuilt."""
    reset_log_start: int | None = None
    """A log-start checkpoint entry dropped (it pointed beyond the log's end)."""
    high_watermark: tuple[int, int] | None = None
    """(old, new): the high watermark lowered to the log end."""
    lost: list[str] = field(default_factory=list)
    """What the repair loses, one statement each."""
    lost_records: int = 0
    """Records in removed segments."""
    lost_offsets: int = 0
    """Acknowledged offsets below the old high watermark that are no longer readable."""
    applied: bool = False

    def describe(self) -> list[str]:
        """The repair's steps and losses, one line each."""
        steps = [f"rename {a} to {b}" for a, b in self.renames]
        steps += [f"remove {f}" for f in self.removals]
        if self.cut is not None:
            steps.append(f"truncate {self.cut[0]} to {self.cut[1]} bytes (its valid batches)")
        if self.reset_log_start is not None:
            steps.append(
                f"drop the {ckpt.LOG_START_OFFSET} entry {self.reset_log_start} (beyond the log end)"
            )
        if self.high_watermark is not None:
            steps.append(
                f"lower the high watermark from {self.high_watermark[0]} to {self.high_watermark[1]}"
            )
        return steps + [f"loses {what}" for what in self.lost]


@dataclass
class _Segment:
    path: str
    base: int
    first: int | None  # offset of its first batch; None: no valid batch
    end: int  # offset after its last valid batch (base if none)
    records: int  # in its valid batches
    size: int
    valid: int = 0  # bytes of its valid batches (the file's size: all valid)
    problem: str | None = None  # why the bytes from ``valid`` on are invalid


def plan_repair(
    storage: Storage,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    problems: list[str],
    log_start_offset: int,
    high_watermark: int | None,
    segments: list[LogSegment] | None = None,
) -> Repair:
    """The repair of a damaged partition, planned from a read-only view of its files (nothing
    is changed), or from ``segments`` (a writer's open log).  Every batch is read and checked as
    Kafka's recovery checks it (CRC, offsets increasing).  Segments are put in the order of their
    first batches: each one whose offsets follow the previous one's is kept, renamed after its
    first batch when its name does not fit; one whose offsets overlap those of a segment before
    it is removed (its records are lost, or held twice).  The log then ends at its first invalid
    byte (the segment holding it truncated there, every later one removed, as Kafka's recovery
    does after a crash) or, where offsets are dense (see :func:`layout.dense_offsets`), at the
    first segment that ends below the next one's base offset (offsets no segment holds: the later
    segments are removed, so that no acknowledged offset is unreadable and none gets a second
    value).  Then a log end below the high watermark lowers it, and a log-start checkpoint
    entry beyond the end is dropped.  ``problems`` gets the damage found that is not in it."""
    directory = partition_dir(topic, partition)
    own = segments is None
    if segments is None:
        segments = load_log(storage, directory, config, read_only=True, had_clean_shutdown=True).log.segments
    try:
        with _naming_io_errors(directory, "planning the repair of"):
            segs = [_describe_segment(seg) for seg in segments if seg.suffix == ""]
    finally:
        for seg in segments if own else []:
            seg.close_files()
    plan = Repair(topic, partition, list(problems))
    content = sorted((s for s in segs if s.first is not None), key=lambda s: (s.first, s.base))
    kept: list[_Segment] = []
    for s in content:
        assert s.first is not None
        prev = kept[-1] if kept else None
        if prev is not None and s.first < prev.end:
            plan.removals.append(s.path)
            plan.lost_records += s.records
            plan.lost.append(
                f"{s.records} records of {s.path} (offsets {s.first}..{s.end - 1}; offsets from "
                f"{s.first} on are also held by {prev.path})"
            )
            continue
        low = prev.end if prev is not None else -1
        new_base = s.base if low <= s.base <= s.first else s.first
        path = s.path
        if new_base != s.base:
            path = _renamed(s.path, new_base)
            plan.renames.append((s.path, path))
        kept.append(_Segment(path, new_base, s.first, s.end, s.records, s.size, s.valid, s.problem))
    for s in (s for s in segs if s.first is None):  # empty (or not starting with a valid batch)
        if any(k.base <= s.base < k.end or k.base == s.base for k in kept):
            plan.removals.append(s.path)
            if s.size:
                plan.lost.append(f"{s.size} bytes of {s.path}, which do not start with a valid batch")
        else:
            kept.append(s)
    kept.sort(key=lambda s: s.base)
    kept = _end_at_damage(plan, kept, layout.dense_offsets(storage, directory, config), high_watermark)
    leo = kept[-1].end if kept else 0
    if high_watermark is not None and leo < high_watermark:
        plan.high_watermark = (high_watermark, leo)
        plan.lost_offsets = high_watermark - leo
        plan.lost.append(
            f"offsets {leo}..{high_watermark - 1} of {directory}: acknowledged (high watermark "
            f"{high_watermark}) but in no segment; the next append gets offset {leo}"
        )
    if log_start_offset > min(leo, high_watermark if high_watermark is not None else leo):
        plan.reset_log_start = log_start_offset
    return plan


def _end_at_damage(plan: Repair, kept: list[_Segment], dense: bool, hw: int | None) -> list[_Segment]:
    """``kept`` (by base offset) up to the first invalid byte, or (``dense``) up to the first
    segment that ends below the next one's base and below the high watermark ``hw`` (what lies
    above it the writer's load truncates); what that cuts off goes into ``plan``."""
    for k, s in enumerate(kept):
        hole = dense and k + 1 < len(kept) and s.end < kept[k + 1].base and (hw is None or s.end < hw)
        if s.problem is None and not hole:
            continue
        later = kept[k + 1 :]
        if s.problem is not None:
            if s.problem not in plan.problems:
                plan.problems.append(s.problem)
            plan.lost.append(f"{s.size - s.valid} bytes of {s.path} from byte {s.valid} on (invalid)")
            if s.valid == 0 and k > 0:  # nothing valid: removed (it would end the log below its base)
                later, s = kept[k:], kept[k - 1]
            else:
                plan.cut = (s.path, s.valid)
        elif not plan.problems:  # (a writer's refusal states it already)
            plan.problems.append(
                f"{s.path} ends at offset {s.end} and {later[0].path} starts at {later[0].base}: offsets "
                f"{s.end}..{later[0].base - 1} are held by no segment"
            )
        if later:
            n = sum(x.records for x in later)
            plan.removals += [x.path for x in later]
            plan.lost_records += n
            lo, hi = min(x.base for x in later), max(x.end for x in later)
            segments = "the segment" if len(later) == 1 else f"the {len(later)} segments"
            plan.lost.append(
                f"{n} records of {segments} after it (offsets {lo}..{hi - 1}): the log ends at offset "
                f"{s.end}, where the damage is, as recovery after a crash would end it"
            )
        return kept[: kept.index(s) + 1]
    return kept


def _describe_segment(seg: LogSegment) -> _Segment:
    """The segment's valid batches (Kafka recovery's checks: CRC, offsets increasing; not its
    base offset, which may be wrong) and why the bytes after them are invalid."""
    first: int | None = None
    end, records, valid, prev = seg.base_offset, 0, 0, -1
    problem = None
    try:
        for loc in seg.iter_batches(0):
            h = loc.headers
            crc_ok = B.verify_crcs(loc.data, relative_headers(h, loc.start))
            prevs = np.concatenate([[prev], h.last_offset[:-1]])
            bad = ~crc_ok | (h.last_offset < h.base_offset) | (h.base_offset <= prevs)
            n = int(np.argmax(bad)) if bad.any() else len(h)
            if n:
                first = int(h.base_offset[0]) if first is None else first
                prev = int(h.last_offset[n - 1])
                end = prev + 1
                records += int(h.records_count[:n].sum())
                valid = int(h.position[n - 1] + h.size[n - 1])
            if n < len(h):
                why = (
                    "its CRC does not match its bytes"
                    if not crc_ok[n]
                    else (
                        f"its offsets {int(h.base_offset[n])}..{int(h.last_offset[n])} do not follow offset "
                        f"{int(prevs[n])}"
                    )
                )
                problem = f"{seg.log_path}: the batch at byte {int(h.position[n])} is invalid: {why}"
                break
    except CorruptRecordError as e:
        problem = f"{seg.log_path}: byte {e.position}: {e.reason}"
    if problem is None and valid < seg.size:
        problem = (
            f"{seg.log_path}: {seg.size - valid} bytes at byte {valid} are not a complete batch (the "
            f"file ends at byte {seg.size})"
        )
    return _Segment(seg.log_path, seg.base_offset, first, end, records, seg.size, valid, problem)


def _renamed(path: str, base: int) -> str:
    directory, _, _ = path.rpartition("/")
    return f"{directory}/{segment_name(base)}.log"


def apply_repair(storage: Storage, plan: Repair) -> None:
    """Carry out the file changes of ``plan`` (removals, then renames, then the cut; the offset
    and time indexes of renamed and cut segments are removed, and rebuilt when the writer loads
    the log); the
    caller changes the high watermark and the checkpoints.  Each step is atomic: a crash leaves
    a log that is damaged less, which ``pylog recover`` repairs again."""
    directory = partition_dir(plan.topic, plan.partition)
    for path in plan.removals:
        stem = path[: -len(".log")]
        for ext in (".index", ".timeindex", ".txnindex", ".log"):
            storage.delete(stem + ext)
    pending = list(plan.renames)
    while pending:
        ready = [(a, b) for a, b in pending if not storage.exists(b)]
        if not ready:
            raise PylogError(
                f"{directory}: cannot rename {', '.join(f'{a} to {b}' for a, b in pending)}: the new names "
                "are taken; rename the files by hand"
            )
        for a, b in ready:
            old, new = a[: -len(".log")], b[: -len(".log")]
            for ext in (".index", ".timeindex", ".txnindex"):
                storage.delete(new + ext)  # without a .log: left over, never this segment's
            for ext in (".index", ".timeindex"):  # relative offsets: rebuilt under the new name
                storage.delete(old + ext)
            storage.rename(a, b)
            if storage.exists(old + ".txnindex"):  # absolute offsets: still right
                storage.rename(old + ".txnindex", new + ".txnindex")
            pending.remove((a, b))
    if plan.cut is not None:  # its indexes are rebuilt when the writer loads the log
        path, size = plan.cut
        for ext in (".index", ".timeindex", ".txnindex"):
            storage.delete(path[: -len(".log")] + ext)
        storage.truncate(path, size)
    storage.fsync_dir(directory)
