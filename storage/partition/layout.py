"""Whether a partition's segments agree with their file names and with each other.

In a healthy log, sorted by base offset (the number in their file names), every segment holds
batches whose offsets are at or above its base offset and below the next segment's base offset.
Compaction removes batches inside segments (and may empty a segment) but keeps this order.
Damage from outside (a segment file renamed, copied or restored from elsewhere) breaks it, and
then reads go wrong quietly: the floor lookup by base offset finds the wrong segment, a renamed
newest segment moves the log end, and an append gives an offset a second value.

* :func:`misnamed_segments` reads the first batch of each ``.log`` of a directory before the log
  is loaded: a segment whose first batch starts below its base offset was renamed or copied
  (recovery would take its valid batches for invalid bytes and truncate them).
* :func:`overlaps` finds consecutive segments whose offsets overlap, in a loaded log.
* :func:`read_problem` checks what a read returned, for free (the headers are at hand); when a
  read finds a gap, it looks once at the previous segment and (:func:`gap_problem`, in logs
  without compaction gaps) at the first batch of the later ones.
* :class:`Damage` is a range of offsets a reader must not read; :func:`damaged_log_error`
  formats the :class:`DamagedLogError` a writer or reader raises.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from pylog.storage.backends.fs import Storage, join
from pylog.storage.codec import batch as B
from pylog.storage.errors import DamagedLogError, StorageError
from pylog.storage.partition.index import naming_os_errors
from pylog.storage.partition.segment import LogSegment

_MIN_ENTRY_LENGTH = (14, 22, 49)  # the smallest size field of a log entry, by magic
_HEADER_READ = 61  # a v2 batch header


@dataclass(frozen=True)
class Damage:
    """Offsets ``[start, end)`` of a partition that cannot be read correctly, and why."""

    start: int
    end: int
    problem: str


def first_offset(storage: Storage, path: str, size: int) -> int | None:
    """The offset of the first entry of the ``.log`` at ``path`` (``size`` bytes) when it is a
    complete entry whose checksum matches, else None (torn or invalid bytes: recovery's concern).
    For a legacy compressed wrapper it is the wrapper's offset, its last inner offset."""
    raw = storage.read(path, 0, min(size, _HEADER_READ))
    if len(raw) < 17:
        return None
    offset = int.from_bytes(raw[0:8], "big", signed=True)
    length = int.from_bytes(raw[8:12], "big", signed=True)
    magic = raw[16]
    if magic > 2 or length < _MIN_ENTRY_LENGTH[magic] or 12 + length > size:
        return None
    data = raw if 12 + length <= len(raw) else storage.read(path, 0, 12 + length)
    if magic == 2:
        ok = B.batch_crc(data, 0, 12 + length) == int.from_bytes(data[17:21], "big")
    else:
        ok = zlib.crc32(data[16 : 12 + length]) == int.from_bytes(data[12:16], "big")
    return offset if ok else None


def segment_logs(storage: Storage, directory: str) -> list[tuple[int, str]]:
    """(base offset, path) of the ``.log`` files of ``directory`` with final names, by base."""
    out = []
    for n in storage.listdir(directory):
        stem, _, ext = n.partition(".")
        if ext == "log" and len(stem) == 20 and stem.isdigit():
            out.append((int(stem), join(directory, n)))
    return sorted(out)


def misnamed_problem(storage: Storage, base: int, path: str, size: int) -> str | None:
    """Why the segment ``path`` (base offset ``base``, ``size`` bytes) is misnamed: its first
    batch starts below its base offset (None: it does not).  One small read; the whole first
    batch is read (to check its checksum) only when it does."""
    if size < 17:
        return None
    with naming_os_errors(path):
        if int.from_bytes(storage.read(path, 0, 8), "big", signed=True) >= base:
            return None  # the usual case
        first = first_offset(storage, path, size)
    if first is None or first >= base:
        return None
    return (
        f"{path}: its first batch starts at offset {first}, below {base}, the base offset its "
        "file name says (the segment was renamed or copied)"
    )


def misnamed_segments(storage: Storage, directory: str) -> list[str]:
    """The segments of ``directory`` whose first batch starts below the base offset of their
    file name (see :func:`misnamed_problem`), before the log is loaded."""
    problems = []
    for base, path in segment_logs(storage, directory):
        with naming_os_errors(path):
            size = storage.size(path)
        problem = misnamed_problem(storage, base, path, size)
        if problem is not None:
            problems.append(problem)
    return problems


def overlap_problem(a: LogSegment, b: LogSegment) -> str | None:
    """Why segment ``a`` overlaps the next one, ``b`` (None: it does not)."""
    end = a.read_next_offset()
    if end > b.base_offset:
        return (
            f"{a.log_path} holds offsets up to {end - 1}, at or above {b.base_offset}, the base offset "
            f"of {b.log_path}: the segments overlap"
        )
    return None


def overlaps(segments: list[LogSegment]) -> list[str]:
    """Consecutive segments (by base offset) whose offsets overlap."""
    found = (overlap_problem(a, b) for a, b in itertools.pairwise(segments))
    return [p for p in found if p is not None]


Checked = set[tuple[str, int]]
"""The checks a reader made already: (kind, id of the segment)."""


def gap_problem(segments: list[LogSegment], offset: int, checked: Checked) -> str | None:
    """A read found no batch at ``offset`` where one was expected (offsets skipped in a log that
    compaction does not touch): whether a segment named above ``offset`` holds offsets below its
    name, so that the floor lookup missed them.  Each segment is read once (one small read)."""
    for seg in segments:
        if seg.base_offset <= offset or ("named", id(seg)) in checked:
            continue
        try:
            problem = misnamed_problem(seg.storage, seg.base_offset, seg.log_path, seg.size)
        except OSError as e:  # (a segment removed meanwhile: the reader lists again)
            raise StorageError(f"{seg.log_path}: cannot read: {e.strerror or e}") from e
        if problem is not None:
            return problem
        checked.add(("named", id(seg)))
    return None


def read_problem(
    segments: list[LogSegment], j: int, offset: int, h: B.BatchHeaders, checked: Checked, *, gaps: bool
) -> str | None:
    """What is wrong with batches ``h`` read from ``segments[j]`` for offsets from ``offset`` on
    (None: nothing found).  A batch below the segment's base offset or at or above the next
    segment's is seen in ``h``.  When the read starts in a gap, the previous segment is checked
    for an overlap, and with ``gaps`` (a log without compaction gaps), the later segments for
    misnaming (see :func:`gap_problem`); each check is made once per segment."""
    seg = segments[j]
    below = h.base_offset < seg.base_offset
    if below.any():
        i = int(below.argmax())
        return (
            f"{seg.log_path}: the batch at byte {int(h.position[i])} starts at offset "
            f"{int(h.base_offset[i])}, below {seg.base_offset}, the base offset its file name says "
            "(the segment was renamed or copied)"
        )
    if j + 1 < len(segments) and int(h.last_offset.max()) >= segments[j + 1].base_offset:
        nxt = segments[j + 1]
        return (
            f"{seg.log_path} holds offset {int(h.last_offset.max())}, at or above {nxt.base_offset}, "
            f"the base offset of {nxt.log_path}: the segments overlap"
        )
    if int(h.base_offset[0]) <= offset:
        return None
    if j > 0 and ("overlap", id(seg)) not in checked:
        problem = overlap_problem(segments[j - 1], seg)
        if problem is not None:
            return problem
        checked.add(("overlap", id(seg)))
    return gap_problem(segments, offset, checked) if gaps else None


def damaged_log_error(directory: str, problems: Iterable[str], *, writer: bool) -> DamagedLogError:
    """The error for a damaged partition: what is wrong, and the way out."""
    found = list(problems)
    what = (
        "a writer appends nothing to it until it is repaired"
        if writer
        else "the offsets concerned cannot be read correctly"
    )
    return DamagedLogError(
        f"{directory} is damaged: {'; '.join(found)}. {what[0].upper()}{what[1:]}. Run `pylog recover` "
        "on the root: it repairs what it can without loss, states what would be lost otherwise, and "
        "loses it only with --accept-data-loss (`pylog verify` lists every problem)",
        directory=directory,
        problems=found,
    )


__all__ = [
    "Damage",
    "damaged_log_error",
    "first_offset",
    "gap_problem",
    "misnamed_problem",
    "misnamed_segments",
    "overlap_problem",
    "overlaps",
    "read_problem",
    "segment_logs",
]
