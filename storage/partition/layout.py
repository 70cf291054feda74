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
* :func:`overlaps` finds consecutive segments whose offsets overlap, in a loaded log, and
  :func:`holes` those where one ends below the next one's base offset: offsets no segment holds.
  In a log whose offsets are dense (:func:`dense_offsets`: compaction never touched it) that is
  damage (a segment cut short, mid-batch or not, or removed); compaction leaves such gaps.
* :func:`read_problem` checks what a read returned, for free (the headers are at hand); when a
  read finds a gap, it looks once at the previous segment and (:func:`gap_problem`, in logs
  without compaction gaps) at the first batch of the later ones, and whether the segment the
  gap is in ends below the next one (:func:`hole_problem`, in logs with dense offsets).
* :class:`Damage` is a range of offsets a reader must not read; :func:`damaged_log_error`
  formats the :class:`DamagedLogError` a writer or reader raises.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pylog.storage.backends.base import Storage, join
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptCheckpointError, CorruptRecordError, DamagedLogError, StorageError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.index import naming_os_errors
from pylog.storage.partition.segment import MAX_OFFSET, LogSegment

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


def misnamed_problems(segments: Iterable[LogSegment]) -> list[str]:
    """The ones of ``segments`` whose first batch starts below their base offset (see
    :func:`misnamed_problem`)."""
    found = (misnamed_problem(s.storage, s.base_offset, s.log_path, s.size) for s in segments)
    return [p for p in found if p is not None]


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


def dense_offsets(storage: Storage, directory: str, config: LogConfig) -> bool:
    """Whether every offset of the partition in ``directory`` below its active segment must be
    held by a batch: its topic is not compacted (``cleanup.policy`` without ``compact``) and never
    was (no ``cleaner-offset-checkpoint`` entry for it: a topic whose policy changed to ``delete``
    keeps the gaps compaction left).  A checkpoint that cannot be read counts as an entry (gaps
    are not called damage on a guess; ``pylog verify`` reports the checkpoint)."""
    if config.compact:
        return False
    topic, _, partition = directory.rstrip("/").rpartition("/")[2].rpartition("-")
    try:
        cleaned = ckpt.read_offsets(storage, ckpt.CLEANER_OFFSET)
    except (CorruptCheckpointError, StorageError):
        return False
    return not (partition.isdigit() and (topic, int(partition)) in cleaned)


def _complete_end(seg: LogSegment) -> int:
    """The byte after the last complete batch of ``seg`` (from its last index entry on)."""
    end = 0
    with contextlib.suppress(CorruptRecordError):
        for loc in seg.batches_for(MAX_OFFSET):
            end = int(loc.headers.position[-1] + loc.headers.size[-1])
    return end


def hole_problem(a: LogSegment, b: LogSegment) -> str | None:
    """Why segment ``a`` ends below ``b``'s base offset, ``b`` being the next segment: the offsets
    in between are held by no segment (None: ``a`` reaches ``b``).  Damage where offsets are
    dense (see :func:`dense_offsets`); the message says whether ``a`` ends with bytes that are
    not a complete batch (it was cut short mid-batch)."""
    end = a.read_next_offset()
    if end >= b.base_offset:
        return None
    valid = _complete_end(a) if a.size else 0
    how = (
        f"its last {a.size - valid} bytes, from byte {valid}, are not a complete batch: it was cut short"
        if valid < a.size
        else "a segment cut short or removed"
    )
    return (
        f"{a.log_path} ends at offset {end} and {b.log_path} starts at {b.base_offset}: offsets "
        f"{end}..{b.base_offset - 1} are held by no segment ({how})"
    )


def holes(segments: list[LogSegment], below: int | None = None) -> list[str]:
    """Consecutive segments (by base offset) where the first ends below the next one's base
    offset (see :func:`hole_problem`), and below ``below`` (the high watermark: what lies at or
    above it was never acknowledged, and a writer truncates it)."""
    found = []
    for a, b in itertools.pairwise(segments):
        if below is not None and a.read_next_offset() >= below:
            break
        found.append(hole_problem(a, b))
    return [p for p in found if p is not None]


