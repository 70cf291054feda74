"""Becoming the writer of a root, recovering its logs, and leaving them ready for the next one.

    <root>/.lock                             writer lock (one writer process at a time)
    <root>/.kafka_cleanshutdown              present only after a clean close
    <root>/recovery-point-offset-checkpoint  <root>/log-start-offset-checkpoint

As a Kafka broker at start: the writer takes the lock, consumes the clean-shutdown marker (a
crash from then on is an unclean shutdown) and reads the checkpoints; each log it opens is
recovered from its recovery point unless the last shutdown was clean, and truncated back to
its high watermark (bytes past it were written by an append or publish that never completed).
On close it writes the checkpoints, then the marker.  Readers take no lock and recover nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pylog.storage.backends.fs import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptCheckpointError, LogLockedError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.loader import Recovery, load_log
from pylog.storage.partition.log import Log
from pylog.storage.root.metadata import partition_dir

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
    had_clean_shutdown = storage.exists(CLEAN_SHUTDOWN)
    storage.delete(CLEAN_SHUTDOWN)  # a crash from here on is an unclean shutdown
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
) -> tuple[Log, Recovery | None]:
    """The log of one partition, limited to ``high_watermark`` (None: up to its end).

    A reader (``writer`` False) opens it read-only as it is.  The writer recovers it, and
    truncates what lies past the high watermark; it gets the :class:`Recovery` report too.
    ``step_hook`` sees the named steps of the log's changes (crash-point tests)."""
    result = load_log(
        storage,
        partition_dir(topic, partition),
        config,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
        had_clean_shutdown=had_clean_shutdown or not writer,
        read_only=not writer,
    )
    lg = result.log
    lg.high_watermark = high_watermark
    lg.step_hook = step_hook
    if not writer:
        return lg, None
    if high_watermark is not None and lg.log_end_offset > high_watermark:
        # written by a publish that never completed: never visible, so roll it back
        result.recovery.unpublished_bytes = lg.truncate_to(high_watermark)
        log.warning(
            "%s: removed %d unacknowledged bytes past the high watermark %d",
            lg.directory,
            result.recovery.unpublished_bytes,
            high_watermark,
        )
    return lg, result.recovery


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
    storage.write_atomic(CLEAN_SHUTDOWN, CLEAN_SHUTDOWN_CONTENT)
