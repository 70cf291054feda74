"""Opening a root: what it reads, becoming its writer, opening (recovering) its logs, and
leaving them ready for the next writer.

    <root>/.lock                             writer lock (one writer process at a time)
    <root>/.kafka_cleanshutdown              present only after a clean close
    <root>/recovery-point-offset-checkpoint  <root>/log-start-offset-checkpoint

Opening a root for writing is one sequence, in this order (each step one call):

1. :func:`~pylog.storage.root.opening.open_root` picks the storage (local disk, or an object
   store, which loads its newest state) and makes the ``Root``;
2. :func:`read_root`: the root reads what any reader reads - the log start offsets, the
   topics (``pylog-topics.json``) and the high watermarks (``pylog-state.json``);
3. at the first change (``create_topic``, ``append``, ``publish``...), ``Root._open_for_writing``
   runs :func:`become_writer` - the lock, the clean-shutdown marker, the checkpoints, the state
   as the writer finds it - then drops the logs it opened as a reader and finishes what a
   crash interrupted at root level;
4. each partition's log, as first used (``Root.log``): :func:`open_log` - refuse a bad log
   start, load and recover the log (:func:`~pylog.storage.partition.loader.load_log`), refuse
   the damage an append depends on, truncate what lies past the high watermark.

As a Kafka broker at start: the writer takes the lock, consumes the clean-shutdown marker (a
crash from then on is an unclean shutdown) and reads the checkpoints; each log it opens is
recovered from its recovery point unless the last shutdown was clean, and truncated back to
its high watermark (bytes past it were written by an append or publish that never completed).
On close it writes the checkpoints (:func:`write_checkpoints`), then the marker
(:func:`mark_clean_shutdown`).  Readers take no lock and recover nothing.

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
:mod:`~pylog.storage.root.repair` (``pylog recover``, :meth:`Root.recover`) makes it writable
again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from pylog.storage.backends.base import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import (
    CorruptCheckpointError,
    LogLockedError,
    StorageError,
    UnknownTopicError,
    os_error_fix,
    os_error_reason,
)
from pylog.storage.faults import Faults
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition import layout
from pylog.storage.partition.checkpoint import Offsets
from pylog.storage.partition.loader import LoadResult, Recovery, load_log
from pylog.storage.partition.log import Log
from pylog.storage.partition.segments import made_segments
from pylog.storage.root.metadata import TopicMetadata, partition_dir, root_step
from pylog.storage.root.publish import STATE_FILE, PublishState, read_state

log = logging.getLogger("pylog.storage")

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
CLEAN_SHUTDOWN_CONTENT = b'{"version":0,"brokerEpoch":-1}'
LOCK_RETRY_SECONDS = 0.02


# ---------------------------------------------------------------------- what every root reads


@dataclass
class RootFiles:
    """What a root reads when it is opened (and again whenever it takes a state it did not
    write itself, on an object store)."""

    start_offsets: Offsets
    meta: TopicMetadata
    state: PublishState


def read_root(storage: Storage) -> RootFiles:
    """Read the root in ``storage`` as a reader does (no lock, nothing written), in order: the
    log start offsets (``log-start-offset-checkpoint``: readers honour them too, as retention
    checkpoints a new start before it renames segments), the topics (``pylog-topics.json``)
    and the high watermarks and queries' batches (``pylog-state.json``)."""
    start_offsets = read_start_offsets(storage)
    meta = TopicMetadata.load(storage)
    state = read_state(storage)
    return RootFiles(start_offsets, meta, state)


def read_start_offsets(storage: Storage) -> Offsets:
    """The log start offsets for readers: retention checkpoints a new start before it renames
    segments, so a reader honouring them never sees retention half done.  A damaged checkpoint
    reads as empty here (a reader goes on; ``pylog verify`` reports it)."""
    with contextlib.suppress(CorruptCheckpointError):
        return ckpt.read_offsets(storage, ckpt.LOG_START_OFFSET)
    return {}


# ---------------------------------------------------------------------- becoming the writer


@dataclass
class WriterStart:
    """What a new writer holds and learns from the root before it opens a log."""

    lock: contextlib.ExitStack
    """The writer lock, held until closed."""
    had_clean_shutdown: bool
    recovery_points: Offsets
    start_offsets: Offsets
    state: PublishState
    """The high watermarks and queries' batches as the writer found them."""


