"""Kafka's sparse segment indexes, ``.index`` (offset) and ``.timeindex`` (time), and the base
of every index file (the ``.txnindex`` is in :mod:`txnindex`).

Entry layouts (big-endian, files hold nothing but whole entries):

    +------------+------+-------------------+--------+--------------------------------------+
    | file       | byte | field             | type   | notes                                |
    +------------+------+-------------------+--------+--------------------------------------+
    | .index     |    0 | relativeOffset    | int32  | offset - baseOffset, in [0, 2^31-1]  |
    |  (8 bytes) |    4 | position          | int32  | byte position of the batch in .log   |
    +------------+------+-------------------+--------+--------------------------------------+
    | .timeindex |    0 | timestamp         | int64  | max timestamp so far (ms)            |
    | (12 bytes) |    8 | relativeOffset    | int32  | last offset of the batch holding it  |
    +------------+------+-------------------+--------+--------------------------------------+

Each class reads its whole file into numpy arrays lazily, on first use; the active segment
appends through :meth:`Storage.open_append`.  Files are never preallocated: they always hold
exactly their entries, which is what Kafka expects of inactive segments (a trailing partial
entry is ignored on read and reported by ``sanity_check``; the first append cuts it off).
Lookups are ``np.searchsorted`` over the in-memory arrays, which grow by doubling.

Sanity checks (Kafka's ``OffsetIndex``/``TimeIndex``/``TransactionIndex.sanityCheck``, and
more): whole entries only, offsets at or above the base offset and below the next segment's,
entries ascending, offset-index positions within the ``.log``.  They are vectorized over the
entries; :meth:`IndexFile.check_entries` is what a segment runs on every index it loads
(through ``validator``), :meth:`sanity_check` adds the whole-entries rule for writers and tools.
An index whose entries fail the segment's validator is *rejected*: its entries are dropped in
memory (lookups then return the start of the segment, so readers scan the ``.log``), the file
is left as it is, and ``rejected`` says why; a writer's loader rebuilds it.

I/O errors (a full or failing disk) raise ``OSError`` with the index file's path as
``filename`` (the OS names no file for a failed ``write(2)``); a short write is one too.

``.index`` and ``.timeindex`` files are created on the first append (or :meth:`create`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import struct
from collections.abc import Callable, Iterator
from typing import ClassVar

import numpy as np

from pylog.storage.backends.base import AppendFile, Storage
from pylog.storage.errors import CorruptIndexError, IndexFullError, InvalidOffsetError

log = logging.getLogger("pylog.storage")

OFFSET_ENTRY = struct.Struct(">ii")  # relativeOffset, position
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relativeOffset

INT32_MAX = 2**31 - 1
DEFAULT_MAX_INDEX_BYTES = 10485760  # segment.index.bytes
NO_TIMESTAMP = -1

_OFFSET_DTYPE = np.dtype([("rel", ">i4"), ("pos", ">i4")])
_TIME_DTYPE = np.dtype([("ts", ">i8"), ("rel", ">i4")])
assert _OFFSET_DTYPE.itemsize == OFFSET_ENTRY.size
assert _TIME_DTYPE.itemsize == TIME_ENTRY.size


@contextlib.contextmanager
def naming_os_errors(path: str) -> Iterator[None]:
    """Re-raise an ``OSError`` without a file name (``write``/``fsync``/``pread`` on a
    descriptor) as one naming ``path``, so that callers can say which file failed."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), path) from e


def check_written(path: str, written: int | None, wanted: int) -> None:
    """Raise ``ENOSPC`` naming ``path`` for a short write (``write(2)`` on a disk that filled up
    stores a prefix and returns its length)."""
    if written is not None and written != wanted:
        raise OSError(
            errno.ENOSPC, f"{wanted - written} of {wanted} bytes not written (is the disk full?)", path
        )


