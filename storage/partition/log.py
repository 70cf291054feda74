"""One topic-partition's log: a list of segments, the newest one active.

Kafka's ``UnifiedLog``/``LocalLog``: appends assign offsets from the log end offset (LEO) and
roll to a new segment on ``segment.bytes``, ``segment.ms`` (by record time, with jitter),
a full index, or a relative-offset overflow; reads find the floor segment with a binary search
over segment base offsets, then the index, then scan forward; timestamp lookups go through
the time indexes.  Recovery and loading live in :mod:`loader`.

Reading beside a writer (a lock-free reader while the writer compacts, merges and removes
segments) is :mod:`consistency`'s part of the class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pylog.storage.backends.base import Storage
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.codec.columns import record_timestamps_ms, to_binary_array
from pylog.storage.config import LogConfig
from pylog.storage.errors import (
    ConfigError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from pylog.storage.faults import Faults
from pylog.storage.partition import closed_list, layout, producer_state
from pylog.storage.partition.consistency import RELISTS as _RELISTS
from pylog.storage.partition.consistency import ConsistentReads, now_ms
from pylog.storage.partition.segment import LogSegment, fitting_batches
from pylog.storage.partition.segments import base_offsets, made_segments

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
DEFAULT_FETCH_BYTES = 8 << 20


def timestamp_type(config: LogConfig) -> int:
    """The timestamp type appended batches get: 1 (LogAppendTime: the append time replaces
    the producer's timestamps) or 0 (CreateTime), from ``message.timestamp.type``."""
    return 1 if config.message_timestamp_type == "LogAppendTime" else 0


def check_keys(config: LogConfig, key: Any, where: str) -> None:
    """A compacted topic (``cleanup.policy=compact``) refuses records without a key, as
    Kafka's broker does."""
    if not config.compact:
        return
    if key is None:
        raise InvalidOffsetError(f"{where}: compacted topic requires keys on every record")
    k = to_binary_array(key, "key")
    if k.null_count:
        raise InvalidOffsetError(
            f"{where}: compacted topic (cleanup.policy=compact) requires a key on every "
            f"record; {k.null_count} of {len(k)} records have a null key"
        )


@dataclass(frozen=True)
class AppendInfo:
    """What an append wrote."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    num_records: int
    num_batches: int
    num_bytes: int


@dataclass(frozen=True)
class TimestampOffset:
    offset: int
    timestamp: int


class Log(ConsistentReads):
    """A partition's log in ``directory`` (``<topic>-<partition>``) of ``storage``.

    Construct with :func:`pylog.storage.partition.loader.load_log` (which recovers the files), or
    :func:`pylog.storage.partition.loader.open_log`."""

    def __init__(
        self,
        storage: Storage,
        directory: str,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        read_only: bool = False,
    ):
        self.storage = storage
        self.directory = directory
        self.config = config
        self.segments = segments
        """By base offset, the last one active; as loaded by a writer, a :class:`SegmentList`
        (which makes each segment when first used; see :mod:`segments`)."""
        self._bases = base_offsets(segments)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.read_only = read_only
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._failed: BaseException | None = None
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.high_watermark: int | None = None
        """End of acknowledged data (set by the log manager); readers never go beyond it."""
        self.damage: list[layout.Damage] = []
        """Offsets found damaged when a reader opened the log (set by the log manager): reading
        them raises :class:`DamagedLogError`, and the log end offset covers them."""
        self._layout_checked: layout.Checked = set()
        self._dense: bool | None = None  # see offsets_dense
        self.faults = Faults()
        """The named steps of its multi-step changes, for fault injection (pylog.storage.faults)."""
        self._opened_ms = now_ms()  # (a read-only log's messages)
        self.relistings = 0
        """Times a read-only log listed its directory again because the files changed under it."""

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        """The offset after the last record; for a read-only log, capped at the high watermark
        (the end of acknowledged data, see :mod:`publish`), but not below a log start that
        the files reach: a reader's high watermark is the one of when its root was opened, and
        retention (bounded by the writer's newer one) may since have removed every segment up
        to beyond it."""
        if not self.read_only:
            return self.active.read_next_offset()
        leo = self._consistently(lambda segs: segs[-1].read_next_offset())
        if self.high_watermark is not None:
            leo = max(min(leo, self.high_watermark), min(leo, self.log_start_offset))
        return max([leo, *(d.end for d in self.damage)])

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    def _floor_index(self, offset: int) -> int:
        return max(0, int(np.searchsorted(self._bases, offset, side="right")) - 1)

    def _check_writable(self) -> None:
        if self.read_only:
            raise InvalidOffsetError(f"{self.directory}: log was opened read-only")
        if self._failed is not None:
            raise InvalidOffsetError(
                f"{self.directory}: an earlier write failed ({self._failed}); reopen the log"
            ) from self._failed

    # ------------------------------------------------------------------ append

    def append(
        self,
        value: Any,
        key: Any = None,
        timestamp: Any = None,
        headers: Any = None,
        *,
        codec: int | str | None = None,
        now: int | None = None,
        batch_bytes: int | None = None,
        **encode_kwargs: Any,
    ) -> AppendInfo:
        """Append records (Arrow arrays or sequences), assigning offsets from the LEO.

        Records are grouped into batches of about ``batch_bytes`` (default 1 MiB, capped by
        ``max.message.bytes``); smaller batches make single-offset reads cheaper.  ``timestamp``
        (None: now) is epoch milliseconds >= 0 or datetimes with a time zone, one for every
        record or one per record; a negative one is refused, as by Kafka's producer."""
        self._check_writable()
        now = now_ms() if now is None else now
        if codec is None:
            ct = self.config.compression_type
            codec = "none" if ct in ("producer", "uncompressed") else ct
        ts_type = timestamp_type(self.config)
        if ts_type == 1:
            timestamp = now
        elif timestamp is not None:  # the producer's check: no negative timestamp
            value = to_binary_array(value, "value")
            timestamp = record_timestamps_ms(timestamp, len(value))
        check_keys(self.config, key, self.directory)
        enc = records.encode(
            value,
            key,
            timestamp,
            headers,
            base_offset=self.log_end_offset,
            codec=codec,
            batch_bytes=min(batch_bytes or records.DEFAULT_BATCH_BYTES, self.config.max_message_bytes - 12),
            timestamp_type=ts_type,
            **encode_kwargs,
        )
        return self._append(enc.buffer, enc.batches, now)

    def append_batches(
        self, data: bytes | memoryview | np.ndarray, *, assign_offsets: bool = True, now: int | None = None
    ) -> AppendInfo:
        """Append encoded batches.  With ``assign_offsets`` their base offsets are rewritten to
        follow the LEO (as a partition leader does); otherwise they must already be above it
        and increasing (copying, replication, compaction output)."""
        self._check_writable()
        buf = np.array(B.as_uint8(data), copy=True)
        scan = B.scan_entries(buf, allow_torn_tail=False)
        h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
        if (h.magic < 2).any():
            raise InvalidOffsetError("only RecordBatch v2 (magic 2) can be appended")
        bad = np.nonzero(~B.verify_crcs(buf, h))[0]
        if bad.size:
            raise InvalidOffsetError(f"batch at byte {int(h.position[bad[0]])} fails its CRC")
        if assign_offsets:
            leo = self.log_end_offset
            deltas = np.concatenate([[0], np.cumsum(h.last_offset_delta[:-1] + 1)])
            new_base = leo + deltas
            buf[h.position[:, None] + np.arange(8)] = new_base.astype(">i8").view(np.uint8).reshape(-1, 8)
            h.base_offset = new_base
        else:
            prev = np.concatenate([[self.log_end_offset - 1], h.last_offset[:-1]])
            if (h.base_offset <= prev).any():
                i = int(np.argmax(h.base_offset <= prev))
                raise InvalidOffsetError(
                    f"{self.directory}: batch base offset {int(h.base_offset[i])} is not above "
                    f"{int(prev[i])} (log end offset {self.log_end_offset})"
                )
        return self._append(buf, h, now_ms() if now is None else now)

    def _append(self, data: np.ndarray, h: B.BatchHeaders, now: int) -> AppendInfo:
        n = len(h)
        if n == 0:
            leo = self.log_end_offset
            return AppendInfo(leo, leo - 1, -1, 0, 0, 0)
        too_big = np.nonzero(h.size > self.config.max_message_bytes)[0]
        if too_big.size:
            raise RecordTooLargeError(
                f"{self.directory}: a batch of {int(h.size[too_big[0]])} bytes exceeds max.message.bytes="
                f"{self.config.max_message_bytes}"
            )
        if (h.size > self.config.segment_bytes).any():
            raise RecordTooLargeError(
                f"{self.directory}: a batch is larger than segment.bytes={self.config.segment_bytes}"
            )
        i = 0
        try:
            while i < n:
                seg = self._maybe_roll(
                    int(h.size[i]), int(h.max_timestamp[i]), int(h.base_offset[i]), int(h.last_offset[i]), now
                )
                j = fitting_batches(seg, h, i, self.config.segment_bytes)
                part = h.take(slice(i, j))
                lo, hi = int(h.position[i]), int(h.position[j - 1] + h.size[j - 1])
                seg.append(data[lo:hi], part)
                producer_state.on_append(self, seg, data[lo:hi], part)  # producer state, .txnindex
                i = j
        except OSError as e:
            self._failed = e
            raise
        count = int(h.records_count.sum())
        self._unflushed_messages += count
        if (
            self._unflushed_messages >= self.config.flush_messages
            or now - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush(now=now)
        return AppendInfo(
            int(h.base_offset[0]),
            int(h.last_offset[-1]),
            int(h.max_timestamp.max()),
            count,
            n,
            int(h.size.sum()),
        )

    def _maybe_roll(
        self, batch_size: int, max_ts: int, first_offset: int, last_offset: int, now: int
    ) -> LogSegment:
        seg = self.active
        cfg = self.config
        reached_ms = False
        if seg.size > 0:
            base_ts = seg.rolling_based_timestamp
            if base_ts is None:
                first = next(seg.iter_batches(0, chunk=1 << 16), None)
                base_ts = int(first.headers.max_timestamp[0]) if first is not None else -1
                seg.rolling_based_timestamp = base_ts
            waited = max_ts - base_ts if base_ts >= 0 else now - seg.created_ms
            reached_ms = waited > cfg.max_segment_ms - _jitter(seg.base_offset, cfg)
        if (
            seg.size > cfg.segment_bytes - batch_size
            or reached_ms
            or seg.indexes_full()
            or not seg.can_convert_to_relative_offset(last_offset)
        ):
            return self.roll(max(first_offset, self.log_end_offset), now=now)
        return seg

    def roll(self, base_offset: int | None = None, *, now: int | None = None) -> LogSegment:
        """Start a new active segment at ``base_offset`` (default: the LEO)."""
        self._check_writable()
        leo = self.log_end_offset
        base = leo if base_offset is None else max(base_offset, leo)
        old = self.active
        if old.size == 0 and old.base_offset == base:
            return old
        if old.size == 0:  # an empty active segment is replaced, as Kafka does
            old.delete()
            self.segments.pop()
        else:
            old.on_become_inactive()
        self.faults.step("roll-old-closed")
        seg = LogSegment(
            self.storage, self.directory, base, self.config, created_ms=now_ms() if now is None else now
        )
        seg.open_for_append()
        self.faults.step("roll-new-created")
        self.segments.append(seg)
        self._bases = base_offsets(self.segments)
        self.recovery_point = max(self.recovery_point, old.read_next_offset() if old.size else 0)
        self.storage.fsync_dir(self.directory)
        self.faults.step("rolled")
        return seg

    def flush(self, *, now: int | None = None) -> None:
        """fsync every segment from the recovery point on; the recovery point becomes the LEO."""
        start = self._floor_index(self.recovery_point)
        for seg in self.segments[start:]:
            seg.flush()
        if any(seg.base_offset >= self.recovery_point for seg in self.segments[start:]):
            # a segment created since the last flush: its files' names are durable only once
            # the directory is fsynced (Kafka's LocalLog.flush; tests/reliability/test_power_loss.py)
            self.storage.fsync_dir(self.directory)
        self.recovery_point = self.log_end_offset
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms() if now is None else now

    # ------------------------------------------------------------------ reading

    def _check_range(self, offset: int) -> None:
        leo = self.log_end_offset
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRangeError(
                f"{self.directory}: offset {offset} is out of range [{self.log_start_offset}, {leo}]"
            )

    def read(
        self, offset: int, max_bytes: int = DEFAULT_FETCH_BYTES, *, max_offset: int | None = None
    ) -> tuple[int, memoryview]:
        """Whole batches from the one holding ``offset`` (the first at or after it, across
        gaps): (position in its segment, a read-only view of the bytes).  Empty at the LEO."""
        self._check_range(offset)
        for relists in range(_RELISTS + 1):
            got = self._fetch(offset, max_offset, max_bytes, bound_reads=False)
            crossed = got is None or got[0].base_offset > offset  # nothing in the offset's segment
            if crossed and self._hole_read(offset, relist=relists < _RELISTS):
                continue
            return (0, memoryview(b"")) if got is None else (got[1], got[2])
        raise self._unsettled(f"reading offset {offset}")

    def iter_record_sets(
        self, start: int | None = None, end: int | None = None, *, max_bytes: int = DEFAULT_FETCH_BYTES
    ) -> Iterator[records.RecordSet]:
        """Decoded record sets covering offsets [start, end) (records outside are trimmed
        by the caller; use :meth:`read_table` for exact bounds)."""
        offset = self.log_start_offset if start is None else start
        end = self.log_end_offset if end is None else min(end, self.log_end_offset)
        self._check_range(offset)
        self._check_damage(offset, end)
        relists = 0
        while offset < end:
            got = self._fetch(offset, end, max_bytes, bound_reads=True)
            if got is None:
                if not self.config.compact:  # offsets skipped: a renamed segment may hold them
                    problem = layout.gap_problem(self.segments, offset, self._layout_checked)
                    if problem is not None:
                        raise layout.damaged_log_error(self.directory, [problem], writer=False)
                if self._hole_read(offset, relist=relists < _RELISTS):
                    relists += 1
                    continue
                return
            rs = got[3]
            assert rs is not None
            if self._read_contradicts_names(got[0], offset, rs, relist=relists < _RELISTS):
                relists += 1
                continue  # the files changed under the read: read again on the fresh listing
            yield rs
            offset = int(rs.batches.last_offset[-1]) + 1

    def _hole_read(self, offset: int, *, relist: bool) -> bool:
        """A read found no batch at or after ``offset`` in the segment the offset falls in:
        raise :class:`DamagedLogError` when that segment ends below the next one's base offset in
        a log with dense offsets (acknowledged offsets no segment holds: a segment cut short or
        removed), rather than skip them.  A read-only log first lists its directory again: True
        when it changed (read again)."""
        if self.config.compact:
            return False
        segs = self.segments
        i = self._floor_index(offset)
        if not 0 <= i < len(segs) - 1 or segs[i].base_offset > offset or offset >= self.log_end_offset:
            return False  # (at or beyond the end of acknowledged data: nothing was skipped)
        problem = layout.hole_at(segs, i, self._layout_checked, self.offsets_dense)
        if problem is None:
            return False
        if self.read_only and relist and self._relist(refresh=True):
            return True
        raise layout.damaged_log_error(self.directory, [problem], writer=False)

    def _check_damage(self, start: int, end: int) -> None:
        hit = [d.problem for d in self.damage if d.start < end and start < d.end]
        if hit:
            raise layout.damaged_log_error(self.directory, hit, writer=False)

    def read_table(
        self, start: int | None = None, end: int | None = None, *, include_control: bool = False
    ) -> pa.Table:
        """Records with offsets in [start, end) as an Arrow table (records.RECORD_SCHEMA)."""
        lo = self.log_start_offset if start is None else start
        hi = self.log_end_offset if end is None else end
        parts = []
        for rs in self.iter_record_sets(lo, hi):
            t = rs.records if include_control else rs.data_records()
            off = t.column("offset").to_numpy()
            keep = (off >= lo) & (off < hi)
            parts.append(t if keep.all() else t.filter(pa.array(keep)))
        return pa.concat_tables(parts) if parts else records.RECORD_SCHEMA.empty_table()

    def offset_for_timestamp(self, timestamp: int) -> TimestampOffset | None:
        """Kafka's ListOffsets semantics: the earliest offset whose record timestamp is >=
        ``timestamp``; EARLIEST_TIMESTAMP / LATEST_TIMESTAMP / MAX_TIMESTAMP special targets."""
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, int | np.integer)
            or not -(2**63) <= timestamp < 2**63
        ):
            raise ConfigError(
                f"timestamp: expected epoch milliseconds, an integer in [{-(2**63)}, {2**63 - 1}], "
                f"got {timestamp!r}"
            )
        if timestamp == EARLIEST_TIMESTAMP:
            return TimestampOffset(self.log_start_offset, -1)
        if timestamp == LATEST_TIMESTAMP:
            return TimestampOffset(self.log_end_offset, -1)
        if timestamp == MAX_TIMESTAMP:
            return self._max_timestamp_offset()
        return self._consistently(lambda segs: self._search_timestamp(segs, timestamp), check=True)

    def _search_timestamp(self, segs: list[LogSegment], timestamp: int) -> TimestampOffset | None:
        largest = np.array([s.largest_timestamp for s in segs], dtype=np.int64)
        candidates = largest >= timestamp
        if self.read_only and candidates.size:
            # a reader knows only the time indexes on disk: the newest records of the active
            # segment (indexed every index.interval.bytes) and segments copied without indexes
            # are missing from them, so such segments are always searched
            candidates[-1] = True
            candidates |= largest < 0
        for i in np.nonzero(candidates)[0].tolist():
            found = segs[i].find_offset_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                return TimestampOffset(found[0], found[1])
        return None

    def _max_timestamp_offset(self) -> TimestampOffset | None:
        def search(segs: list[LogSegment]) -> TimestampOffset | None:
            largest = np.array([s.largest_timestamp for s in segs], dtype=np.int64)
            if largest.size == 0 or largest.max() < 0:
                return None
            seg = segs[int(np.argmax(largest))]
            return TimestampOffset(seg.offset_of_max_timestamp, seg.largest_timestamp)

        return self._consistently(search, check=True)

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> int:
        """Remove every record at or above ``offset`` (whole batches); returns bytes removed."""
        self._check_writable()
        if offset >= self.log_end_offset:
            return 0
        removed = 0
        deleted = False
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            seg = self.segments.pop()
            removed += seg.size
            seg.delete()
            deleted = True
        seg = self.active
        removed += seg.truncate_to(offset)
        if seg.base_offset >= offset and seg.size == 0 and seg.base_offset != offset:
            seg.delete()
            deleted = True
            self.segments[-1] = LogSegment(
                self.storage, self.directory, offset, self.config, created_ms=now_ms()
            )
        if deleted:
            # make the deletions durable: a segment file that comes back after a power loss
            # would shadow the offsets appended after the truncation (test_power_loss.py)
            self.storage.fsync_dir(self.directory)
        self._bases = base_offsets(self.segments)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        return removed

    # ------------------------------------------------------------------ replacing segments

    def replace_segments(
        self, new: list[LogSegment], old: list[LogSegment], *, now: int | None = None
    ) -> None:
        """Swap ``new`` segments (written completely under the ``.cleaned`` suffix) in for
        ``old`` ones, with Kafka's crash-safe protocol (``LocalLog.replaceSegments``):

        1. new ``.cleaned`` → ``.swap``, in descending base-offset order;
        2. old segments → ``.deleted`` (ascending), physical deletion after ``file.delete.delay.ms``;
        3. new ``.swap`` → final names;  4. fsync the directory.

        A crash before every new segment is ``.swap`` rolls back at the next load; after
        that it rolls forward (see :mod:`loader`)."""
        self._check_writable()
        now = now_ms() if now is None else now
        for seg in new:
            seg.flush()
            seg.close_files()
        self.storage.fsync_dir(self.directory)
        self.faults.step("cleaned-written")
        for seg in sorted(new, key=lambda s: -s.base_offset):
            seg.change_suffix(".swap")
            self.faults.step("renamed-swap")
        self.storage.fsync_dir(self.directory)
        self.faults.step("all-swap")
        old_ids = {id(s) for s in old}
        for seg in sorted(old, key=lambda s: s.base_offset):
            if not any(seg is s for s in self.segments):
                continue  # already removed by retention meanwhile (Kafka's existingOldSegments)
            seg.change_suffix(".deleted")
            self._pending_deletes.append((now + self.config.file_delete_delay_ms, seg))
            self.faults.step("renamed-deleted")
        for seg in sorted(new, key=lambda s: s.base_offset):
            seg.change_suffix("")
            self.faults.step("renamed-final")
        self.storage.fsync_dir(self.directory)
        kept = [s for s in self.segments if id(s) not in old_ids]
        self.segments = sorted(kept + list(new), key=lambda s: s.base_offset)
        self._bases = base_offsets(self.segments)
        self.faults.step("done")
        self.delete_pending(now)

    def delete_segments(self, segments: list[LogSegment], *, now: int | None = None) -> int:
        """Remove the oldest ``segments`` (a prefix of the log), as retention does: the log
        start offset moves to the first surviving segment, the files are renamed ``.deleted``
        and removed after ``file.delete.delay.ms``.  If every segment goes, an empty active
        segment is rolled first at the log end.  Returns the bytes removed."""
        self._check_writable()
        if not segments:
            return 0
        now = now_ms() if now is None else now
        n = len(segments)
        if [id(s) for s in self.segments[:n]] != [id(s) for s in segments]:
            raise InvalidOffsetError("only a prefix of the log's segments can be deleted")
        if n == len(self.segments):
            if self.active.size == 0:
                segments, n = segments[:-1], n - 1
            else:
                self.roll(now=now)
        removed = sum(s.size for s in segments)
        self.log_start_offset = max(self.log_start_offset, self.segments[n].base_offset)
        self.faults.step("log-start-advanced")
        for seg in segments:
            seg.change_suffix(".deleted")
            self._pending_deletes.append((now + self.config.file_delete_delay_ms, seg))
            self.faults.step("renamed-deleted")
        self.segments = self.segments[n:]
        self._bases = base_offsets(self.segments)
        self.storage.fsync_dir(self.directory)
        self.delete_pending(now)
        return removed

    def delete_pending(self, now: int | None = None, *, force: bool = False) -> int:
        """Physically delete ``.deleted`` segments whose delay has passed; returns how many."""
        now = now_ms() if now is None else now
        due = [(t, s) for t, s in self._pending_deletes if force or t <= now]
        for _, seg in due:
            seg.delete()
        self._pending_deletes = [(t, s) for t, s in self._pending_deletes if not (force or t <= now)]
        return len(due)

    def take_pending_deletes(self) -> list[LogSegment]:
        """The ``.deleted`` segments waiting for their deletion, which this log then forgets:
        the caller deletes them (after releasing the writer lock, say; the next writer's
        recovery removes any that are left)."""
        out = [s for _, s in self._pending_deletes]
        self._pending_deletes = []
        return out

    def close(self) -> None:
        if not self.read_only and self._failed is None:
            self.flush()
            self.active.time_index.maybe_append(
                self.active.max_timestamp_so_far, self.active.offset_of_max_timestamp, skip_full_check=True
            )
        for seg in made_segments(self.segments):  # (a segment never made has no file open)
            seg.close_files()
        self.delete_pending(force=True)
        if not self.read_only and self._failed is None:  # the next writer then lists nothing
            closed_list.leave(self.storage, self.directory, self.segments)


def _jitter(base_offset: int, config: LogConfig) -> int:
    """Kafka's per-segment roll jitter: random in [0, min(segment.jitter.ms, segment.ms)),
    here derived from the base offset so that it is stable across reopens."""
    bound = min(config.segment_jitter_ms, config.segment_ms)
    if bound <= 0:
        return 0
    return int((base_offset * 0x9E3779B97F4A7C15) % (2**61 - 1)) % bound
