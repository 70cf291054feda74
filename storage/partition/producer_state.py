"""Kafka producers' state in a log: idempotence, transactions, the ``.txnindex``, the last stable
offset, read_committed.

Kafka's ``ProducerStateManager`` keeps, per producer id, its epoch, its last data batches (five,
with their sequence ranges: an idempotent producer's retry of one is a duplicate) and its ongoing
transaction (the first offset of its first transactional batch since its last marker).
pylog rebuilds that state by scanning batch *headers* (and the one record of each control
batch) the first time a log needs it, then keeps it current on every append
(:func:`on_append`, called by ``Log._append``).  Kafka persists the state in ``.snapshot`` files
so a broker restart does not rescan; pylog does not write snapshots yet, so the first use per
process reads the log once (about the cost of reading it from the page cache).

The state serves:

- ``.txnindex``: when an ABORT marker ends a non-empty transaction, an entry
  ``(producerId, firstOffset, lastOffset = marker offset, lastStableOffset)`` is appended to
  the index of the segment holding the marker, as Kafka does.  A scan also repairs indexes
  that lack an entry (e.g. after recovery rebuilt a segment, which empties its txn index).
- the last stable offset (LSO): the first offset of the earliest ongoing transaction, else
  the high watermark (``Log.high_watermark``, the end of acknowledged data, else the LEO).
- ``read_committed`` reads: records below the LSO, without control records and without the
  batches of aborted transactions.
- the cleaner: aborted transactions and each active producer's last batch.

No clock is read here: expiry of idle producers takes ``now``.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.errors import CorruptRecordError, OffsetOutOfRangeError, PylogError
from pylog.storage.partition.segment import LogSegment


class LogView(Protocol):
    """What this module reads of a partition's log (:class:`pylog.storage.partition.log.Log`,
    which calls :func:`on_append` on every append, so this module sits below it)."""

    directory: str
    read_only: bool
    high_watermark: int | None
    segments: list[LogSegment]

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def iter_record_sets(
        self, start: int | None = None, end: int | None = None
    ) -> Iterator[records.RecordSet]: ...

    def read_table(self, start: int | None = None, end: int | None = None) -> pa.Table: ...


PRODUCER_ID_EXPIRATION_MS = 86_400_000
"""Kafka's ``producer.id.expiration.ms`` default: an idle producer without an open
transaction is forgotten this long after its last batch's max timestamp."""

EMPTY_CONTROL = -2
"""Control type reported for a control batch without records (one the cleaner emptied)."""

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"


KEPT_BATCHES = 5
"""Data batches remembered per producer (Kafka's ``ProducerStateEntry.NUM_BATCHES_TO_RETAIN``):
an idempotent producer's retry of one of them is recognised as a duplicate."""


@dataclass(frozen=True)
class BatchSequence:
    """An idempotent producer's data batch: its sequence range and offsets."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass
class ProducerEntry:
    """What the log says about one producer id."""

    epoch: int
    last_data_offset: int = -1  # last offset of its last data batch, -1 if none
    last_timestamp: int = -1  # max timestamp of its last batch
    txn_first_offset: int = -1  # first offset of its ongoing transaction, -1 if none
    batches: deque[BatchSequence] = field(default_factory=lambda: deque(maxlen=KEPT_BATCHES))
    """Its last data batches with a sequence (of its current epoch), oldest first."""


@dataclass(frozen=True)
class AbortedTxn:
    """One ``.txnindex`` entry."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@dataclass