class IndexFile:
    """File handling shared by the three index kinds: lazy load, append, truncate, rename.

    Subclasses keep their entries in ``self._cols`` (int64 arrays of equal capacity, the first
    ``self._n`` rows valid) and describe how raw file entries map to those columns.
    """

    ENTRY_SIZE: ClassVar[int]
    _DTYPE: ClassVar[np.dtype]
    _NCOLS: ClassVar[int]

    def __init__(self, storage: Storage, path: str, base_offset: int):
        self.storage = storage
        self.path = path
        self.base_offset = int(base_offset)
        self._cols: list[np.ndarray] = [np.zeros(0, np.int64) for _ in range(self._NCOLS)]
        self._n = 0
        self._loaded = False
        self._file_bytes = 0  # length of the file as last read or written
        self._appender: AppendFile | None = None
        self._unsynced = False
        """Whether the append handle changed the file since its last fsync (a fresh handle: maybe)."""
        self.validator: Callable[[], None] | None = None
        """Run once the file is loaded (set by the segment): raises CorruptIndexError for
        entries that do not fit the segment, and the index is then rejected."""
        self.rejected: CorruptIndexError | None = None
        """Why the entries read from the file were dropped (None: they were not)."""

    # ---------------------------------------------------------------- loading and growth

    def _load(self) -> None:
        if self._loaded:
            return
        with naming_os_errors(self.path):
            data = self.storage.read(self.path) if self.storage.exists(self.path) else b""
        n = len(data) // self.ENTRY_SIZE
        raw = np.frombuffer(data, dtype=self._DTYPE, count=n)
        cols = self._from_raw(raw)
        cap = max(n, 16)
        self._cols = [np.zeros(cap, np.int64) for _ in range(self._NCOLS)]
        for dst, src in zip(self._cols, cols, strict=True):
            dst[:n] = src
        self._n = n
        self._file_bytes = len(data)
        self._loaded = True
        if self.validator is not None and n:
            try:
                self.validator()
            except CorruptIndexError as e:
                self.rejected = e
                self._n = 0  # never trusted again: lookups fall back to the start of the segment
                log.warning("ignoring a damaged index, the segment is scanned instead: %s", e)

    def _from_raw(self, raw: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _push(self, *values: int) -> None:
        """Add one row to the in-memory columns (amortized O(1))."""
        if self._n == self._cols[0].shape[0]:
            cap = max(16, 2 * self._n)
            grown = [np.zeros(cap, np.int64) for _ in range(self._NCOLS)]
            for dst, src in zip(grown, self._cols, strict=True):
                dst[: self._n] = src[: self._n]
            self._cols = grown
        for col, v in zip(self._cols, values, strict=True):
            col[self._n] = v
        self._n += 1

    def _col(self, i: int) -> np.ndarray:
        """A view of the valid rows of column ``i`` (loads the file if needed)."""
        self._load()
        return self._cols[i][: self._n]

    def _open_appender(self) -> AppendFile:
        self._load()
        if self._appender is None:
            with naming_os_errors(self.path):
                appender = self.storage.open_append(self.path)
                if appender.size() != self._n * self.ENTRY_SIZE:
                    # a partial trailing entry (or bytes written behind our back): keep whole entries
                    appender.truncate(self._n * self.ENTRY_SIZE)
            self._appender = appender
            self._unsynced = True
            self._file_bytes = appender.size()
        return self._appender

    def _write(self, entry: bytes) -> None:
        appender = self._open_appender()
        self._unsynced = True
        with naming_os_errors(self.path):
            written = appender.write(entry)
            self._file_bytes = appender.size()
            check_written(self.path, written, len(entry))

    def _truncate_entries(self, n: int) -> None:
        """Keep the first ``n`` entries, in memory and on disk."""
        self._load()
        n = max(0, min(n, self._n))
        size = n * self.ENTRY_SIZE
        with naming_os_errors(self.path):
            if self._appender is not None:
                self._unsynced = True
                self._appender.truncate(size)
            elif self._file_bytes != size and self.storage.exists(self.path):
                self.storage.truncate(self.path, size)
        self._file_bytes = size
        self._n = n

    # ---------------------------------------------------------------- common API

    def __len__(self) -> int:
        self._load()
        return self._n

    def create(self) -> None:
        """Create the file (empty) if it does not exist and keep it open for appending."""
        self._open_appender()

    def reset(self) -> None:
        """Drop every entry and empty the file (a missing file stays missing)."""
        self._truncate_entries(0)
        self.rejected = None

    def flush(self) -> None:
        """fsync the file if it is open for appending and changed since its last fsync (an index
        gains an entry every ``index.interval.bytes`` of log: most commits leave it as it was,
        and the fsync of an unchanged file still costs a flush of the device's cache)."""
        if self._appender is not None and self._unsynced:
            with naming_os_errors(self.path):
                self._appender.fsync()
            self._unsynced = False

    def close(self) -> None:
        """Close the append handle; the entries stay readable."""
        if self._appender is not None:
            self._appender.close()
            self._appender = None

    def delete(self) -> None:
        self.close()
        with naming_os_errors(self.path):
            self.storage.delete(self.path)
        self._n = 0
        self._file_bytes = 0
        self._loaded = True
        self.rejected = None

    def rename(self, new_path: str) -> None:
        """Rename the file (suffix changes ``.cleaned``/``.swap``/``.deleted``); a missing
        file just takes the new name."""
        self.close()
        with naming_os_errors(self.path):
            if self.storage.exists(self.path):
                self.storage.rename(self.path, new_path)
        self.path = new_path

    def exists(self) -> bool:
        return self._appender is not None or self.storage.exists(self.path)

    def _partial_bytes(self) -> int:
        self._load()
        return self._file_bytes - self._n * self.ENTRY_SIZE

    def _relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if not 0 <= rel <= INT32_MAX:
            raise InvalidOffsetError(
                f"{self.path}: offset {offset} cannot be stored relative to base offset "
                f"{self.base_offset} (relative offset must be in [0, {INT32_MAX}])"
            )
        return rel

    def _corrupt(self, message: str) -> CorruptIndexError:
        return CorruptIndexError(message, path=self.path)

    def _check_whole_entries(self, what: str) -> None:
        if self._partial_bytes():
            raise self._corrupt(
                f"{what} file is corrupt, found {self._file_bytes} bytes which is neither positive "
                f"nor a multiple of {self.ENTRY_SIZE}"
            )

    def _check_ascending(self, values: np.ndarray, what: str, *, strict: bool) -> None:
        """Raise unless ``values`` ascend (strictly with ``strict``), naming the first entry out
        of order (0-based, as ``pylog dump`` numbers them)."""
        if values.shape[0] < 2:
            return
        prev, cur = values[:-1], values[1:]  # (compared, not subtracted: no int64 overflow)
        bad = np.nonzero(cur <= prev if strict else cur < prev)[0]
        if bad.size:
            i = int(bad[0]) + 1
            raise self._corrupt(
                f"entry {i} has {what} {int(values[i])}, {'not above' if strict else 'below'} the "
                f"{int(values[i - 1])} of entry {i - 1} (entries must be in ascending order)"
            )

    def _check_offset_range(self, offsets: np.ndarray, end_offset: int | None, what: str) -> None:
        """Offsets must be in [base offset, ``end_offset``) (the next segment's base offset)."""
        if offsets.shape[0] == 0:
            return
        low = int(offsets.min())
        if low < self.base_offset:
            i = int(np.argmin(offsets))
            raise self._corrupt(
                f"entry {i} has {what} {low}, below the base offset {self.base_offset} of the segment"
            )
        if end_offset is not None and int(offsets.max()) >= end_offset:
            i = int(np.argmax(offsets))
            raise self._corrupt(
                f"entry {i} has {what} {int(offsets[i])}, at or beyond {end_offset} where the next "
                f"segment starts"
            )

    def check_entries(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Raise CorruptIndexError unless the entries fit a segment whose ``.log`` holds
        ``log_size`` bytes and whose offsets are below ``end_offset`` (None: unknown)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        n = self._n if self._loaded else "?"
        return f"{type(self).__name__}({self.path!r}, base_offset={self.base_offset}, entries={n})"


class _SparseIndex(IndexFile):
    """Offset and time indexes: a maximum size, Kafka's ``maxEntries``."""

    def __init__(
        self, storage: Storage, path: str, base_offset: int, *, max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES
    ):
        super().__init__(storage, path, base_offset)
        if max_index_bytes < self.ENTRY_SIZE:
            raise ValueError(f"max_index_bytes must be at least {self.ENTRY_SIZE}, got {max_index_bytes}")
        self.max_index_bytes = int(max_index_bytes)

    @property
    def max_entries(self) -> int:
        return self.max_index_bytes // self.ENTRY_SIZE

    def is_full(self) -> bool:
        return len(self) >= self.max_entries


class OffsetIndex(_SparseIndex):
    """``.index``: sparse map from offsets to byte positions in the ``.log`` (Kafka ``OffsetIndex``)."""

    ENTRY_SIZE = OFFSET_ENTRY.size
    _DTYPE = _OFFSET_DTYPE
    _NCOLS = 2  # absolute offset, position

    def _from_raw(self, raw: np.ndarray) -> list[np.ndarray]:
        return [raw["rel"].astype(np.int64) + self.base_offset, raw["pos"].astype(np.int64)]

    @property
    def last_offset(self) -> int:
        """Absolute offset of the last entry, ``base_offset`` if empty."""
        offs = self._col(0)
        return int(offs[-1]) if offs.shape[0] else self.base_offset

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(absolute offsets, positions) as int64 arrays (copies)."""
        return self._col(0).copy(), self._col(1).copy()

    def append(self, offset: int, position: int) -> None:
        """Append ``(offset, position)``; the offset must be above the last entry's."""
        if self.is_full():
            raise IndexFullError(f"{self.path}: attempt to append to a full index (size = {self._n})")
        if self._n and offset <= self.last_offset:
            raise InvalidOffsetError(
                f"{self.path}: attempt to append an offset {offset} to position {self._n} no larger "
                f"than the last offset appended ({self.last_offset})"
            )
        rel = self._relative(offset)
        if not 0 <= position <= INT32_MAX:
            raise InvalidOffsetError(f"{self.path}: position {position} is not in [0, {INT32_MAX}]")
        self._write(OFFSET_ENTRY.pack(rel, position))
        self._push(offset, position)

    def lookup(self, target: int, *, max_position: int | None = None) -> tuple[int, int]:
        """The entry with the largest offset <= ``target`` (and a position below
        ``max_position``, if given), else ``(base_offset, 0)``."""
        offs = self._col(0)
        slot = int(np.searchsorted(offs, target, side="right")) - 1
        if max_position is not None:
            slot = min(slot, int(np.searchsorted(self._col(1), max_position, side="left")) - 1)
        if slot < 0:
            return self.base_offset, 0
        return int(offs[slot]), int(self._cols[1][slot])

    def upper_position(self, end: int) -> int | None:
        """A file position before which every offset < ``end`` lies (None: the end of the file).

        Entries are (last offset of a batch, its position): the first entry at or above ``end``
        may still hold smaller offsets, but every batch from the entry after it on starts above
        that entry's offset, hence at or above ``end``."""
        offs = self._col(0)
        slot = int(np.searchsorted(offs, end, side="left")) + 1
        return int(self._cols[1][slot]) if slot < offs.shape[0] else None

    def lookup_many(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup` for each element of ``targets``: (offsets, positions)."""
        offs, pos = self._col(0), self._col(1)
        t = np.asarray(targets, dtype=np.int64)
        slot = np.searchsorted(offs, t, side="right") - 1
        found = slot >= 0
        safe = np.maximum(slot, 0)
        if offs.shape[0] == 0:
            return np.full(t.shape, self.base_offset, np.int64), np.zeros(t.shape, np.int64)
        return (
            np.where(found, offs[safe], self.base_offset).astype(np.int64),
            np.where(found, pos[safe], 0).astype(np.int64),
        )

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        self._truncate_entries(int(np.searchsorted(self._col(0), offset, side="left")))

    def sanity_check(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Kafka's ``OffsetIndex.sanityCheck`` (the last offset at or above the base offset, a
        whole number of entries), then :meth:`check_entries`."""
        if len(self) and self.last_offset < self.base_offset:
            raise self._corrupt(
                f"Corrupt index found, index file has non-zero size but the last offset is "
                f"{self.last_offset} which is less than the base offset {self.base_offset}"
            )
        self._check_whole_entries("Index")
        self.check_entries(log_size=log_size, end_offset=end_offset)

    def check_entries(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Offsets strictly ascending within [base offset, ``end_offset``), positions strictly
        ascending within [0, ``log_size``)."""
        offs, pos = self._col(0), self._col(1)
        if offs.shape[0] == 0:
            return
        self._check_offset_range(offs, end_offset, "offset")
        self._check_ascending(offs, "offset", strict=True)
        if int(pos[0]) < 0:
            raise self._corrupt(f"entry 0 has position {int(pos[0])}, below 0")
        self._check_ascending(pos, "position", strict=True)
        if log_size is not None and int(pos[-1]) >= log_size:
            i = int(np.argmax(pos >= log_size))
            raise self._corrupt(
                f"entry {i} (offset {int(offs[i])}) points at byte {int(pos[i])}, beyond the "
                f"{log_size} bytes of the segment"
            )


class TimeIndex(_SparseIndex):
    """``.timeindex``: sparse map from max-timestamp-so-far to offsets (Kafka ``TimeIndex``)."""

    ENTRY_SIZE = TIME_ENTRY.size
    _DTYPE = _TIME_DTYPE
    _NCOLS = 2  # timestamp, absolute offset

    def _from_raw(self, raw: np.ndarray) -> list[np.ndarray]:
        return [raw["ts"].astype(np.int64), raw["rel"].astype(np.int64) + self.base_offset]

    def is_full(self) -> bool:
        """Full one entry early: the last slot is reserved for the roll-time entry."""
        return len(self) >= self.max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, absolute offset) of the last entry, ``(-1, base_offset)`` if empty."""
        ts, offs = self._col(0), self._col(1)
        if ts.shape[0] == 0:
            return NO_TIMESTAMP, self.base_offset
        return int(ts[-1]), int(offs[-1])

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps, absolute offsets) as int64 arrays (copies)."""
        return self._col(0).copy(), self._col(1).copy()

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Kafka ``TimeIndex.maybeAppend``: append only if ``timestamp`` is above the last one.

        Raises IndexFullError when full (unless ``skip_full_check``, used for the roll-time
        entry) and InvalidOffsetError if the offset or the timestamp goes backwards.
        """
        if not skip_full_check and self.is_full():
            raise IndexFullError(f"{self.path}: attempt to append to a full time index (size = {self._n})")
        last_ts, last_off = self.last_entry
        if self._n and offset < last_off:
            raise InvalidOffsetError(
                f"{self.path}: attempt to append an offset ({offset}) to slot {self._n} no larger than "
                f"the last offset appended ({last_off})"
            )
        if self._n and timestamp < last_ts:
            raise InvalidOffsetError(
                f"{self.path}: attempt to append a timestamp ({timestamp}) to slot {self._n} no larger "
                f"than the last timestamp appended ({last_ts})"
            )
        if timestamp > last_ts:
            rel = self._relative(offset)
            self._write(TIME_ENTRY.pack(timestamp, rel))
            self._push(timestamp, offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The entry with the largest timestamp <= ``timestamp``, else ``(-1, base_offset)``."""
        ts = self._col(0)
        slot = int(np.searchsorted(ts, timestamp, side="right")) - 1
        if slot < 0:
            return NO_TIMESTAMP, self.base_offset
        return int(ts[slot]), int(self._cols[1][slot])

    def lookup_many(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lookup` for each element: (timestamps, offsets)."""
        ts, offs = self._col(0), self._col(1)
        t = np.asarray(timestamps, dtype=np.int64)
        if ts.shape[0] == 0:
            return np.full(t.shape, NO_TIMESTAMP, np.int64), np.full(t.shape, self.base_offset, np.int64)
        slot = np.searchsorted(ts, t, side="right") - 1
        found = slot >= 0
        safe = np.maximum(slot, 0)
        return (
            np.where(found, ts[safe], NO_TIMESTAMP).astype(np.int64),
            np.where(found, offs[safe], self.base_offset).astype(np.int64),
        )

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        self._truncate_entries(int(np.searchsorted(self._col(1), offset, side="left")))

    def sanity_check(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Kafka's ``TimeIndex.sanityCheck`` (last timestamp below the first, last offset below
        the base offset, a file that is not a whole number of entries), then
        :meth:`check_entries`."""
        ts, offs = self._col(0), self._col(1)
        if ts.shape[0] and ts[-1] < ts[0]:
            raise self._corrupt(
                f"Corrupt time index found, time index file has non-zero size but the last timestamp "
                f"is {int(ts[-1])} which is less than the first timestamp {int(ts[0])}"
            )
        if offs.shape[0] and offs[-1] < self.base_offset:
            raise self._corrupt(
                f"Corrupt time index found, time index file has non-zero size but the last offset "
                f"is {int(offs[-1])} which is less than the first offset {self.base_offset}"
            )
        self._check_whole_entries("Time index")
        self.check_entries(log_size=log_size, end_offset=end_offset)

    def check_entries(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Timestamps and offsets ascending (offsets within [base offset, ``end_offset``))."""
        ts, offs = self._col(0), self._col(1)
        if ts.shape[0] == 0:
            return
        self._check_offset_range(offs, end_offset, "offset")
        self._check_ascending(ts, "timestamp", strict=False)
        self._check_ascending(offs, "offset", strict=False)


__all__ = [
    "OFFSET_ENTRY",
    "TIME_ENTRY",
    "IndexFile",
    "IndexFullError",
    "OffsetIndex",
    "TimeIndex",
]
