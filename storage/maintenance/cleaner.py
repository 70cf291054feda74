"""The log cleaner (compaction): Kafka's ``LogCleaner`` and ``LogCleanerManager`` for one process.

A compacted log (``cleanup.policy`` includes ``compact``) is split by its cleaner checkpoint
(``cleaner-offset-checkpoint``: the first dirty offset) into a clean head and a dirty tail.
One cleaning pass:

1. **Range.** ``first_dirty`` is the checkpoint, reset to the log start offset when it lies
   outside ``[log start, LEO]``.  The first uncleanable offset is the smallest of the last
   stable offset, the active segment's base, and (``min.compaction.lag.ms`` > 0) the base of
   the first dirty segment with a record younger than the lag; it is rounded down to its
   segment's base.  ``dirty ratio = dirty bytes / (clean + dirty bytes)``; a log is cleaned when
   the ratio exceeds ``min.cleanable.dirty.ratio`` or a dirty segment is older than
   ``max.compaction.lag.ms``, the filthiest log first.
2. **Offset map.** The dirty segments are read and every keyed record of a non-aborted data
   batch is put in the :class:`~pylog.storage.maintenance.offset_map.OffsetMap` (key hash -> offset),
   whole chunks at a time.  When the map is full the pass covers only the records read so
   far; the rest waits for the next pass (Kafka's partial cleaning; every pass maps at least
   one record, so cleaning always progresses).  ``end = latest mapped offset + 1`` becomes the
   new checkpoint.
3. **Rewrite.** Every segment below ``end`` (clean ones too) is regrouped, within
   ``segment.bytes``, ``segment.index.bytes`` and 2^31-1 relative offsets counting what the
   pass keeps of each segment (Kafka counts the old sizes), and each group is rewritten into
   one ``.cleaned`` segment that replaces it through ``.cleaned`` -> ``.swap`` -> ``.deleted``
   (``Log.replace_segments``; recovery completes or discards a half-done swap).
   A record is kept when it is beyond the map's range, or it is the latest offset of its key
   and has a value or is a tombstone whose batch has no delete horizon yet or one still in the
   future.  (A dirty record is the latest of its key exactly when its offset is one of the
   map's values, a sorted-array lookup; only records of the clean head are hashed again.)
   Records without a key go.  Batches of aborted transactions go; control batches go
   once their transaction has no data left and their delete horizon has passed (two passes:
   the first stamps the horizon).  A batch that loses every record is dropped unless it is an
   active producer's last batch or ends right before the first uncleanable offset: then it
   stays as an empty batch, so producer sequences and the log end survive.

The hot loops (walking records, hashing keys, the map, writing batches) are compiled kernels
over whole chunks; Python steps once per chunk, batch with a producer id, or segment.
No clock decides anything: every decision takes ``now``.  With
``log.cleaner.io.max.bytes.per.second`` set, a :class:`Throttler` paces a pass's reads (offset
map and rewrite) plus writes, sleeping whenever it is ahead of the rate; its clock and sleep are
the :class:`Cleaner`'s (injectable, so a test can check the pacing without sleeping).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pylog.storage.codec import batch as B
from pylog.storage.codec import rewrite
from pylog.storage.config import INT32_MAX, INT64_MAX, CleanerConfig
from pylog.storage.maintenance.cleanable import (
    LogToClean,
    first_dirty_offset,
    first_uncleanable_offset,
    fits_group,
    group_segments_by_size,
    last_offset_bound,
    log_to_clean,
    max_compaction_delay,
)
from pylog.storage.maintenance.offset_map import OffsetMap, hash_spans
from pylog.storage.maintenance.segment_reads import prefetched, walked
from pylog.storage.maintenance.throttle import Clock, Sleep, Throttler
from pylog.storage.partition import producer_state
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment
from pylog.storage.partition.txnindex import TxnIndex

Progress = Callable[[int], None]
"""Called with the number of bytes just processed."""


# ============================================================================ transactions


class TxnTracker:
    """Kafka's ``CleanedTransactionMetadata``: which transactional batches and markers a pass
    may discard.  ``aborted`` = (producer ids, first offsets, last offsets, last stable offsets)
    sorted by first offset."""

    def __init__(self, aborted: tuple[np.ndarray, ...]):
        self._aborted = aborted
        self._next = 0
        self._ongoing_aborted: dict[int, list[int]] = {}  # pid -> [row in aborted, last observed]
        self._ongoing_committed: set[int] = set()
        self.cleaned_index: TxnIndex | None = None

    def _consume_up_to(self, offset: int) -> None:
        pid, first = self._aborted[0], self._aborted[1]
        while self._next < pid.shape[0] and first[self._next] <= offset:
            self._ongoing_aborted.setdefault(int(pid[self._next]), [self._next, -1])
            self._next += 1

    def on_batches(self, h: B.BatchHeaders, ctypes: np.ndarray) -> np.ndarray:
        """``canDiscardBatch`` for each batch, in order (one step per transactional batch)."""
        out = np.zeros(len(h), bool)
        for i in np.nonzero(h.is_transactional | h.is_control)[0].tolist():
            self._consume_up_to(int(h.last_offset[i]))
            pid = int(h.producer_id[i])
            if h.is_control[i]:
                kind = int(ctypes[i])
                if kind == producer_state.EMPTY_CONTROL:
                    out[i] = True
                elif kind == B.ABORT:
                    meta = self._ongoing_aborted.pop(pid, None)
                    if meta is not None and meta[1] >= 0:
                        if self.cleaned_index is not None:
                            row = meta[0]
                            p, f, la, ls = (int(a[row]) for a in self._aborted)
                            self.cleaned_index.append(p, f, la, ls)
                    else:
                        out[i] = True
                elif kind == B.COMMIT:
                    out[i] = pid not in self._ongoing_committed
                    self._ongoing_committed.discard(pid)
            else:
                meta = self._ongoing_aborted.get(pid)
                if meta is not None:
                    meta[1] = int(h.last_offset[i])
                    out[i] = True
                else:
                    self._ongoing_committed.add(pid)
        return out


def _aborted_with_lso(log: Log, start: int, end: int) -> tuple[np.ndarray, ...]:
    pid, first, last = producer_state.aborted_transactions(log, start, end)
    lso_by_key = {
        (t.producer_id, t.last_offset): t.last_stable_offset for t in producer_state.state_of(log).aborted
    }
    for seg in log.segments:
        e = seg.txn_index.entries()
        for p, la, ls in zip(
            e.producer_id.tolist(), e.last_offset.tolist(), e.last_stable_offset.tolist(), strict=True
        ):
            lso_by_key[(p, la)] = ls
    lso = [lso_by_key.get((int(p), int(la)), int(la) + 1) for p, la in zip(pid, last, strict=True)]
    return pid, first, last, np.array(lso, dtype=np.int64)


def _control_types_of(sp: rewrite.Spans) -> np.ndarray:
    """Control record type per batch of walked spans (``producer_state.control_types``; the
    spans' buffer starts with the batches' bytes)."""
    return producer_state.control_types(sp.buffer, sp.headers)


# ============================================================================ cleaning


@dataclass
class CleanResult:
    """What one cleaning pass of one log did."""

    directory: str
    first_dirty_offset: int
    end_offset: int  # the new cleaner checkpoint
    first_uncleanable_offset: int
    map_full: bool = False
    groups: int = 0
    segments_replaced: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    batches_read: int = 0
    batches_retained: int = 0
    map_records: int = 0
    map_keys: int = 0
    new_segments: list[int] = field(default_factory=list)
    throttled_s: float = 0.0  # slept to stay within log.cleaner.io.max.bytes.per.second
    staged: list[tuple[LogSegment, list[LogSegment]]] = field(default_factory=list)
    """With ``stage``: each group's new segment (under the stage suffix) and the segments it is
    to replace, for the caller to swap in (:mod:`pylog.storage.maintenance.detached`)."""

    @property
    def records_removed(self) -> int:
        return self.records_read - self.records_retained

    @property
    def bytes_removed(self) -> int:
        return self.bytes_read - self.bytes_written


class Cleaner:
    """Cleans compacted logs; owns the offset map (``log.cleaner.dedupe.buffer.size``) and
    remembers logs found corrupt (``uncleanable``: directory -> reason), as Kafka does until a
    restart.  ``clock`` and ``sleep`` pace ``log.cleaner.io.max.bytes.per.second`` (see
    :class:`Throttler`); they are not used when no limit is set."""

    def __init__(
        self, config: CleanerConfig | None = None, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep
    ):
        self.config = config or CleanerConfig()
        self.clock, self.sleep = clock, sleep
        self._map: OffsetMap | None = None
        self.uncleanable: dict[str, str] = {}
        self._verified: dict[str, tuple[int, int]] = {}  # segment -> file range checked this pass

    @property
    def offset_map(self) -> OffsetMap:
        if self._map is None:
            memory = min(self.config.dedupe_buffer_size, INT32_MAX)  # Kafka caps it at 2 GiB
            self._map = OffsetMap(memory, self.config.dedupe_buffer_load_factor)
        return self._map

    def clean(
        self,
        log: Log,
        *,
        now: int,
        first_dirty: int | None = None,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        stage: str | None = None,
    ) -> CleanResult:
        """One cleaning pass over ``log`` from ``first_dirty`` (default: the log start offset;
        out-of-range values are reset).  ``should_stop`` is polled while the offset map is
        built: answering True ends the map there (a partial pass that still progresses).
        The pass's reads and writes are throttled to ``log.cleaner.io.max.bytes.per.second``.

        With ``stage`` (a file suffix) nothing in the log changes: each group's new segment is
        written under that suffix and listed in ``result.staged``; ``log`` may then be a
        read-only log beside a writer."""
        ltc = log_to_clean(log, first_dirty, now)
        upper = ltc.first_uncleanable_offset
        start = ltc.first_dirty_offset
        result = CleanResult(log.directory, start, start, upper)
        if start >= upper:
            return result
        omap = self.offset_map
        throttle = (
            Throttler(self.config.io_max_bytes_per_second, clock=self.clock, sleep=self.sleep)
            if self.config.throttled
            else None
        )
        self._clean(log, now, start, upper, omap, result, progress, should_stop, throttle, stage)
        if throttle is not None:
            result.throttled_s = throttle.slept_s
        return result

    def _clean(
        self,
        log: Log,
        now: int,
        start: int,
        upper: int,
        omap: OffsetMap,
        result: CleanResult,
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
        throttle: Throttler | None,
        stage: str | None = None,
    ) -> None:
        self._build_offset_map(log, start, upper, omap, result, progress, should_stop, throttle)
        end = omap.latest_offset + 1
        result.end_offset = end
        segments = [s for s in log.segments[:-1] if s.base_offset < end]
        if not segments:
            return
        active = producer_state.state_of(log).active_producers(now)
        pids = np.array(sorted(active), dtype=np.int64)
        last_data = np.array([active[p].last_data_offset for p in pids.tolist()], dtype=np.int64)
        epochs = np.array([active[p].epoch for p in pids.tolist()], dtype=np.int64)
        tracker = TxnTracker(_aborted_with_lso(log, segments[0].base_offset, upper))
        clean_prefix = [s for s in log.segments if s.base_offset < start]  # Kafka: logSegments(0, firstDirty)
        legacy_horizon = (
            clean_prefix[-1].largest_timestamp if clean_prefix else 0
        ) - log.config.delete_retention_ms
        mapped = omap.offsets()  # 8 bytes per mapped key while the segments are rewritten
        rule = _Rule(
            omap,
            now,
            log.config.delete_retention_ms,
            upper,
            pids,
            last_data,
            epochs,
            legacy_horizon,
            start,
            mapped,
        )
        i = 0
        while i < len(segments):
            i = self._clean_group(
                log, segments, i, upper, rule, tracker, result, progress, now, throttle, stage
            )

    # ------------------------------------------------------------------ offset map

    def _build_offset_map(
        self,
        log: Log,
        start: int,
        upper: int,
        omap: OffsetMap,
        result: CleanResult,
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
        throttle: Throttler | None = None,
    ) -> None:
        omap.clear()
        omap.latest_offset = start - 1
        self._verified.clear()
        tracker = TxnTracker(_aborted_with_lso(log, start, upper))
        segs = log.segments
        for i, seg in enumerate(segs[:-1]):
            nxt = segs[i + 1].base_offset
            if nxt <= start or seg.base_offset >= upper:
                continue
            pos = seg.offset_index.lookup(start)[1] if start > seg.base_offset else 0
            for loc, sp in prefetched(walked(seg, pos, None)):
                self._verified[seg.log_path] = (pos, loc.start + int(loc.data.shape[0]))
                h = sp.headers
                discard = tracker.on_batches(h, _control_types_of(sp))
                bidx = sp.batch_index
                sel = np.nonzero((sp.key_len >= 0) & (sp.offset >= start) & ~(discard | h.is_control)[bidx])[
                    0
                ]
                h1, h2 = hash_spans(sp.buffer, sp.key_pos[sel], sp.key_len[sel])
                put = omap.put_hashes(h1, h2, sp.offset[sel])
                result.map_records += put
                if progress is not None:
                    progress(int(h.size.sum()))
                if throttle is not None:
                    throttle(int(h.size.sum()))
                if put < sel.shape[0]:
                    omap.latest_offset = max(omap.latest_offset, int(sp.offset[sel[put]]) - 1)
                    result.map_full = True
                    result.map_keys = omap.size
                    return
                reached = h.last_offset[h.last_offset >= start]
                if reached.size:
                    omap.latest_offset = max(omap.latest_offset, int(reached[-1]))
                if should_stop is not None and should_stop() and omap.latest_offset >= start:
                    result.map_full = True
                    result.map_keys = omap.size
                    return
            omap.latest_offset = max(omap.latest_offset, min(nxt, upper) - 1)
        result.map_keys = omap.size

    # ------------------------------------------------------------------ rewriting

    def _clean_group(
        self,
        log: Log,
        segments: list[LogSegment],
        first: int,
        upper: int,
        rule: _Rule,
        tracker: TxnTracker,
        result: CleanResult,
        progress: Progress | None,
        now: int,
        throttle: Throttler | None = None,
        stage: str | None = None,
    ) -> int:
        """Rewrite ``segments[first]`` and as many of the segments after it as fit into one new
        segment; returns the index of the first segment left for the next group.

        A group is decided as it is written: the next segment joins when the bytes and index
        entries kept so far plus the whole of that segment fit ``segment.bytes`` and
        ``segment.index.bytes`` (and its offsets the group's 32-bit relative offsets).  Kafka
        plans its groups from the segments' sizes before cleaning, so a log that compacts to a
        few percent keeps one (nearly empty) segment per old segment until a later pass merges
        them; grouping by what is kept makes that one segment now, with the same limits."""
        cfg = log.config
        base = segments[first].base_offset
        suffix = stage or ".cleaned"
        LogSegment(log.storage, log.directory, base, cfg, suffix=suffix).delete()  # leftovers
        cleaned = LogSegment(log.storage, log.directory, base, cfg, suffix=suffix, created_ms=now)
        group: list[LogSegment] = []
        i = first
        try:
            cleaned.open_for_append()
            tracker.cleaned_index = cleaned.txn_index
            while i < len(segments) and (
                not group
                or fits_group(
                    base,
                    cleaned.size,
                    # once something is kept, the next segment's first kept batch may take an
                    # index entry its old segment did not have (the bytes since the last entry
                    # carry over): one more
                    len(cleaned.offset_index) + int(cleaned.size > 0),
                    len(cleaned.time_index) + int(cleaned.size > 0),
                    segments[i],
                    last_offset_bound(segments, i, upper),
                    cfg.segment_bytes,
                    cfg.segment_index_bytes,
                )
            ):
                self._clean_segment(segments[i], cleaned, rule, tracker, result, progress, throttle)
                group.append(segments[i])
                i += 1
            cleaned.on_become_inactive()
        except BaseException:
            cleaned.delete()
            raise
        finally:
            tracker.cleaned_index = None
        if stage is None:
            log.replace_segments([cleaned], group, now=now)
        else:
            cleaned.flush()
            cleaned.close_files()
            result.staged.append((cleaned, group))
        result.groups += 1
        result.segments_replaced += len(group)
        result.new_segments.append(base)
        return i

    def _clean_segment(
        self,
        seg: LogSegment,
        cleaned: LogSegment,
        rule: _Rule,
        tracker: TxnTracker,
        result: CleanResult,
        progress: Progress | None,
        throttle: Throttler | None,
    ) -> None:
        trusted = self._verified.get(seg.log_path)  # CRCs checked while mapping
        for _, sp in prefetched(walked(seg, 0, trusted)):
            can_discard = tracker.on_batches(sp.headers, _control_types_of(sp))
            keep, action, horizon = rule.decide(sp, can_discard, seg)
            out, oh = rewrite.rebuild(sp, keep, action, horizon)
            if len(oh):
                cleaned.append(out, oh)
            result.bytes_read += int(sp.headers.size.sum())
            result.bytes_written += int(out.shape[0])
            result.records_read += len(sp)
            result.records_retained += int(oh.records_count.sum())
            result.batches_read += len(sp.headers)
            result.batches_retained += len(oh)
            if progress is not None:
                progress(int(sp.headers.size.sum()))
            if throttle is not None:
                throttle(int(sp.headers.size.sum()) + int(out.shape[0]))


@dataclass
class _Rule:
    """The retain/discard decisions of a pass (Kafka's ``checkBatchRetention`` and
    ``shouldRetainRecord``), vectorized over the batches and records of a chunk."""

    omap: OffsetMap
    now: int
    delete_retention_ms: int
    upper: int  # first uncleanable offset: the batch ending right before it stays, even empty
    pids: np.ndarray  # active producers, sorted
    last_data: np.ndarray
    epochs: np.ndarray
    legacy_horizon: int
    first_dirty: int
    mapped: np.ndarray  # the map's offsets, sorted: the latest offset of every mapped key

    def decide(
        self, sp: rewrite.Spans, can_discard: np.ndarray, seg: LogSegment
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        h = sp.headers
        nb = len(h)
        control = h.is_control
        v2 = h.magic >= 2
        horizon_passed = h.has_delete_horizon & (h.base_timestamp <= self.now)
        discard_records = np.where(control, can_discard & horizon_passed, can_discard)
        retain_empty = self._last_of_producer(h) | (h.last_offset + 1 == self.upper)
        bidx = sp.batch_index
        latest = self.omap.latest_offset
        if discard_records.any() or control.any():
            discarded = discard_records[bidx]
            keep = ~discarded & (control[bidx] | (sp.offset > latest))
            look = np.nonzero(~keep & ~discarded & (sp.key_len >= 0))[0]
        else:  # the common case: plain data batches
            keep = sp.offset > latest
            look = np.nonzero(~keep & (sp.key_len >= 0))[0]
        if look.size:
            found = np.empty(look.shape[0], np.int64)
            dirty = sp.offset[look] >= self.first_dirty
            # dirty records: the latest offset of a key is one of the map's values (no hashing)
            found[dirty] = np.where(
                _members(self.mapped, sp.offset[look[dirty]]), sp.offset[look[dirty]], INT64_MAX
            )
            clean = look[~dirty]  # the clean head: look the key up
            if clean.size:
                h1, h2 = hash_spans(sp.buffer, sp.key_pos[clean], sp.key_len[clean])
                found[~dirty] = self.omap.get_hashes(h1, h2)
            tomb_ok = np.where(
                v2,
                ~h.has_delete_horizon | (self.now < h.base_timestamp),
                seg.largest_timestamp > self.legacy_horizon,
            )
            b = bidx[look]
            keep[look] = (sp.offset[look] >= found) & ((sp.val_len[look] >= 0) | tomb_ok[b])
        kept = np.bincount(bidx[keep], minlength=nb)
        tombstones = np.bincount(bidx[keep & (sp.val_len < 0)], minlength=nb) > 0
        need_horizon = v2 & (tombstones | (can_discard & control)) & ~h.has_delete_horizon
        action = np.full(nb, rewrite.DROP, np.int64)
        delete = discard_records & ~retain_empty
        has = (kept > 0) & ~delete
        action[has] = rewrite.REBUILD
        action[has & (kept == h.records_count) & ~need_horizon] = rewrite.COPY
        action[(kept == 0) & retain_empty] = rewrite.EMPTY
        horizon = np.where(
            need_horizon,
            self.now + self.delete_retention_ms,
            np.where(h.has_delete_horizon, h.base_timestamp, -1),
        )
        return keep, action, horizon

    def _last_of_producer(self, h: B.BatchHeaders) -> np.ndarray:
        out = np.zeros(len(h), bool)
        rows = np.nonzero(h.producer_id >= 0)[0]
        if rows.size == 0 or self.pids.size == 0:
            return out
        j = np.searchsorted(self.pids, h.producer_id[rows])
        j = np.minimum(j, self.pids.shape[0] - 1)
        known = self.pids[j] == h.producer_id[rows]
        last = self.last_data[j]
        hit = known & np.where(
            last >= 0,
            h.last_offset[rows] == last,
            h.is_control[rows] & (h.producer_epoch[rows] == self.epochs[j]),
        )
        out[rows[hit]] = True
        return out


def _members(sorted_values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Which elements of the increasing array ``x`` are in ``sorted_values``."""
    if sorted_values.size == 0 or x.size == 0:
        return np.zeros(x.shape[0], bool)
    lo, hi = np.searchsorted(sorted_values, [x[0], x[-1]], side="left")
    sub = sorted_values[lo : max(hi + 1, lo)]
    if sub.size == 0:
        return np.zeros(x.shape[0], bool)
    i = np.minimum(np.searchsorted(sub, x), sub.shape[0] - 1)
    return sub[i] == x


__all__ = [
    "CleanResult",
    "Cleaner",
    "LogToClean",
    "Throttler",
    "TxnTracker",
    "first_dirty_offset",
    "first_uncleanable_offset",
    "group_segments_by_size",
    "log_to_clean",
    "max_compaction_delay",
]
