"""A log's segments as a sequence made from their base offsets, one segment object at a time.

A partition of many segments (Kafka brokers hold 10^4 to 10^5) is opened from the sorted base
offsets of its ``.log`` files alone: :class:`SegmentList` makes the :class:`LogSegment` of an
index when it is first asked for (a read's floor segment, the active one), so opening a log and
appending to it cost the same whatever the number of segments; iterating over all of them
(retention, compaction, ``pylog verify``) makes them all, as a list would hold them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from typing import cast, overload

import numpy as np

from pylog.storage.partition.segment import LogSegment

Make = Callable[[int, int | None], LogSegment]
"""Makes the segment of a base offset, given the next segment's base offset (None: the last)."""


class SegmentList(MutableSequence[LogSegment]):
    """The segments of a log by base offset (ascending), made on first access by ``make``."""

    def __init__(self, bases: Iterable[int], make: Make) -> None:
        self._bases: list[int] = list(bases)
        self._made: dict[int, LogSegment] = {}
        self._make = make

    def __len__(self) -> int:
        return len(self._bases)

    def _at(self, i: int) -> LogSegment:
        base = self._bases[i]
        seg = self._made.get(base)
        if seg is None:
            nxt = self._bases[i + 1] if i + 1 < len(self._bases) else None
            seg = self._made[base] = self._make(base, nxt)
        return seg

    def _index(self, i: int) -> int:
        n = len(self._bases)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"segment index {i} out of range ({n} segments)")
        return j

    @overload
    def __getitem__(self, i: int) -> LogSegment: ...

    @overload
    def __getitem__(self, i: slice) -> list[LogSegment]: ...

    def __getitem__(self, i: int | slice) -> LogSegment | list[LogSegment]:
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self._bases)))]
        return self._at(self._index(i))

    @overload
    def __setitem__(self, i: int, seg: LogSegment) -> None: ...

    @overload
    def __setitem__(self, i: slice, seg: Iterable[LogSegment]) -> None: ...

    def __setitem__(self, i: int | slice, seg: LogSegment | Iterable[LogSegment]) -> None:
        if isinstance(i, slice) or not isinstance(seg, LogSegment):
            raise TypeError("a SegmentList replaces one segment at a time")
        j = self._index(i)
        self._made.pop(self._bases[j], None)
        self._bases[j] = seg.base_offset
        self._made[seg.base_offset] = seg

    @overload
    def __delitem__(self, i: int) -> None: ...

    @overload
    def __delitem__(self, i: slice) -> None: ...

    def __delitem__(self, i: int | slice) -> None:
        js = range(*i.indices(len(self._bases))) if isinstance(i, slice) else [self._index(i)]
        for j in sorted(js, reverse=True):
            self._made.pop(self._bases[j], None)
            del self._bases[j]

    def insert(self, i: int, seg: LogSegment) -> None:
        self._bases.insert(i, seg.base_offset)
        self._made[seg.base_offset] = seg

    def __iter__(self) -> Iterator[LogSegment]:
        for i in range(len(self._bases)):
            yield self._at(i)

    def __reversed__(self) -> Iterator[LogSegment]:
        for i in range(len(self._bases) - 1, -1, -1):
            yield self._at(i)

    def index(self, seg: object, start: int = 0, stop: int | None = None) -> int:
        """Where ``seg`` (this very object) is; no other segment is made."""
        if isinstance(seg, LogSegment):
            j = bisect.bisect_left(self._bases, seg.base_offset)
            hi = len(self._bases) if stop is None else stop
            if start <= j < hi and j < len(self._bases) and self._made.get(self._bases[j]) is seg:
                return j
        raise ValueError(f"{seg!r} is not in the list")

    def __contains__(self, seg: object) -> bool:
        try:
            self.index(seg)
        except ValueError:
            return False
        return True

    def remove(self, seg: LogSegment) -> None:
        del self[self.index(seg)]

    def bases(self) -> np.ndarray:
        return np.array(self._bases, dtype=np.int64)

    def made(self) -> list[LogSegment]:
        """The segments made so far (the ones whose files may be open), by base offset."""
        return [self._made[b] for b in sorted(self._made)]

    # the list operations a MutableSequence lacks, as a list has them (new lists)

    def __add__(self, other: Iterable[LogSegment]) -> list[LogSegment]:
        return [*self, *other]

    def __radd__(self, other: Iterable[LogSegment]) -> list[LogSegment]:
        return [*other, *self]

    def copy(self) -> list[LogSegment]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentList | list):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SegmentList({len(self._bases)} segments, {len(self._made)} made)"


def as_list(segments: MutableSequence[LogSegment]) -> list[LogSegment]:
    """``segments`` as the ``list`` :class:`~pylog.storage.partition.log.Log` holds: a
    :class:`SegmentList` has every list operation the code base uses on a log's segments (and
    makes the segments as they are used), so it stands for one."""
    return segments if isinstance(segments, list) else cast(list[LogSegment], segments)


def base_offsets(segments: Sequence[LogSegment]) -> np.ndarray:
    """The base offsets of ``segments`` (of a :class:`SegmentList`: without making any)."""
    if isinstance(segments, SegmentList):
        return segments.bases()
    return np.array([s.base_offset for s in segments], dtype=np.int64)


def made_segments(segments: Sequence[LogSegment]) -> list[LogSegment]:
    """The segments of ``segments`` that exist as objects (of a :class:`SegmentList`: the
    ones made so far): those whose files may be open."""
    return segments.made() if isinstance(segments, SegmentList) else list(segments)


__all__ = ["SegmentList", "as_list", "base_offsets", "made_segments"]
