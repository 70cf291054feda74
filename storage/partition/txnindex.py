"""Kafka's transaction index, ``.txnindex``: the aborted transactions whose ABORT marker is
in the segment (Kafka's ``TransactionIndex``).

Entry layout (big-endian, 34 bytes; the file holds nothing but whole entries):

    +------+-------------------+--------+--------------------------------------+
    | byte | field             | type   | notes                                |
    +------+-------------------+--------+--------------------------------------+
    |    0 | version           | int16  | 0 (Kafka reads only the first byte)  |
    |    2 | producerId        | int64  |                                      |
    |   10 | firstOffset       | int64  | first offset of the aborted txn      |
    |   18 | lastOffset        | int64  | offset of its ABORT marker           |
    |   26 | lastStableOffset  | int64  |                                      |
    +------+-------------------+--------+--------------------------------------+

The file is created only when an aborted transaction is appended, as Kafka does.  Loading,
appending, truncation and the shared checks are those of :class:`index.IndexFile`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from pylog.storage.errors import InvalidOffsetError
from pylog.storage.partition.index import IndexFile

TXN_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset
TXN_VERSION = 0
_TXN_DTYPE = np.dtype([("version", ">i2"), ("pid", ">i8"), ("first", ">i8"), ("last", ">i8"), ("lso", ">i8")])
assert _TXN_DTYPE.itemsize == TXN_ENTRY.size


class TxnEntries(NamedTuple):
    """The entries of a transaction index, one int64 array per field, in file order."""

    version: np.ndarray
    producer_id: np.ndarray
    first_offset: np.ndarray
    last_offset: np.ndarray
    last_stable_offset: np.ndarray


class TxnIndex(IndexFile):
    """``.txnindex``: the aborted transactions whose ABORT marker is in the segment."""

    ENTRY_SIZE = TXN_ENTRY.size
    _DTYPE = _TXN_DTYPE
    _NCOLS = 5  # version, producerId, firstOffset, lastOffset, lastStableOffset

    def _from_raw(self, raw: np.ndarray) -> list[np.ndarray]:
        return [raw[name].astype(np.int64) for name in ("version", "pid", "first", "last", "lso")]

    def entries(self) -> TxnEntries:
        """Every entry, one int64 array per field (copies)."""
        return TxnEntries(*(self._col(i).copy() for i in range(self._NCOLS)))

    def append(self, producer_id: int, first_offset: int, last_offset: int, last_stable_offset: int) -> None:
        """Append an aborted transaction; ``last_offset`` must be above the previous entry's."""
        last = self._col(3)
        if last.shape[0] and last_offset <= last[-1]:
            raise InvalidOffsetError(
                f"{self.path}: the last offset of appended transactions must increase sequentially, "
                f"but {last_offset} is not greater than current last offset {int(last[-1])}"
            )
        self._write(TXN_ENTRY.pack(TXN_VERSION, producer_id, first_offset, last_offset, last_stable_offset))
        self._push(TXN_VERSION, producer_id, first_offset, last_offset, last_stable_offset)

    def aborted_in_range(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(producer ids, first offsets) of the transactions overlapping ``[start, end)``:
        ``lastOffset >= start`` and ``firstOffset < end`` (Kafka ``collectAbortedTxns``)."""
        first, last = self._col(2), self._col(3)
        keep = (last >= start) & (first < end)
        return self._col(1)[keep].copy(), first[keep].copy()

    def truncate_to(self, offset: int) -> None:
        """Drop the first entry whose lastOffset is >= ``offset`` and everything after it."""
        hit = self._col(3) >= offset
        self._truncate_entries(int(np.argmax(hit)) if hit.any() else self._n)

    def sanity_check(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Kafka's ``TransactionIndex.sanityCheck`` (every lastOffset >= base offset), a check
        for a trailing partial entry (which Kafka silently ignores), then :meth:`check_entries`."""
        last = self._col(3)
        bad = np.nonzero(last < self.base_offset)[0]
        if bad.size:
            i = int(bad[0])
            v, pid, first, lo, lso = (int(self._cols[c][i]) for c in range(self._NCOLS))
            raise self._corrupt(
                f"Last offset of aborted transaction AbortedTxn(version={v}, producerId={pid}, "
                f"firstOffset={first}, lastOffset={lo}, lastStableOffset={lso}) in index is less "
                f"than start offset {self.base_offset}"
            )
        partial = self._partial_bytes()
        if partial:
            raise self._corrupt(
                f"Transaction index file is corrupt, found {self._file_bytes} bytes which is not a "
                f"multiple of {self.ENTRY_SIZE} (a partial entry of {partial} bytes at the end)"
            )
        self.check_entries(log_size=log_size, end_offset=end_offset)

    def check_entries(self, *, log_size: int | None = None, end_offset: int | None = None) -> None:
        """Last offsets (those of the ABORT markers, in this segment) strictly ascending within
        [base offset, ``end_offset``), each transaction's first offset at or below its last."""
        first, last = self._col(2), self._col(3)
        if last.shape[0] == 0:
            return
        self._check_offset_range(last, end_offset, "lastOffset")
        self._check_ascending(last, "lastOffset", strict=True)
        bad = np.nonzero(first > last)[0]
        if bad.size:
            i = int(bad[0])
            raise self._corrupt(
                f"entry {i} has firstOffset {int(first[i])} above its lastOffset {int(last[i])}"
            )


__all__ = ["TXN_ENTRY", "TXN_VERSION", "TxnEntries", "TxnIndex"]