def become_writer(storage: Storage, lock_timeout: float) -> WriterStart:
    """Become the writer of the root in ``storage``, as a Kafka broker starts; the steps, in
    order: take the writer lock (waiting up to ``lock_timeout`` seconds), consume the
    clean-shutdown marker (a crash from then on is an unclean shutdown), read the recovery
    points and the log start offsets, and read the state (``pylog-state.json``) as the writer.

    A damaged checkpoint raises :class:`CorruptCheckpointError`: a writer never guesses.  A step
    that raises releases the lock before the error propagates.  The logs are opened (recovered)
    afterwards, each as first used (:func:`open_log`)."""
    lock = take_lock(storage, lock_timeout)
    with contextlib.ExitStack() as on_failure:
        on_failure.push(lock)  # a step failing releases the lock at once (not at garbage collection)
        had_clean_shutdown = consume_clean_shutdown(storage)
        recovery_points = ckpt.read_offsets(storage, ckpt.RECOVERY_POINT)
        start_offsets = ckpt.read_offsets(storage, ckpt.LOG_START_OFFSET)
        state = read_state(storage)
        on_failure.pop_all()
    return WriterStart(lock, had_clean_shutdown, recovery_points, start_offsets, state)


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


def consume_clean_shutdown(storage: Storage) -> bool:
    """Delete the clean-shutdown marker durably (the lock must be held); True if it was there:
    the last writer closed cleanly, so the logs need no recovery."""
    with root_step(storage, CLEAN_SHUTDOWN, "delete it"):
        had_clean_shutdown = storage.exists(CLEAN_SHUTDOWN)
        storage.delete(CLEAN_SHUTDOWN)  # a crash from here on is an unclean shutdown
    with root_step(storage, "", "fsync the root directory"):
        storage.fsync_dir("")
    return had_clean_shutdown


# ---------------------------------------------------------------------- opening a log


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
        _refuse_start_beyond(directory, log_start_offset, high_watermark)
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
        if lg.damage:
            _refuse_stale(storage, (topic, partition), directory, lg, high_watermark)
        lg.high_watermark = high_watermark
        return lg, None
    _refuse_damage(storage, directory, config, result, high_watermark)
    lg.high_watermark = high_watermark
    _truncate_unacknowledged(storage, directory, result, high_watermark)
    return lg, result.recovery


def _refuse_stale(
    storage: Storage, key: tuple[str, int], directory: str, lg: Log, high_watermark: int | None
) -> None:
    """A reader whose partition's files changed under it since it read the root's state (the
    topic deleted, or deleted and created again): an error saying so, not damage to repair."""
    topic = key[0]
    if not storage.isdir(directory) and topic not in TopicMetadata.load(storage):
        lg.close()
        raise UnknownTopicError(
            f"topic {topic!r} was deleted from {storage.describe()} after this reader read its "
            f"topics ({directory} is gone): open the root again"
        )
    now = read_state(storage).high_watermarks.get(key)
    if now is not None and now != high_watermark and lg.segments[-1].read_next_offset() >= now:
        lg.close()
        raise StorageError(
            f"{directory}: changed since this reader read the root's state (high watermark "
            f"{high_watermark}, now {now}: the topic was deleted and created again, or the "
            "partition repaired): open the root again"
        )


def _refuse_start_beyond(directory: str, log_start_offset: int, high_watermark: int | None) -> None:
    """Before a writer loads a log: a log start beyond its high watermark is damage (loading
    the log would delete every segment)."""
    problems = _start_problems(log_start_offset, high_watermark)
    if problems:
        raise layout.damaged_log_error(directory, problems, writer=True)


def _refuse_damage(
    storage: Storage, directory: str, config: LogConfig, result: LoadResult, high_watermark: int | None
) -> None:
    """After a writer loaded a log: the damage an append depends on (see the module docstring)
    raises :class:`DamagedLogError`, the log's files closed."""
    lg = result.log
    with naming_io_errors(directory, "checking the segments of"):
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


def _truncate_unacknowledged(
    storage: Storage, directory: str, result: LoadResult, high_watermark: int | None
) -> None:
    """Roll back what lies past the high watermark: written by an append or publish that never
    completed, so never visible (reported in the recovery's ``unpublished_bytes``)."""
    lg = result.log
    if high_watermark is not None and lg.log_end_offset > high_watermark:
        with root_step(storage, directory, f"truncate what lies past the high watermark {high_watermark} in"):
            result.recovery.unpublished_bytes = lg.truncate_to(high_watermark)
        log.warning(
            "%s: removed %d unacknowledged bytes past the high watermark %d",
            lg.directory,
            result.recovery.unpublished_bytes,
            high_watermark,
        )


@contextlib.contextmanager
def naming_io_errors(directory: str, doing: str) -> Iterator[None]:
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
