"""One log segment: ``%020d.log`` with its ``.index``, ``.timeindex`` and ``.txnindex``.

Kafka's ``LogSegment``.  The ``.log`` file is record batches end to end, nothing else.  The
sparse indexes get an entry *per batch* whenever more than ``index.interval.bytes`` were
written since the last entry, exactly as Kafka's recovery rebuilds them, so that
``kafka-dump-log.sh --verify-index-only`` (and ``pylog dump``) find no mismatch:

    offset index entry  (lastOffset of the batch, position of the batch)
    time index entry    (max timestamp so far, lastOffset of the batch holding it)

Files always hold exactly their entries (no preallocation), which is what Kafka requires of
inactive segments and accepts for the active one.

Damaged indexes are never trusted to skip rows: every index is checked (vectorized, no I/O)
when it is loaded (see :mod:`index`), and each index-guided scan checks that the entry it
starts from points at a batch starting at or below the entry's offset.  An index failing
either is ignored: the segment is scanned from its start.  A writer's loader also checks that
the last offset-index entry points at a batch (:mod:`segment_checks`) and rebuilds
an index failing any check: the active segment's at the load, a sealed one's when its indexes
are first used (``first_use_check``).  The size of the ``.log`` and the index objects are made
when first needed, so a segment nobody uses costs no I/O.

I/O errors raise ``OSError`` naming the file (see :func:`index.naming_os_errors`), and a
write that stores fewer bytes than asked is one (``ENOSPC``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pylog.storage.backends.base import AppendFile, Storage, join
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.errors import (
    CorruptRecordError,
    InvalidOffsetError,
    PylogError,
    StorageIOError,
)
from pylog.storage.partition.index import OffsetIndex, TimeIndex, check_written, naming_os_errors
from pylog.storage.partition.txnindex import TxnIndex

log = logging.getLogger("pylog.storage")

READ_CHUNK = 8 << 20
INT32_MAX = 2**31 - 1
MAX_OFFSET = 2**63 - 1


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass
class Located:
    """Batches found in a segment: absolute file positions and parsed headers."""

    data: np.ndarray  # the bytes read, starting at file position ``start``
    start: int
    headers: B.BatchHeaders  # positions are absolute file positions


class LogSegment:
    """A segment of one partition's log, in directory ``directory`` of ``storage``."""

    def __init__(
        self,
        storage: Storage,
        directory: str,
        base_offset: int,
        config: LogConfig,
        *,
        suffix: str = "",
        created_ms: int = 0,
        next_base_offset: int | None = None,
        stem: str | None = None,
    ):
        self.storage = storage
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.suffix = suffix
        self.created_ms = created_ms
        # ``stem``: a file name other than the base offset's (a staged segment, see :mod:`staging`)
        self._stem = join(directory, stem or segment_name(base_offset))
        self.log_path = f"{self._stem}.log{suffix}"
        self.next_base_offset = next_base_offset
        """Base offset of the next segment, when known: the indexes hold no offset at or above it."""
        # the size and the index objects are made when first needed: a log of many segments
        # costs nothing per segment it does not use (Kafka's lazy indexes)
        self._size_now: int | None = None
        self._indexes: tuple[OffsetIndex, TimeIndex, TxnIndex] | None = None
        self.first_use_check: Callable[[], None] | None = None
        """Run once, before the indexes are first used (set by a writer's loader on sealed
        segments: their sanity checks, deferred from the load to the first use)."""
        self.rebuilt_indexes: list[str] = []
        """What that check found wrong with the indexes it then rebuilt (empty: nothing)."""
        self._index_trusted = True  # False once an index-guided scan found a wrong entry
        self._file: AppendFile | None = None
        self.bytes_since_last_index_entry = 0
        self._max_ts: list[int] | None = None  # [timestamp, offset]; from the time index when asked
        self.rolling_based_timestamp: int | None = None
        self._next_offset: int | None = None

    @property
    def _size(self) -> int:
        """The ``.log``'s size: read from the file when first asked, then kept up to date."""
        if self._size_now is None:
            self._size_now = self.read_size()
        return self._size_now

    @_size.setter
    def _size(self, value: int) -> None:
        self._size_now = value

    def _index_files(self) -> tuple[OffsetIndex, TimeIndex, TxnIndex]:
        """The index objects (made on the first call; no file is read until an entry is)."""
        if self._indexes is None:
            stem, suffix, cfg = self._stem, self.suffix, self.config
            oi = OffsetIndex(
                self.storage,
                f"{stem}.index{suffix}",
                self.base_offset,
                max_index_bytes=cfg.segment_index_bytes,
            )
            ti = TimeIndex(
                self.storage,
                f"{stem}.timeindex{suffix}",
                self.base_offset,
                max_index_bytes=cfg.segment_index_bytes,
            )
            oi.validator = self._validate_offset_index
            ti.validator = self._validate_time_index
            self._indexes = (oi, ti, TxnIndex(self.storage, f"{stem}.txnindex{suffix}", self.base_offset))
        return self._indexes

    def _used_index_files(self) -> tuple[OffsetIndex, TimeIndex, TxnIndex]:
        check = self.first_use_check
        if check is not None:
            self.first_use_check = None
            try:
                check()
            except BaseException:
                self.first_use_check = check  # (an I/O error: checked again at the next use)
                raise
        return self._index_files()

    @property
    def offset_index(self) -> OffsetIndex:
        return self._used_index_files()[0]

    @property
    def time_index(self) -> TimeIndex:
        return self._used_index_files()[1]

    @property
    def txn_index(self) -> TxnIndex:
        return self._used_index_files()[2]

    # ------------------------------------------------------------------ basics

    def _max(self) -> list[int]:
        """The largest timestamp so far and its offset, from the time index's last entry when
        first asked (opening a log then reads no index of a segment nobody looks up)."""
        if self._max_ts is None:
            ts, off = self.time_index.last_entry
            if self.time_index.rejected is not None:  # a damaged time index: read the batches
                ts, off = self._read_largest_timestamp()
            self._max_ts = [ts, off]
        return self._max_ts

    @property
    def max_timestamp_so_far(self) -> int:
        return self._max()[0]

    @max_timestamp_so_far.setter
    def max_timestamp_so_far(self, value: int) -> None:
        self._max()[0] = value

    @property
    def offset_of_max_timestamp(self) -> int:
        return self._max()[1]

    @offset_of_max_timestamp.setter
    def offset_of_max_timestamp(self, value: int) -> None:
        self._max()[1] = value

    @property
    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path!r}, size={self._size})"

    def open_for_append(self, *, direct: bool = False) -> None:
        """Open the ``.log`` for appending, creating it and its (empty) indexes as Kafka does.
        ``direct``: written around the page cache (a staged segment, see :mod:`staging`)."""
        if self._file is None:
            with naming_os_errors(self.log_path):
                self._file = self.storage.open_append(self.log_path, direct=direct)
            self._size = self._file.size()
            self.offset_index.create()
            self.time_index.create()
            if self._size and self.bytes_since_last_index_entry == 0:
                # a reopened segment continues Kafka's per-batch rule: the bytes written since
                # the last indexed batch (or since the start, with no entry yet)
                _, positions = self.offset_index.entries()
                self.bytes_since_last_index_entry = self._size - (int(positions[-1]) if len(positions) else 0)

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    # ------------------------------------------------------------------ append

    def append(self, data: np.ndarray | bytes | memoryview, headers: B.BatchHeaders) -> None:
        """Append whole batches (``headers`` positions relative to ``data``) at the end."""
        if len(headers) == 0:
            return
        last = int(headers.last_offset[-1])
        if not self.can_convert_to_relative_offset(
            int(headers.base_offset[0])
        ) or not self.can_convert_to_relative_offset(last):
            raise InvalidOffsetError(
                f"{self.log_path}: offsets {int(headers.base_offset[0])}..{last} do not fit the 32-bit "
                f"relative offsets of a segment based at {self.base_offset}"
            )
        self.open_for_append()
        assert self._file is not None
        start = self._size
        view = memoryview(data if not isinstance(data, np.ndarray) else data.data).cast("B")
        with naming_os_errors(self.log_path):
            check_written(self.log_path, self._file.write(view), view.nbytes)
        if self.rolling_based_timestamp is None and self._size == 0:
            self.rolling_based_timestamp = int(headers.max_timestamp[0])
        self._size += int(headers.size.sum())
        self._index_batches(start + headers.position - int(headers.position[0]), headers)
        self._next_offset = last + 1

    def _index_batches(self, positions: np.ndarray, h: B.BatchHeaders) -> None:
        interval = self.config.index_interval_bytes
        last_off = h.last_offset
        # an empty batch (kept by the cleaner) has no record at its max timestamp: it stays out of
        # the time index, whose entries kafka-dump-log --verify-index-only checks against records
        max_ts = np.where(h.records_count > 0, h.max_timestamp, -1)
        for i in range(len(h)):  # one step per batch (Kafka's per-batch recovery rule)
            mts = int(max_ts[i])
            if mts > self.max_timestamp_so_far:
                self.max_timestamp_so_far = mts
                self.offset_of_max_timestamp = int(last_off[i])
            if self.bytes_since_last_index_entry > interval:
                self.offset_index.append(int(last_off[i]), int(positions[i]))
                self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp)
                self.bytes_since_last_index_entry = 0
            self.bytes_since_last_index_entry += int(h.size[i])

    def indexes_full(self) -> bool:
        return self.offset_index.is_full() or self.time_index.is_full()

    # ------------------------------------------------------------------ reading

    def iter_batches(
        self, start_position: int = 0, *, end_position: int | None = None, chunk: int = READ_CHUNK
    ) -> Iterator[Located]:
        """Complete batches from ``start_position``, read in chunks of about ``chunk`` bytes.

        A torn tail (incomplete last batch) ends the iteration quietly, as Kafka's
        ``FileLogInputStream`` does; a declared size below the minimum raises."""
        end = self._size if end_position is None else min(end_position, self._size)
        pos = start_position
        while pos < end:
            want = min(end, pos + chunk)
            with naming_os_errors(self.log_path):
                raw = self.storage.read(self.log_path, pos, want)
            data = B.as_uint8(raw)
            scan = B.scan_entries(data, path=self.log_path, base_position=pos, raise_on_corrupt=False)
            if scan.end == 0 and scan.error is not None:
                raise scan.error
            if scan.end == 0:
                if want >= end or data.shape[0] < 12:
                    return  # torn tail
                # one batch larger than the chunk: read exactly that batch
                need = int.from_bytes(raw[8:12], "big", signed=True) + 12
                if pos + need > end:
                    return
                chunk = max(chunk, need)
                continue
            h = B.parse_headers(data, scan.position, scan.size, scan.magic)
            h.position = h.position + pos
            yield Located(data[: scan.end], pos, h)
            if scan.error is not None:
                raise scan.error
            pos += scan.end

    def position_of(self, offset: int) -> int | None:
        """Position of the first batch holding an offset >= ``offset`` (index-guided)."""
        for loc in self.batches_for(offset):
            hit = np.nonzero(loc.headers.last_offset >= offset)[0]
            if hit.size:
                return int(loc.headers.position[int(hit[0])])
        return None

    # ------------------------------------------------------------------ index checks

    def _index_start(self, offset: int, end_position: int | None = None) -> tuple[int, int]:
        """(offset, position) of the offset-index entry to scan from for ``offset``: the last
        one at or below it whose position is below ``end_position`` (default: the segment's
        size); ``(base_offset, 0)`` when the index is not trusted."""
        if not self._index_trusted or offset <= self.base_offset:
            return self.base_offset, 0  # (from the start: no index needed)
        limit = self._size if end_position is None else min(end_position, self._size)
        return self.offset_index.lookup(offset, max_position=limit)

    def batches_for(
        self, offset: int, *, end_position: int | None = None, chunk: int = READ_CHUNK
    ) -> Iterator[Located]:
        """Batches from the one the offset index gives for ``offset`` on (up to
        ``end_position``).  The entry must point at a batch whose offsets start at or below its
        own (else batches holding ``offset`` could lie before it): if it does not, the index is
        distrusted and the whole segment is scanned from its start."""
        entry, start = self._index_start(offset, end_position)
        if start == 0:
            yield from self.iter_batches(0, end_position=end_position, chunk=chunk)
            return
        batches = self.iter_batches(start, end_position=end_position, chunk=chunk)
        try:
            first = next(batches, None)
            why = "no complete batch starts" if first is None else ""
        except CorruptRecordError as e:
            if e.position != start:
                raise
            first, why = None, f"no valid batch starts ({e.reason})"
        if first is not None:
            base = int(first.headers.base_offset[0])
            if base <= entry:
                yield first
                yield from batches
                return
            why = f"the batch starts at offset {base}"
        self._distrust_index(f"its entry for offset {entry} points at byte {start}, where {why}")
        # (``end_position`` may come from the same index: scan to the end of the segment)
        yield from self.iter_batches(0, chunk=chunk)

    def _distrust_index(self, why: str) -> None:
        if self._index_trusted:
            log.warning("%s: ignoring the offset index %s: %s", self.log_path, self.offset_index.path, why)
            self._index_trusted = False

    def upper_position(self, end: int) -> int | None:
        """:meth:`OffsetIndex.upper_position`, or None (the end) when the index is not trusted
        or the whole segment lies below ``end``."""
        if self.next_base_offset is not None and end >= self.next_base_offset:
            return None
        return self.offset_index.upper_position(end) if self._index_trusted else None

    def _validate_offset_index(self) -> None:
        """Run when the offset index is loaded (no I/O but, rarely, a size): its entries fit the
        segment (see :mod:`index`).  A reader's size of the active segment may be older than
        the index: the file's current size bounds the positions then.  (Each entry is checked
        against the ``.log`` when a scan starts from it, see :meth:`batches_for`.)"""
        idx = self.offset_index
        size = self._size
        if idx.lookup(MAX_OFFSET)[1] >= size:
            size = max(size, self.read_size())
        idx.check_entries(log_size=size, end_offset=self.next_base_offset)

    def _validate_time_index(self) -> None:
        self.time_index.check_entries(end_offset=self.next_base_offset)

    def read_size(self) -> int:
        """The ``.log`` file's size now (0 if missing)."""
        with naming_os_errors(self.log_path):
            return self.storage.size(self.log_path) if self.storage.exists(self.log_path) else 0

    def invalid_batches(self, loc: Located, prev_last: int) -> np.ndarray:
        """Which batches of ``loc`` are invalid content: a CRC mismatch, offsets outside the
        segment or not above ``prev_last`` and the batch before (Kafka's recovery checks)."""
        h = loc.headers
        ok = B.verify_crcs(loc.data, relative_headers(h, loc.start))
        bad = ~ok | (h.base_offset < self.base_offset) | (h.last_offset - self.base_offset > INT32_MAX)
        bad |= h.last_offset < h.base_offset
        prev = np.concatenate([[prev_last], h.last_offset[:-1]])
        bad |= h.base_offset <= prev
        return np.asarray(bad, dtype=bool)

    def read(
        self, offset: int, max_bytes: int, *, max_position: int | None = None, min_one_batch: bool = True
    ) -> tuple[int, memoryview] | None:
        """Whole batches from the first one holding an offset >= ``offset``, at most
        ``max_bytes`` (but at least one batch when ``min_one_batch``): (position, bytes).
        None when the segment holds nothing at or above ``offset`` (below ``max_position``)."""
        limit = self._size if max_position is None else min(self._size, max_position)
        for loc in self.batches_for(
            offset, end_position=limit, chunk=max(1 << 16, min(max_bytes, READ_CHUNK))
        ):
            h = loc.headers
            hit = np.nonzero(h.last_offset >= offset)[0]
            if not hit.size:
                continue
            i = int(hit[0])
            p = int(h.position[i])
            ends = h.position[i:] + h.size[i:]
            k = int((ends <= p + max_bytes).sum())
            if k == 0 and min_one_batch:
                k = 1
            e = int(ends[k - 1]) if k else p
            if e - p > loc.data.shape[0] - (p - loc.start):  # the first batch exceeds the chunk
                with naming_os_errors(self.log_path):
                    return p, memoryview(self.storage.read(self.log_path, p, e))
            return p, loc.data[p - loc.start : e - loc.start].data  # zero-copy view
        return None

    def set_next_offset(self, offset: int) -> None:
        """Tell a segment just built from files (a linked staged segment) where it ends."""
        self._next_offset = offset

    def read_next_offset(self) -> int:
        """The offset after the last batch of the segment (base offset if empty)."""
        if self._next_offset is None:
            # from the last index entry; one that points at no batch (an index page that reached
            # the disk before the log bytes it describes did, seen by a reader before any writer
            # recovered the segment) makes it a scan of the whole segment
            last = None
            try:
                for loc in self.batches_for(MAX_OFFSET):
                    last = int(loc.headers.last_offset[-1]) + 1
            except CorruptRecordError:
                pass  # a trusted (clean) segment with a bad tail: reads will report it
            self._next_offset = self.base_offset if last is None else last
        return self._next_offset

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp`` and offset >=
        ``starting_offset``, or None (Kafka's ``LogSegment.findOffsetByTimestamp``)."""
        from pylog.storage.codec import records

        _, ts_off = self.time_index.lookup(timestamp)
        for loc in self.batches_for(max(ts_off, starting_offset)):
            h = loc.headers
            cand = np.nonzero((h.max_timestamp >= timestamp) & (h.last_offset >= starting_offset))[0]
            for i in cand.tolist():
                p = int(h.position[i]) - loc.start
                rs = records.decode(
                    loc.data[p : p + int(h.size[i])], path=self.log_path, base_position=int(h.position[i])
                )
                t = rs.records
                off = t.column("offset").to_numpy()
                ts = t.column("timestamp").to_numpy()
                ok = np.nonzero((ts >= timestamp) & (off >= starting_offset))[0]
                if ok.size and not bool(rs.batches.is_control[0]):
                    return int(off[ok[0]]), int(ts[ok[0]])
        return None

    @property
    def largest_timestamp(self) -> int:
        return self.max_timestamp_so_far

    # ------------------------------------------------------------------ lifecycle

    def recover(self, *, truncate: bool = True) -> int:
        """Rebuild the indexes from the log, up to the first invalid batch.

        Returns how many bytes from there on are invalid, and truncates them unless
        ``truncate`` is False (the caller then calls :meth:`cut`).  Checks each batch's CRC,
        that its offsets fit this segment and increase, as Kafka's ``LogSegment.recover`` does.
        Only content proven invalid is cut: an I/O error raises (naming the file) and leaves
        the ``.log`` as it was; the half-rebuilt index files are removed, so that the next load
        finds them missing and rebuilds them."""
        self.close_files()
        try:
            return self._recover(truncate)
        except Exception:
            self._drop_indexes()
            raise

    def _recover(self, truncate: bool) -> int:
        for idx in (self.offset_index, self.time_index, self.txn_index):
            idx.reset()
        self.offset_index.create()
        self.time_index.create()
        self._max_ts = [-1, self.base_offset]
        self.bytes_since_last_index_entry = 0
        self._next_offset = None
        self._index_trusted = True
        valid = 0
        prev_last = self.base_offset - 1
        try:
            for loc in self.iter_batches(0):
                h = loc.headers
                bad = self.invalid_batches(loc, prev_last)
                n_ok = int(np.argmax(bad)) if bad.any() else len(h)
                good = h.take(slice(0, n_ok))
                self._index_batches(good.position, good)
                if n_ok:
                    valid = int(good.position[-1] + good.size[-1])
                    prev_last = int(good.last_offset[-1])
                if n_ok < len(h):
                    break
        except CorruptRecordError:
            pass  # invalid entry size: truncate at the last valid batch
        self.time_index.maybe_append(
            self.max_timestamp_so_far, self.offset_of_max_timestamp, skip_full_check=True
        )
        invalid = self._size - valid
        if invalid and truncate:
            self.cut(valid)
        return invalid

    def cut(self, size: int) -> None:
        """Truncate the ``.log`` to ``size`` bytes (the valid part :meth:`recover` found)."""
        with naming_os_errors(self.log_path):
            self.storage.truncate(self.log_path, size)
        self._size = size
        self._next_offset = None

    def _drop_indexes(self) -> None:
        """Remove the index files after a failed rebuild (best effort: the disk may be failing)."""
        for idx in (self.time_index, self.txn_index, self.offset_index):
            with contextlib.suppress(OSError, PylogError):
                idx.delete()

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset``; returns bytes removed."""
        self.close_files()
        pos = self.position_of(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        if pos is None:
            return 0
        removed = self._size - pos
        with naming_os_errors(self.log_path):
            self.storage.truncate(self.log_path, pos)
        self._size = pos
        self._next_offset = None
        self._max_ts = list(self._read_largest_timestamp())
        self.bytes_since_last_index_entry = 0
        if pos == 0:
            self.rolling_based_timestamp = None
        return removed

    def _read_largest_timestamp(self) -> tuple[int, int]:
        """Kafka's ``readLargestTimestamp``: the last time-index entry, or a later batch's
        larger timestamp (the time index is sparse: without this, a segment truncated below its
        last entry would forget the timestamps of the batches it keeps, and timestamp lookups
        would skip it; tests/reliability/test_model.py)."""
        ts, off = self.time_index.last_entry
        try:
            for loc in self.batches_for(off):
                h = loc.headers
                i = int(np.argmax(h.max_timestamp))
                if int(h.max_timestamp[i]) > ts:
                    ts, off = int(h.max_timestamp[i]), int(h.last_offset[i])
        except CorruptRecordError:
            pass  # a bad tail: reads report it, recovery truncates it
        return ts, off

    def on_become_inactive(self) -> None:
        """Roll: final time index entry (the segment's max timestamp), close appenders."""
        self.time_index.maybe_append(
            self.max_timestamp_so_far, self.offset_of_max_timestamp, skip_full_check=True
        )
        self.flush()
        self.close_files()

    def flush(self) -> None:
        if self._file is not None:
            with naming_os_errors(self.log_path):
                self._file.fsync()
        for idx in self._indexes or ():
            idx.flush()

    def close_files(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for idx in self._indexes or ():
            idx.close()

    def close(self) -> None:
        self.flush()
        self.close_files()

    def change_suffix(self, new_suffix: str) -> None:
        self.close_files()
        stem = join(self.directory, segment_name(self.base_offset))
        with naming_os_errors(self.log_path):
            if self.storage.exists(self.log_path):
                self.storage.rename(self.log_path, f"{stem}.log{new_suffix}")
            elif self._size:  # an empty segment may never have been written; this one was
                raise StorageIOError(
                    errno.ENOENT,
                    f"the segment file is gone (it held {self._size} bytes): something outside "
                    "this writer removed it",
                    self.log_path,
                    f"rename it to {segment_name(self.base_offset)}.log{new_suffix}",
                )
        self.log_path = f"{stem}.log{new_suffix}"
        for idx, ext in zip(self._index_files(), ("index", "timeindex", "txnindex"), strict=True):
            idx.rename(f"{stem}.{ext}{new_suffix}")
        self._stem = stem
        self.suffix = new_suffix

    def delete(self) -> None:
        self.close_files()
        with naming_os_errors(self.log_path):
            self.storage.delete(self.log_path)
        for idx in self._index_files():
            idx.delete()


def fitting_batches(seg: LogSegment, h: B.BatchHeaders, i: int, segment_bytes: int) -> int:
    """End (exclusive) of the batches from ``i`` on that go into ``seg``: within
    ``segment_bytes``, 32-bit relative offsets and index room (one entry per batch at most);
    always at least one."""
    n = len(h)
    room = segment_bytes - seg.size
    ends = np.cumsum(h.size[i:])
    fits = (ends <= room) & (h.last_offset[i:] - seg.base_offset <= INT32_MAX)
    j = i + max(1, int(np.argmin(fits)) if not fits.all() else n - i)
    return min(j, i + max(1, seg.offset_index.max_entries - len(seg.offset_index) - 1))


def relative_headers(h: B.BatchHeaders, start: int) -> B.BatchHeaders:
    """Headers with positions relative to ``start`` (where the bytes handed along begin)."""
    r = h.take(slice(None))
    r.position = h.position - start
    return r