class ProducerState:
    """Producers and transactions of a log up to ``end_offset`` (exclusive)."""

    end_offset: int = 0
    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest ongoing transaction, or None."""
        firsts = [e.txn_first_offset for e in self.producers.values() if e.txn_first_offset >= 0]
        return min(firsts) if firsts else None

    def active_producers(self, now: int) -> dict[int, ProducerEntry]:
        """Producers not expired at ``now`` (Kafka's ``isProducerExpired``)."""
        return {
            pid: e
            for pid, e in self.producers.items()
            if e.txn_first_offset >= 0 or now - e.last_timestamp < PRODUCER_ID_EXPIRATION_MS
        }

    def update(self, data: np.ndarray, h: B.BatchHeaders) -> list[AbortedTxn]:
        """Apply complete batches (``h`` positions relative to ``data``), in offset order;
        returns the aborted transactions their ABORT markers completed.  One step per batch
        that carries a producer id; batches without one only move ``end_offset``."""
        if len(h) == 0:
            return []
        self.end_offset = max(self.end_offset, int(h.last_offset[-1]) + 1)
        rows = np.nonzero((h.producer_id >= 0) & (h.magic >= 2))[0]
        if rows.size == 0:
            return []
        ctypes = control_types(data, h)
        completed: list[AbortedTxn] = []
        pid_a, epoch_a, ts_a = h.producer_id, h.producer_epoch, h.max_timestamp
        control_a, txn_a = h.is_control, h.is_transactional
        base_a, last_a, seq_a = h.base_offset, h.last_offset, h.base_sequence
        for i in rows.tolist():
            pid = int(pid_a[i])
            e = self.producers.get(pid)
            if e is None:
                e = self.producers[pid] = ProducerEntry(int(epoch_a[i]))
            if int(epoch_a[i]) != e.epoch:
                e.batches.clear()  # sequences start again with each epoch
            e.epoch = int(epoch_a[i])
            e.last_timestamp = int(ts_a[i])
            if control_a[i]:
                kind = int(ctypes[i])
                if kind in (B.ABORT, B.COMMIT) and e.txn_first_offset >= 0:
                    first, e.txn_first_offset = e.txn_first_offset, -1
                    if kind == B.ABORT:
                        marker = int(base_a[i])
                        others = [
                            o.txn_first_offset for o in self.producers.values() if o.txn_first_offset >= 0
                        ]
                        txn = AbortedTxn(pid, first, marker, min(others) if others else marker + 1)
                        self.aborted.append(txn)
                        completed.append(txn)
            else:
                e.last_data_offset = int(last_a[i])
                if seq_a[i] >= 0:
                    first_seq = int(seq_a[i])
                    last_seq = (first_seq + int(last_a[i] - base_a[i])) % (1 << 31)
                    e.batches.append(BatchSequence(first_seq, last_seq, int(base_a[i]), int(last_a[i])))
                if txn_a[i] and e.txn_first_offset < 0:
                    e.txn_first_offset = int(base_a[i])
        return completed


def control_types(data: np.ndarray, h: B.BatchHeaders) -> np.ndarray:
    """For each batch: the type of its control record (ABORT=0, COMMIT=1, ..., -1 unknown,
    ``EMPTY_CONTROL`` for a control batch without records), and -3 for data batches."""
    out = np.full(len(h), -3, np.int64)
    rows = np.nonzero(h.is_control & (h.magic >= 2))[0]
    if rows.size == 0:
        return out
    out[rows] = EMPTY_CONTROL
    rows = rows[h.records_count[rows] > 0]
    if rows.size == 0:
        return out
    from pylog.storage.codec.rewrite import walk

    sp = walk(data, h.take(rows))
    firsts = sp.first[:-1]
    klen = sp.key_len[firsts]
    bad = klen < B.CONTROL_KEY.size
    if bad.any():
        i = int(rows[np.argmax(bad)])
        raise CorruptRecordError(
            f"control batch at offset {int(h.base_offset[i])}: control record key has "
            f"{max(int(klen[np.argmax(bad)]), 0)} bytes, at least {B.CONTROL_KEY.size} are needed",
            position=int(h.position[i]),
        )
    kpos = sp.key_pos[firsts]
    raw = sp.buffer[kpos[:, None] + np.arange(4)].astype(np.int64)
    version = ((raw[:, 0] << 8) | raw[:, 1]).astype(np.int16)
    kind = ((raw[:, 2] << 8) | raw[:, 3]).astype(np.int16).astype(np.int64)
    if (version < 0).any():
        i = int(rows[np.argmax(version < 0)])
        raise CorruptRecordError(
            f"control batch at offset {int(h.base_offset[i])}: control record key has a negative version",
            position=int(h.position[i]),
        )
    out[rows] = np.where(np.isin(kind, list(B.CONTROL_TYPES)), kind, -1)
    return out


# ---------------------------------------------------------------------------- per-log state

_STATES: weakref.WeakKeyDictionary[LogView, ProducerState] = weakref.WeakKeyDictionary()


def state_of(log: LogView) -> ProducerState:
    """The producer state of ``log`` up to its end, scanning it the first time (and after a
    truncation); a writable log's ``.txnindex`` files are repaired by that scan."""
    leo = log.log_end_offset
    st = _STATES.get(log)
    if st is None or st.end_offset > leo:
        st = _STATES[log] = _scan(log, ProducerState(), upto=leo, repair=not log.read_only)
    elif st.end_offset < leo:
        _scan(log, st, upto=leo, repair=False, start=st.end_offset)
    return st


def forget(log: LogView) -> None:
    """Drop the cached state (it is rebuilt on next use)."""
    _STATES.pop(log, None)


def on_append(log: LogView, segment: LogSegment, data: np.ndarray, h: B.BatchHeaders) -> None:
    """Hook of ``Log._append``: batches ``h`` (positions relative to ``data``) were just
    appended to ``segment``.  Keeps the producer state current and appends the ``.txnindex``
    entries of the aborted transactions their markers complete."""
    if len(h) == 0:
        return
    st = _STATES.get(log)
    first = int(h.base_offset[0])
    if st is not None and st.end_offset > first:  # the log was truncated behind our back
        st = None
    if st is None:
        if not h.is_transactional.any():
            return  # nothing that must be indexed now; a later scan sees these batches
        st = _STATES[log] = _scan(log, ProducerState(), upto=first, repair=True)
    rel = h.take(slice(None))
    rel.position = h.position - int(h.position[0])
    for txn in st.update(data, rel):
        segment.txn_index.append(txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)


def on_link(log: LogView, end_offset: int) -> None:
    """Hook of a link of staged batches (none transactional: :mod:`staging` checks it) up to
    ``end_offset``: producer state stays current without reading them."""
    st = _STATES.get(log)
    if st is not None:
        st.end_offset = max(st.end_offset, end_offset)


HOP_MIN_BATCH = 64 << 10
"""Batches at least this large are scanned by reading their 61-byte header only."""


def _scan(log: LogView, st: ProducerState, *, upto: int, repair: bool, start: int = 0) -> ProducerState:
    found: dict[int, list[AbortedTxn]] = {}
    for i, seg in enumerate(log.segments):
        nxt = log.segments[i + 1].base_offset if i + 1 < len(log.segments) else None
        if (nxt is not None and nxt <= start) or seg.base_offset >= upto:
            continue
        pos = seg.offset_index.lookup(start)[1] if start > seg.base_offset else 0
        for data, h in _segment_batches(seg, pos):
            keep = (h.last_offset >= start) & (h.base_offset < upto)
            if keep.any():
                for txn in st.update(data, h.take(np.nonzero(keep)[0]) if not keep.all() else h):
                    found.setdefault(i, []).append(txn)
            if int(h.base_offset[-1]) >= upto:
                break
    st.end_offset = max(st.end_offset, upto)
    if repair:
        for i, txns in found.items():
            _repair_index(log.segments[i], txns, active=i == len(log.segments) - 1)
    return st


def _segment_batches(seg: LogSegment, pos: int) -> Iterator[tuple[np.ndarray, B.BatchHeaders]]:
    """(bytes, headers relative to them) of the segment's batches from ``pos``.  While data
    batches are large, only their headers are read (one read per batch; a control batch is read
    whole, its record says COMMIT or ABORT); from the first small one on, whole chunks are read."""
    size = seg.size
    while pos + B.HEADER_SIZE <= size:
        raw = B.as_uint8(seg.storage.read(seg.log_path, pos, pos + B.HEADER_SIZE))
        length = int.from_bytes(raw[8:12].tobytes(), "big", signed=True) + 12
        if int(raw[16]) < 2 or length < B.HEADER_SIZE or pos + length > size:
            break  # legacy, torn or corrupt: the chunked reader handles (or reports) it
        h = B.parse_headers(raw, np.zeros(1, np.int64), np.array([length]), np.array([2]))
        if bool(h.is_control[0]):  # a marker: small, read whole
            raw = B.as_uint8(seg.storage.read(seg.log_path, pos, pos + length))
        elif length < HOP_MIN_BATCH:
            break  # small data batches: reading chunks is cheaper than a read per batch
        yield raw, h
        pos += length
    for loc in seg.iter_batches(pos):
        rel = loc.headers.take(slice(None))
        rel.position = rel.position - loc.start
        yield loc.data, rel


def _repair_index(seg: LogSegment, txns: list[AbortedTxn], *, active: bool) -> None:
    idx = seg.txn_index
    e = idx.entries()
    have = set(e.last_offset.tolist())
    missing = [t for t in txns if t.last_offset not in have]
    if not missing:
        return
    rows = [
        AbortedTxn(int(p), int(f), int(la), int(ls))
        for p, f, la, ls in zip(
            e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset, strict=True
        )
    ]
    idx.reset()
    for t in sorted(rows + missing, key=lambda t: t.last_offset):
        idx.append(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
    idx.flush()
    if not active:
        idx.close()


# ---------------------------------------------------------------------------- reading


def last_stable_offset(log: LogView) -> int:
    """Kafka's LSO: the first offset of the earliest open transaction, else the high watermark
    (the log's acknowledged end when the log manager set one, else its end)."""
    first = state_of(log).first_unstable_offset()
    hw = log.log_end_offset if log.high_watermark is None else min(log.high_watermark, log.log_end_offset)
    return max(log.log_start_offset, hw if first is None else min(first, hw))


def aborted_transactions(log: LogView, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(producer ids, first offsets, last offsets) of the aborted transactions overlapping
    ``[start, end)``, from every segment's ``.txnindex`` and the producer state, sorted by
    first offset, without duplicates."""
    st = state_of(log)
    parts = [
        (
            np.array([t.producer_id for t in st.aborted], np.int64),
            np.array([t.first_offset for t in st.aborted], np.int64),
            np.array([t.last_offset for t in st.aborted], np.int64),
        )
    ]
    for seg in log.segments:
        e = seg.txn_index.entries()
        if e.last_offset.size:
            parts.append((e.producer_id, e.first_offset, e.last_offset))
    pid = np.concatenate([p[0] for p in parts])
    first = np.concatenate([p[1] for p in parts])
    last = np.concatenate([p[2] for p in parts])
    keep = (last >= start) & (first < end)
    pid, first, last = pid[keep], first[keep], last[keep]
    if pid.size == 0:
        return pid, first, last
    _, uniq = np.unique(np.stack([pid, last]), axis=1, return_index=True)
    order = uniq[np.argsort(first[uniq], kind="stable")]
    return pid[order], first[order], last[order]


def aborted_batches(h: B.BatchHeaders, aborted: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Which of the batches ``h`` are data of an aborted transaction (one step per producer
    id that has aborted transactions)."""
    out = np.zeros(len(h), bool)
    pid, first, last = aborted
    txn = h.is_transactional & ~h.is_control
    if pid.size == 0 or not txn.any():
        return out
    for p in np.intersect1d(np.unique(h.producer_id[txn]), pid).tolist():
        sel = pid == p
        f, la = first[sel], last[sel]
        order = np.argsort(f)
        f, la = f[order], la[order]
        rows = np.nonzero(txn & (h.producer_id == p))[0]
        j = np.searchsorted(f, h.base_offset[rows], side="right") - 1
        hit = (j >= 0) & (h.base_offset[rows] <= la[np.maximum(j, 0)])
        out[rows[hit]] = True
    return out


def read_table(
    log: LogView,
    start: int | None = None,
    end: int | None = None,
    *,
    isolation_level: str = READ_COMMITTED,
) -> pa.Table:
    """Records with offsets in ``[start, end)`` as an Arrow table (``records.RECORD_SCHEMA``).

    ``read_committed`` (Kafka's consumer isolation): only offsets below the last stable
    offset, without control records and without the records of aborted transactions.
    ``read_uncommitted``: every data record (``Log.read_table``)."""
    if isolation_level == READ_UNCOMMITTED:
        return log.read_table(start, end)
    if isolation_level != READ_COMMITTED:
        raise PylogError(
            f"unknown isolation level {isolation_level!r}: "
            f"expected {READ_COMMITTED!r} or {READ_UNCOMMITTED!r}"
        )
    lo = log.log_start_offset if start is None else start
    lso = last_stable_offset(log)
    hi = lso if end is None else min(end, lso)
    if not log.log_start_offset <= lo <= log.log_end_offset:
        raise OffsetOutOfRangeError(
            f"{log.directory}: offset {lo} is out of range [{log.log_start_offset}, {log.log_end_offset}]"
        )
    if hi <= lo:
        return records.RECORD_SCHEMA.empty_table()
    aborted = aborted_transactions(log, lo, hi)
    parts: list[pa.Table] = []
    for rs in log.iter_record_sets(lo, hi):
        drop = rs.batches.is_control | aborted_batches(rs.batches, aborted)
        off = rs.records.column("offset").to_numpy()
        keep = ~drop[rs.batch_index] & (off >= lo) & (off < hi)
        parts.append(rs.records if keep.all() else rs.records.filter(pa.array(keep)))
    return pa.concat_tables(parts) if parts else records.RECORD_SCHEMA.empty_table()
