"""What a writer's loader checks of a segment before trusting it (Kafka's recovery decides
the same things): index files that are missing, indexes that fail their sanity checks or whose
last entry points at no batch, and a tail that is not whole valid batches.

Each returns what is wrong, naming the file and byte, for the loader to rebuild or recover;
reading a segment never needs them (readers check what they use as they go, see
:mod:`segment`).
"""

from __future__ import annotations

import numpy as np

from pylog.storage.errors import CorruptIndexError, CorruptRecordError
from pylog.storage.partition.index import naming_os_errors
from pylog.storage.partition.segment import MAX_OFFSET, LogSegment

_MIN_BATCH_LENGTH = (14, 22, 49)  # smallest size field of an entry, by magic (header after it)
_BATCH_PREFIX = 27  # bytes of a v2 header up to and including lastOffsetDelta


def missing_indexes(seg: LogSegment) -> list[str]:
    """The index files a writer must rebuild because they are missing: the offset index
    (as Kafka), and the time index of a non-empty segment (its largest timestamp)."""
    need = [seg.offset_index, seg.time_index] if seg.size else [seg.offset_index]
    return [idx.path for idx in need if not idx.exists()]


def index_problems(seg: LogSegment, *, read_log: bool = True) -> list[str]:
    """Every index loaded and sanity-checked: the damage found (empty: none).  With
    ``read_log``, the last offset-index entry is also checked against the ``.log`` (one
    read: an index page that reached the disk before the log bytes it describes, which
    only a segment past the last flush can have: the active one)."""
    problems = []
    for idx in (seg.offset_index, seg.time_index, seg.txn_index):
        len(idx)  # load it: the validator runs
        if idx.rejected is not None:
            problems.append(str(idx.rejected))
            continue
        try:
            idx.sanity_check(
                log_size=seg.size if idx is seg.offset_index else None,
                end_offset=seg.next_base_offset,
            )
        except CorruptIndexError as e:
            problems.append(str(e))
            continue
        if read_log and idx is seg.offset_index and len(idx):
            last_offset, last_position = idx.lookup(MAX_OFFSET)
            problem = _batch_problem(seg, last_position, last_offset)
            if problem is not None:
                problems.append(f"{idx.path}: last entry (offset {last_offset}): {problem}")
    return problems


def tail_problem(seg: LogSegment) -> str | None:
    """Whether the end of the segment is valid, cheaply: the batches from the last
    offset-index entry on pass :meth:`LogSegment.invalid_batches` and the last one ends exactly at the
    end of the file.  Returns what is wrong (naming the byte), or None."""
    if seg.size == 0:
        return None
    valid_end: int | None = None
    prev_last = seg.base_offset - 1
    try:
        for loc in seg.batches_for(MAX_OFFSET):
            h = loc.headers
            if valid_end is None:
                valid_end = int(h.position[0])
            bad = seg.invalid_batches(loc, prev_last)
            if bad.any():
                i = int(np.argmax(bad))
                return (
                    f"{seg.log_path}: invalid batch at byte {int(h.position[i])} (bad CRC or "
                    f"offsets {int(h.base_offset[i])}..{int(h.last_offset[i])} out of order)"
                )
            valid_end, prev_last = int(h.position[-1] + h.size[-1]), int(h.last_offset[-1])
    except CorruptRecordError as e:
        return f"{seg.log_path}: byte {e.position}: {e.reason}"
    valid_end = valid_end or 0
    if valid_end != seg.size:
        return (
            f"{seg.log_path}: {seg.size - valid_end} bytes at byte {valid_end} are not a "
            f"complete batch (the file ends at byte {seg.size})"
        )
    return None


def _batch_problem(seg: LogSegment, position: int, offset: int) -> str | None:
    """Why no batch whose offsets end at or below ``offset`` starts at ``position`` (None:
    one does; it may be cut short, which is the ``.log``'s damage, not the index's).  Reads
    the 27 bytes of its header up to its lastOffsetDelta."""
    with naming_os_errors(seg.log_path):
        raw = seg.storage.read(seg.log_path, position, min(seg.size, position + _BATCH_PREFIX))
    if len(raw) < 17:
        return f"fewer than the 17 bytes of a batch header at byte {position} of {seg.size}"
    first = int.from_bytes(raw[0:8], "big", signed=True)
    length = int.from_bytes(raw[8:12], "big", signed=True)
    magic = raw[16]
    if magic > 2 or length < _MIN_BATCH_LENGTH[magic]:
        return f"no batch starts at byte {position} (magic {magic}, size field {length})"
    last = first  # a legacy entry's offset is its last offset
    if magic == 2:
        if len(raw) < _BATCH_PREFIX:
            return f"the batch header at byte {position} is cut short"
        last = first + int.from_bytes(raw[23:27], "big", signed=True)
    if not seg.base_offset <= first <= last <= offset:
        return f"the batch at byte {position} holds offsets {first}..{last}, not ending at or below {offset}"
    return None


__all__ = ["index_problems", "missing_indexes", "tail_problem"]