Checked = set[tuple[str, int]]
"""The checks a reader made already: (kind, id of the segment)."""


def hole_at(segments: list[LogSegment], i: int, checked: Checked, dense: Callable[[], bool]) -> str | None:
    """A read found no batch at or after an offset in ``segments[i]``, the segment it falls in,
    and went on to a later one (or ended): whether ``segments[i]`` ends below the next one's base
    offset (:func:`hole_problem`) in a log whose offsets are ``dense()``.  Each segment is checked
    once; retired (``.deleted``) files of a reader are not (they may be newer versions covering
    more offsets)."""
    if not 0 <= i < len(segments) - 1 or ("hole", id(segments[i])) in checked:
        return None
    a, b = segments[i], segments[i + 1]
    if ".deleted" in (a.suffix, b.suffix):
        return None
    try:
        problem = hole_problem(a, b)
    except OSError as e:  # (a segment removed meanwhile: the reader lists again)
        raise StorageError(f"{a.log_path}: cannot read: {e.strerror or e}") from e
    if problem is not None and dense():
        return problem
    checked.add(("hole", id(a)))
    return None


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
    segments: list[LogSegment],
    j: int,
    offset: int,
    h: B.BatchHeaders,
    checked: Checked,
    *,
    gaps: bool,
    dense: Callable[[], bool] | None = None,
) -> str | None:
    """What is wrong with batches ``h`` read from ``segments[j]`` for offsets from ``offset`` on
    (None: nothing found).  A batch below the segment's base offset or at or above the next
    segment's is seen in ``h``.  When the read starts in a gap, the previous segment is checked
    for an overlap, and with ``gaps`` (a log without compaction gaps), the later segments for
    misnaming (see :func:`gap_problem`); each check is made once per segment.  When the gap lies
    between segments (``segments[j]`` starts above ``offset``), and ``dense()`` says the log's
    offsets are dense, the segment ``offset`` falls in ending below the next one is damage too
    (see :func:`hole_at`)."""
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
    problem = gap_problem(segments, offset, checked) if gaps else None
    if problem is None and seg.base_offset > offset:
        within = [k for k in range(j) if segments[k].base_offset <= offset]  # (none: below the log)
        if within and gaps and dense is not None:
            problem = hole_at(segments, within[-1], checked, dense)
        if problem is None and within:
            problem = torn_end_at(segments, within[-1], checked)
    return problem


def torn_end_at(segments: list[LogSegment], i: int, checked: Checked) -> str | None:
    """A read found no batch at or after an offset in ``segments[i]`` and went on to a later
    segment: whether ``segments[i]``, a sealed segment, ends with bytes that are not a complete
    batch (cut short mid-batch).  That is damage whatever the cleanup policy (a writer rolls a
    segment only after its last batch is whole; compaction leaves gaps of offsets, never torn
    batches).  Each segment is checked once; retired (``.deleted``) files are not."""
    if not 0 <= i < len(segments) - 1 or ("torn", id(segments[i])) in checked:
        return None
    a = segments[i]
    if ".deleted" in (a.suffix, segments[i + 1].suffix):
        return None
    try:
        size = a.size
        valid = _complete_end(a) if size else 0
    except OSError as e:  # (a segment removed meanwhile: the reader lists again)
        raise StorageError(f"{a.log_path}: cannot read: {e.strerror or e}") from e
    if valid < size:
        return (
            f"{a.log_path}: its last {size - valid} bytes, from byte {valid}, are not a complete "
            f"batch (the sealed segment was cut short; offsets from {a.read_next_offset()} up to "
            f"{segments[i + 1].base_offset - 1} may have been lost)"
        )
    checked.add(("torn", id(a)))
    return None


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
    "dense_offsets",
    "first_offset",
    "gap_problem",
    "hole_at",
    "hole_problem",
    "holes",
    "misnamed_problem",
    "misnamed_segments",
    "overlap_problem",
    "overlaps",
    "read_problem",
    "segment_logs",
    "torn_end_at",
]
