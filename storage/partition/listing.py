"""A lock-free reader's list of a partition's segments, taken while a writer may change them.

A writer replaces segments (compaction, merges: ``.cleaned`` → ``.swap``, old → ``.deleted``,
``.swap`` → final) and removes them (retention: → ``.deleted``, physically deleted
``file.delete.delay.ms`` later) while readers without the lock read.  A reader lists the
directory and opens the files by name afterwards, so what it lists may have changed by the time
it reads.  This module builds the list; :class:`~pylog.storage.partition.log.Log` checks it
against the directory whenever a read depends on it (see its "reading beside a writer"), and
builds it again when it changed.

* :func:`reader_segments` lists the directory: the final ``.log`` files, with the ``.swap``
  segments a writer's recovery would complete in place of those they replace (a listing taken
  in the middle of a replacement sees the state before or after it, never the hole between).
  A listed file that is gone by the time it is opened means the listing is already stale: the
  directory is listed again (a missing file would otherwise pass for an empty segment, and its
  offsets would be skipped silently).  So it is when a second listing, after the files were
  opened, differs from the first: one listing of a large directory (many ``.deleted`` files
  waiting for ``file.delete.delay.ms``) takes several system calls, and may miss a file that
  is renamed meanwhile (:func:`stable_names`).  The list is then complete as of one instant.
"""

from __future__ import annotations

import errno
import re
import time

from pylog.storage.backends.base import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import PylogError, StorageError, StorageIOError
from pylog.storage.partition.segment import LogSegment

_NAME = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex|snapshot)((?:\.cleaned|\.swap|\.deleted)?)$")
_ATTEMPTS = 50
"""Listings in a row that change while they are opened before a reader gives up."""


def parse(name: str) -> tuple[int, str, str] | None:
    """(base offset, kind, suffix) of a segment file name (``00000000000000000042.log.swap``:
    ``(42, "log", ".swap")``); None for any other name."""
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None


def _pending_swaps(parsed: list[tuple[int, str, str]]) -> list[int]:
    """Base offsets of the ``.swap`` segments a writer's recovery would complete: those below
    the smallest ``.cleaned`` base offset (the others belong to a replacement that is rolled back)."""
    cleaned = [base for base, _, suffix in parsed if suffix == ".cleaned"]
    min_cleaned = min(cleaned) if cleaned else None
    return sorted(
        base
        for base, kind, suffix in parsed
        if suffix == ".swap" and kind == "log" and (min_cleaned is None or base < min_cleaned)
    )


def _segments(storage: Storage, directory: str, config: LogConfig, names: list[str]) -> list[LogSegment]:
    parsed = [p for n in names if (p := parse(n))]
    logs = sorted(base for base, kind, suffix in parsed if kind == "log" and not suffix)
    nexts: list[int | None] = [*logs[1:], None] if logs else []
    segments = [
        LogSegment(storage, directory, b, config, next_base_offset=n)
        for b, n in zip(logs, nexts, strict=True)
    ]
    swaps = _pending_swaps(parsed)
    if not swaps:
        return segments
    swapped = [LogSegment(storage, directory, b, config, suffix=".swap") for b in swaps]
    lo = swapped[0].base_offset
    hi = max(s.read_next_offset() for s in swapped)
    # a swap emptied by compaction ends at its base: the segment of the same name is replaced too
    kept = [s for s in segments if not (lo <= s.base_offset < hi or s.base_offset in swaps)]
    return sorted(kept + swapped, key=lambda s: s.base_offset)


def _log_files(names: list[str]) -> list[str]:
    """The ``.log`` files among ``names``, whatever their suffix."""
    return [n for n in names if (p := parse(n)) and p[1] == "log"]


def stable_names(storage: Storage, directory: str) -> list[str]:
    """The names in ``directory`` from two listings in a row that agree on its ``.log`` files.
    One listing of a large directory takes several system calls, and a file renamed meanwhile
    may be in it under both names or under neither (POSIX leaves it unspecified): a segment
    that was being replaced would be missing, and its offsets would look absent."""
    names = storage.listdir(directory)
    for _ in range(_ATTEMPTS):
        again = storage.listdir(directory)
        if _log_files(again) == _log_files(names):
            return again
        names = again
    raise StorageError(
        f"{storage.describe()}/{directory}: the segment files changed between each of {_ATTEMPTS} "
        "listings in a row; is more than one writer changing them?"
    )


def _opened(storage: Storage, segments: list[LogSegment]) -> bool:
    """Whether every segment's ``.log`` was there when it was opened (an empty one is checked:
    a missing file reads as an empty segment), and the end of the last one could be read."""
    if not all(s.size or storage.exists(s.log_path) for s in segments):
        return False
    if segments:
        segments[-1].read_next_offset()  # the log end offset, read now while the list is fresh
    return True


def first_base_offset(storage: Storage, directory: str) -> int | None:
    """The base offset of the first segment a reader of ``directory`` would see (see
    :func:`reader_segments`: a final ``.log`` or a ``.swap`` a writer's recovery would
    complete), from the names alone: no file is opened.  None when there is none."""
    parsed = [p for n in stable_names(storage, directory) if (p := parse(n))]
    bases = [base for base, kind, suffix in parsed if kind == "log" and not suffix]
    bases += _pending_swaps(parsed)
    return min(bases) if bases else None


def reader_segments(storage: Storage, directory: str, config: LogConfig) -> list[LogSegment]:
    """The segments of ``directory`` as a reader sees them (see the module docstring); [] when
    the directory holds none."""
    failure: BaseException | None = None
    names = storage.listdir(directory)
    for _ in range(_ATTEMPTS):
        try:
            segments = _segments(storage, directory, config, names)
            if _opened(storage, segments):
                again = storage.listdir(directory)
                if _log_files(again) == _log_files(names):
                    return segments
                names = again  # the files changed meanwhile: the listing may be torn
                continue
        except StorageIOError as e:  # not a race: EIO, EACCES, a directory named like a segment
            if e.errno != errno.ENOENT:
                raise
            failure = e
        except (OSError, PylogError) as e:  # a file renamed between the listing and its opening
            failure = e
        time.sleep(0.001)  # a replacement is being renamed into place
        names = storage.listdir(directory)
    raise StorageError(
        f"{storage.describe()}/{directory}: the segment files changed each of the {_ATTEMPTS} times "
        "they were listed and opened; is more than one writer changing them?"
    ) from failure


__all__ = ["first_base_offset", "parse", "reader_segments", "stable_names"]
