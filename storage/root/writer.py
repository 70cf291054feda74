"""Becoming the writer of a root, recovering its logs, and leaving them ready for the next one.

    <root>/.lock                             writer lock (one writer process at a time)
    <root>/.kafka_cleanshutdown              present only after a clean close
    <root>/recovery-point-offset-checkpoint  <root>/log-start-offset-checkpoint

As a Kafka broker at start: the writer takes the lock, consumes the clean-shutdown marker (a
crash from then on is an unclean shutdown) and reads the checkpoints; each log it opens is
recovered from its recovery point unless the last shutdown was clean, and truncated back to
its high watermark (bytes past it were written by an append or publish that never completed).
On close it writes the checkpoints, then the marker.  Readers take no lock and recover nothing.

A damaged partition is never written to (see :mod:`~pylog.storage.partition.layout`): before
a log is loaded, a log-start checkpoint beyond the high watermark or a segment whose first batch
starts below its file's base offset (renamed or copied: recovery would truncate it as invalid)
stops the writer; after it is loaded, overlapping segments or a log end below the high
watermark (segment files removed from outside: the next append would give acknowledged offsets
a second value) do.  The writer raises :class:`DamagedLogError` naming the files.  A reader
opens such a log but raises the same error for the offsets concerned.  :func:`plan_repair`
and :func:`apply_repair` (``pylog recover``, :meth:`Root.recover`) make it writable again:
a misnamed segment is renamed after its first batch and a bogus log-start checkpoint entry
dropped, which lose nothing; removing a segment whose offsets another one holds, or lowering the
high watermark to the log end, lose data and are only done when that is accepted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from pylog.storage.backends.fs import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptCheckpointError, LogLockedError, PylogError, StorageError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition import layout
from pylog.storage.partition.loader import Recovery, load_log
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment, segment_name
from pylog.storage.root.metadata import partition_dir, root_step
from pylog.storage.root.publish import STATE_FILE

log = logging.getLogger("pylog.storage")

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
CLEAN_SHUTDOWN_CONTENT = b'{"version":0,"brokerEpoch":-1}'
LOCK_RETRY_SECONDS = 0.02

Offsets = dict[tuple[str, int], int]


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
    step_hook: Callable[[str], None] | None = None,
    recoveries: list[Recovery] | None = None,
) -> tuple[Log, Recovery | None]:
    """The log of one partition, limited to ``high_watermark`` (None: up to its end).

    A reader (``writer`` False) opens it read-only as it is; damage it can see without reading
    more (log end below the high watermark, log start beyond it) is recorded in ``Log.damage``.
    The writer refuses a damaged log (:class:`DamagedLogError`, see the module docstring),
    recovers the others, and truncates what lies past the high watermark; it gets the
    :class:`Recovery` report too, also appended to ``recoveries`` (even when the log is then
    refused: what recovery truncated is reported).  ``step_hook`` sees the named steps of the
    log's changes (crash-point tests)."""
    directory = partition_dir(topic, partition)
    if writer:
        problems = _start_problems(log_start_offset, high_watermark)
        with _naming_io_errors(directory, "checking the segment names of"):
            if storage.external_changes and storage.isdir(directory):
                problems += layout.misnamed_segments(storage, directory)
        if problems:  # before recovery could take a misnamed segment for invalid bytes
            raise layout.damaged_log_error(directory, problems, writer=True)
    result = load_log(
        storage,
        directory,
        config,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
        had_clean_shutdown=had_clean_shutdown or not writer,
        read_only=not writer,
    )
    lg = result.log
    lg.step_hook = step_hook
    if writer and recoveries is not None:
        recoveries.append(result.recovery)
    if not writer:
        lg.damage = _reader_damage(lg, log_start_offset, high_watermark)
        lg.high_watermark = high_watermark
        return lg, None
    with _naming_io_errors(directory, "checking the segments of"):
        problems = layout.overlaps(lg.segments) if storage.external_changes else []
        problems += _end_problems(lg, high_watermark)
    if problems:
        for seg in lg.segments:  # closed as found: nothing flushed or indexed
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
            f"{where}: {e.strerror or e} (errno {e.errno}) while {doing} the log in {directory}; nothing "
            "was truncated or deleted because of it: fix the cause (free space, check the disk) and "
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
    end: int  # offset after its last batch (base if none)
    records: int
    size: int


def plan_repair(
    storage: Storage,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    problems: list[str],
    log_start_offset: int,
    high_watermark: int | None,
) -> Repair:
    """The repair of a damaged partition, planned from a read-only view of its files (nothing
    is changed).  Segments are put in the order of their first batches: each one whose offsets
    follow the previous one's is kept, renamed after its first batch when its name does not fit;
    one whose offsets overlap those of a segment before it is removed (its records are lost, or
    held twice).  Then a log end below the high watermark lowers it, and a log-start checkpoint
    entry beyond the end is dropped."""
    directory = partition_dir(topic, partition)
    lg = load_log(storage, directory, config, read_only=True, had_clean_shutdown=True).log
    try:
        with _naming_io_errors(directory, "planning the repair of"):
            segs = [_describe_segment(storage, seg) for seg in lg.segments if seg.suffix == ""]
    finally:
        for seg in lg.segments:
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
        if new_base != s.base:
            plan.renames.append((s.path, _renamed(s.path, new_base)))
        kept.append(_Segment(s.path, new_base, s.first, s.end, s.records, s.size))
    for s in (s for s in segs if s.first is None):  # empty (or not starting with a valid batch)
        if any(k.base <= s.base < k.end or k.base == s.base for k in kept):
            plan.removals.append(s.path)
            if s.size:
                plan.lost.append(f"{s.size} bytes of {s.path}, which do not start with a valid batch")
        else:
            kept.append(s)
    kept.sort(key=lambda s: s.base)
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


def _describe_segment(storage: Storage, seg: LogSegment) -> _Segment:
    first = layout.first_offset(storage, seg.log_path, seg.size) if seg.size else None
    records = 0
    end = seg.base_offset
    if first is not None:
        end = seg.read_next_offset()
        records = sum(int(loc.headers.records_count.sum()) for loc in seg.iter_batches(0))
    return _Segment(seg.log_path, seg.base_offset, first, end, records, seg.size)


def _renamed(path: str, base: int) -> str:
    directory, _, _ = path.rpartition("/")
    return f"{directory}/{segment_name(base)}.log"


def apply_repair(storage: Storage, plan: Repair) -> None:
    """Carry out the file changes of ``plan`` (removals, then renames; the offset and time
    indexes of renamed segments are removed, and rebuilt when the writer loads the log); the
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
    storage.fsync_dir(directory)
