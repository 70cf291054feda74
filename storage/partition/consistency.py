"""Reading a partition beside its writer: the part of :class:`~pylog.storage.partition.log.Log`
that finds the batches a read needs (floor segment, index, scan) and keeps a lock-free reader's
list of segments true to the directory.

Reading beside a writer.  A read-only log (a lock-free reader: Spark tasks, ``pylog consume``)
holds a list of segments taken from a listing of the directory (:mod:`listing`) and opens
their files by name when it reads, while the writer replaces segments (compaction, merges) and
removes them (retention).  A Kafka broker's in-flight fetch keeps the file it has open; a
reader here has only the name, so every conclusion a read draws from the list is checked
against the directory before it is used:

* a read that fails (a file renamed or deleted meanwhile, bytes that do not decode) lists the
  directory again and continues on the new list from the offset it needs; the same files
  failing twice is a real error, and raised;
* a read that finds nothing in a segment and goes on to a later one, or ends, concludes that
  the offsets in between do not exist: it does so only once the files it looked in are still
  there with the sizes they were listed with, else it lists again and reads from the same
  offset (so a listing that went stale before its files were opened, or one taken in the
  middle of a swap, never makes it skip offsets);
* segments that retention removed while the reader needed them are read from their
  ``.deleted`` files, which stay ``file.delete.delay.ms`` (default 60 s); a reader slower than
  that gets an :class:`OffsetOutOfRangeError` naming the delay.

On an object store the reader's files are those of one manifest, which never change.  Objects
that later manifests no longer use (replaced by compaction and merges, removed by retention)
are deleted ``pylog.file_delete_delay_ms`` (60 s) after they were superseded; a read of one
makes the reader move to the newest manifest (:meth:`Storage.refresh_snapshot`) and continue
there the same way.  Compaction and merges never make a read fail or skip an offset, however
long it takes; retention does only when it removed offsets the reader had not read yet and their
delete delay passed, and that is reported as above.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from pylog.storage.backends.base import Storage
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    PylogError,
    StorageError,
    StorageIOError,
)
from pylog.storage.partition import layout, listing
from pylog.storage.partition.segment import LogSegment

RELISTS = 100
"""Listings in a row a read-only read may take because the files changed under it (each time it
makes no progress) before it gives up."""

DELETED = ".deleted"
T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


def _files(segments: list[LogSegment]) -> list[tuple[str, int]]:
    """The ``.log`` files of a list of segments, and their sizes, as listed."""
    return [(s.log_path, s.size) for s in segments]


class ConsistentReads:
    """Mixin of :class:`~pylog.storage.partition.log.Log` (the attributes below are the log's)."""

    storage: Storage
    directory: str
    config: LogConfig
    read_only: bool
    segments: list[LogSegment]
    relistings: int
    _bases: np.ndarray
    _opened_ms: int
    _layout_checked: layout.Checked
    _dense: bool | None

    def offsets_dense(self) -> bool:
        """Whether a batch holds every offset below the active segment (see
        :func:`layout.dense_offsets`; read once): then offsets no segment holds are damage."""
        if self._dense is None:
            self._dense = layout.dense_offsets(self.storage, self.directory, self.config)
        return self._dense

    def read_consistently(self, fn: Callable[[list[LogSegment]], T]) -> T:
        """``fn(segments)``, a read of this log's segments that must see all of them (the
        aborted transactions of a range, say).  For a read-only log it runs again on a fresh
        listing until the segment files did not change under it (see the module docstring)."""
        return self._consistently(fn, check=True)

    def _consistently(self, fn: Callable[[list[LogSegment]], T], *, check: bool = False) -> T:
        """``fn(segments)``; for a read-only log, again on a fresh listing after a failure when
        the files changed, and with ``check``, until a listing taken after it still has the
        same files (what it did not find is then really not there)."""
        if not self.read_only:
            return fn(self.segments)
        last: BaseException | None = None
        failed: list[tuple[str, int]] | None = None
        for _ in range(RELISTS):
            segs = self.segments
            try:
                out = fn(segs)
            except (OSError, PylogError) as e:
                if isinstance(e, OffsetOutOfRangeError) or _files(segs) == failed:
                    raise  # (the same files failed twice: a real failure)
                failed, last = _files(segs), e
                self._relist(refresh=True)
                continue
            if not check or self._still_listed(segs, 0, len(segs)):
                return out
            self._relist()
        raise self._unsettled("reading it") from last

    def _still_listed(self, segs: list[LogSegment], i: int, k: int) -> bool:
        """Whether ``segs[i:k]`` are still the files of the directory for their offsets, so that
        what a read did not find in them is really not there: each ``.log`` is still there with
        the size it was listed with.  The last of ``segs`` may have grown only while it is still
        the active segment (no segment after it): a writer appends to the active segment alone,
        and rewrites a segment (compaction, merges) only once it has rolled.

        That suffices because a writer never gives a new file a name between two existing
        segments: compaction and merges name what replaces a run of segments after the first
        of the run, retention only removes, a roll adds a segment after the last one.  A
        replaced or removed segment is renamed (its file goes) or rewritten (its size changes:
        a rewrite to the same size holds the same batches).  ``.deleted`` segments (see
        :meth:`_relist`) are files of a replaced layout, never renamed again."""
        for s in segs[i:k]:
            if s.suffix == ".deleted":
                continue
            try:
                size = self.storage.size(s.log_path) if self.storage.exists(s.log_path) else -1
            except (OSError, PylogError):
                return False  # gone between the two calls
            if size != s.size and not (s is segs[-1] and size > s.size and self._still_active(s)):
                return False
        return True

    def _still_active(self, seg: LogSegment) -> bool:
        """Whether no segment file follows ``seg`` (so it has not rolled: its file was only
        appended to since it was listed)."""
        names = listing.stable_names(self.storage, self.directory)
        return not any(p[1] == "log" and p[0] > seg.base_offset for n in names if (p := listing.parse(n)))

    def _relist(self, *, refresh: bool = False) -> bool:
        """List the directory again (with ``refresh``, on the storage's newest snapshot, see
        :meth:`Storage.refresh_snapshot`): the segments are the live ones, preceded by the
        ``.deleted`` files of those the current list has below them (removed by retention
        since it was taken; readable until ``file.delete.delay.ms`` passes).  Returns whether
        anything changed: other files, or (with ``refresh``) a newer snapshot."""
        refreshed = self.storage.refresh_snapshot() if refresh else False
        fresh = listing.reader_segments(self.storage, self.directory, self.config)
        first = fresh[0].base_offset if fresh else None
        retired = self._retired(first)
        segments = retired + fresh
        if not segments:
            raise StorageError(
                f"{self.storage.describe()}/{self.directory}: the log has no segment files any more "
                "(was the partition deleted?)"
            )
        changed = refreshed or _files(segments) != _files(self.segments)
        self.segments = segments
        self._bases = np.array([s.base_offset for s in segments], dtype=np.int64)
        self.relistings += 1
        return changed

    def _retired(self, first: int | None) -> list[LogSegment]:
        """The current list's segments below ``first`` (all when None) as their ``.deleted``
        files: those from the last one that is gone on, so that they reach the live ones
        without a hole."""
        out: list[LogSegment] = []
        for s in self.segments:
            if first is not None and s.base_offset >= first:
                break
            try:
                d = s
                if s.suffix != ".deleted":  # the file listed, or a newer one covering more offsets
                    d = LogSegment(self.storage, self.directory, s.base_offset, self.config, suffix=DELETED)
                present = bool(d.size) or self.storage.exists(d.log_path)
            except (OSError, PylogError):  # deleted while it was opened
                present = False
            out = [*out, d] if present else []
        return out

    def _removed(self, offset: int) -> OffsetOutOfRangeError:
        first = self.segments[0].base_offset
        return OffsetOutOfRangeError(
            f"{self.directory}: offsets [{offset}, {first}) were removed by retention while this reader "
            f"read them (it opened the log {now_ms() - self._opened_ms} ms ago); the files of removed "
            f"segments stay readable for file.delete.delay.ms={self.config.file_delete_delay_ms} ms (on an "
            "object store: its objects, for the storage option pylog.file_delete_delay_ms; a writer "
            "opening the root removes them at once): read them within that time, or raise it"
        )

    def _unsettled(self, what: str) -> StorageError:
        return StorageError(
            f"{self.storage.describe()}/{self.directory}: the segment files changed {RELISTS} times in a "
            f"row while {what}; is more than one writer rewriting them?"
        )

    # ------------------------------------------------------------------ reads of the log

    def _read_contradicts_names(
        self, seg: LogSegment, offset: int, rs: records.RecordSet, *, relist: bool
    ) -> bool:
        """Raise :class:`DamagedLogError` when batches read from ``seg`` contradict the segments'
        names (a renamed, copied or overlapping segment, see :mod:`layout`): never fewer rows.
        A read-only log first lists its directory again: True when it changed (read again)."""
        j: int | None = int(np.searchsorted(self._bases, seg.base_offset, side="right")) - 1
        if j is None or not 0 <= j < len(self.segments) or self.segments[j] is not seg:
            j = next((i for i, s in enumerate(self.segments) if s is seg), None)  # (duplicate bases)
        if j is None or seg.suffix == DELETED:
            # (a retired file of a read-only log may be a newer version covering more offsets
            # than the next one, see _retired: overlapping there is expected)
            return False
        try:
            problem = layout.read_problem(
                self.segments,
                j,
                offset,
                rs.batches,
                self._layout_checked,
                gaps=not self.config.compact,
                dense=self.offsets_dense,
            )
        except (OSError, PylogError):
            if not (self.read_only and relist):
                raise
            self._relist(refresh=True)  # a file of the list renamed meanwhile: read again
            return True
        if problem is None:
            return False
        if self.read_only and relist and self._relist(refresh=True):
            return True
        raise layout.damaged_log_error(self.directory, [problem], writer=False)

    def _fetch(
        self, offset: int, end: int | None, max_bytes: int, *, bound_reads: bool
    ) -> tuple[LogSegment, int, memoryview, records.RecordSet | None] | None:
        """The batches from the first one holding an offset >= ``offset`` (below ``end``):
        (segment, position, bytes, decoded record set when ``bound_reads``), None if there is
        none.  ``bound_reads``: read no further than the index says offsets below ``end`` can
        be (a few records of a large segment on an object store cost one small ranged GET).

        For a read-only log, see the module docstring: a failure is retried on a fresh listing
        when the files changed, and a conclusion that offsets do not exist is checked."""
        last: BaseException | None = None
        failed: list[tuple[str, int]] | None = None
        for _ in range(RELISTS):
            segs, bases = self.segments, self._bases
            if self.read_only and offset < segs[0].base_offset:
                # a list taken after retention removed segments the reader still needs: see
                # whether their .deleted files are there
                self._relist()
                if offset < self.segments[0].base_offset:
                    raise self._removed(offset)
                continue
            try:
                i, k, got = self._locate(segs, bases, offset, end, max_bytes, bound_reads)
                rs = None
                if got is not None and bound_reads:
                    pos, data = got
                    rs = _decode_before_damage(data, segs[k].log_path, pos)
            except (OSError, PylogError) as e:
                if not self.read_only or isinstance(e, OffsetOutOfRangeError) or _files(segs) == failed:
                    raise  # (the same files failed twice: a real failure)
                failed, last = _files(segs), e
                self._relist(refresh=True)
                continue
            if not self.read_only or k == i or self._still_listed(segs, i, k):
                if got is None or not got[1] or (rs is not None and len(rs.batches) == 0):
                    return None
                return segs[k], got[0], got[1], rs
            self._relist()
        raise self._unsettled(f"reading offset {offset}") from last

    @staticmethod
    def _locate(
        segs: list[LogSegment],
        bases: np.ndarray,
        offset: int,
        end: int | None,
        max_bytes: int,
        bound_reads: bool,
    ) -> tuple[int, int, tuple[int, memoryview] | None]:
        """(index of the floor segment of ``offset``, index of the segment the batches come from
        (``len(segs)``, or the first one at or above ``end``, when there are none), the batches)."""
        i = max(0, int(np.searchsorted(bases, offset, side="right")) - 1)
        for k in range(i, len(segs)):
            seg = segs[k]
            if end is not None and seg.base_offset >= end:
                return i, k, None
            bound = seg.upper_position(end) if bound_reads and end is not None else None
            try:
                got = seg.read(offset, max_bytes, max_position=bound)
            except StorageIOError as e:  # (an object missing, EIO): say which offsets it holds
                following = segs[k + 1].base_offset if k + 1 < len(segs) else None
                raise _naming_offsets(e, seg.base_offset, following, offset) from e
            if got is not None:
                return i, k, got
        return i, len(segs), None


def _decode_before_damage(data: memoryview, path: str, pos: int) -> records.RecordSet:
    """The batches ``data`` (read at byte ``pos`` of ``path``) decoded; when one that is not the
    first does not decode (a bad CRC, say), those before it: the next read starts at the bad
    batch and raises there, naming the file and byte, so that a reader gets every record that
    precedes damage before the error (rather than the error for the whole chunk)."""
    try:
        return records.decode(data, path=path, base_position=pos)
    except CorruptRecordError as e:
        if e.position is None or e.position <= pos:
            raise
        scan = B.scan_entries(B.as_uint8(data), raise_on_corrupt=False)
        before = scan.position[scan.position <= e.position - pos]
        cut = int(before[-1]) if before.size else 0
        if cut == 0:
            raise
        try:
            return records.decode(data[:cut], path=path, base_position=pos)
        except CorruptRecordError:
            raise e from None


def _naming_offsets(e: StorageIOError, base: int, following: int | None, offset: int) -> StorageIOError:
    """``e`` (a failed read of the segment of offsets from ``base`` below ``following``, None:
    the active segment) saying which offsets the segment holds and which one was read."""
    held = f"[{base}, {following})" if following is not None else f"from {base} (the active segment)"
    doing = f"{e.doing} (the segment of offsets {held}, reading offset {offset})"
    return StorageIOError(e.errno, e.strerror or str(e), str(e.filename), doing)
