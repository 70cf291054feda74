"""Repairing the damaged partitions of a root: ``pylog recover``, :meth:`Root.recover`.

A writer refuses a damaged log (:class:`DamagedLogError`, see :mod:`~pylog.storage.root.writer`).
:func:`plan_repair` and :func:`apply_repair` make it writable again, and find the damage a writer
does not look for (a bad CRC or a batch cut short in a segment recovery does not scan): a
misnamed segment is renamed after its first batch and a bogus log-start checkpoint entry
dropped, which lose nothing; removing a segment whose offsets another one holds, ending the log
at its first invalid byte or at offsets no segment holds, or lowering the high watermark to the
log end, lose data and are only done when that is accepted.  :class:`Repairs` is the ``Root``
side (the ``recover`` method: a mixin, as ``Transactions`` and ``TableReading`` are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pylog.storage.backends.base import Storage
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptRecordError, DamagedLogError, PylogError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition import layout
from pylog.storage.partition.loader import load_log
from pylog.storage.partition.log import Log
from pylog.storage.partition.segment import LogSegment, relative_headers, segment_name
from pylog.storage.root import publish as pub
from pylog.storage.root.metadata import partition_dir
from pylog.storage.root.txn import mutation
from pylog.storage.root.writer import naming_io_errors

__all__ = ["Repair", "Repairs", "apply_repair", "plan_repair"]


class _Writer(Protocol):
    """What :class:`Repairs` uses of the ``Root`` it is mixed into."""

    storage: Storage
    _logs: dict[tuple[str, int], Log]
    _start_offsets: dict[tuple[str, int], int]
    _state: pub.PublishState

    def _ensure_writer(self) -> None: ...
    def topics(self) -> list[str]: ...
    def partitions(self, topic: str) -> int: ...
    def config(self, topic: str) -> LogConfig: ...
    def log(self, topic: str, partition: int) -> Log: ...
    def high_watermark(self, topic: str, partition: int) -> int | None: ...
    def checkpoint(self) -> None: ...
    def _repair(self, topic: str, partition: int, accept_data_loss: bool) -> Repair | None: ...


class Repairs:
    """The repair API of :class:`~pylog.storage.root.manager.Root` (a mixin)."""

    @mutation
    def recover(self: _Writer, *, accept_data_loss: bool = False) -> list[Repair]:
        """Open every partition as the writer (recovering what a crash left, see
        :attr:`recoveries`) and repair the damaged ones (:class:`DamagedLogError`: files removed,
        renamed or copied from outside; see :mod:`~pylog.storage.root.writer` and this module).

        Every batch of every partition is read and checked (CRC, offsets increasing, segments
        reaching each other), also where a writer opens the log without complaint: recovery
        after a clean shutdown scans no segment but the active one's tail, and a bad CRC in an
        older segment is found here (or by ``pylog verify``, or the read that reaches it).

        A repair that loses nothing (renaming a misnamed segment, dropping a log-start
        checkpoint entry beyond the end) is applied.  One that loses data (removing a segment
        whose offsets another one holds, ending the log at its first invalid byte or at offsets
        no segment holds, lowering the high watermark to the log end) is applied only with
        ``accept_data_loss``; otherwise it is returned unapplied, stating in ``lost`` what it
        would lose, and the partition stays damaged.  Returns the repairs of the damaged
        partitions (empty: none was damaged)."""
        self._ensure_writer()
        repairs = []
        for topic in self.topics():
            for p in range(self.partitions(topic)):
                repair = self._repair(topic, p, accept_data_loss)
                if repair is not None:
                    repairs.append(repair)
        self.checkpoint()
        return repairs

    def _repair(self: _Writer, topic: str, partition: int, accept_data_loss: bool) -> Repair | None:
        key = (topic, partition)
        first: Repair | None = None
        for _ in range(3):  # recovery may find invalid bytes once the names are right: plan again
            try:
                lg = self.log(topic, partition)
            except DamagedLogError as e:
                plan = plan_repair(
                    self.storage,
                    topic,
                    partition,
                    self.config(topic),
                    problems=e.problems,
                    log_start_offset=self._start_offsets.get(key, 0),
                    high_watermark=self.high_watermark(*key),
                )
            else:  # every batch checked: damage that recovery after a clean shutdown does not see
                plan = plan_repair(
                    self.storage,
                    topic,
                    partition,
                    self.config(topic),
                    problems=[],
                    log_start_offset=self._start_offsets.get(key, 0),
                    high_watermark=self.high_watermark(*key),
                    segments=lg.segments,
                )
                if not plan.describe():
                    return first
                if accept_data_loss or not plan.lost:  # (else reported below, the log left open)
                    self._logs.pop(key).close()  # before its files change; reopened below
            if first is not None:  # a second round: report its steps with the first
                first.problems += plan.problems
                first.renames += plan.renames
                first.removals += plan.removals
                first.cut = plan.cut or first.cut
                first.lost += plan.lost
                first.lost_records += plan.lost_records
                first.lost_offsets += plan.lost_offsets
                first.reset_log_start = first.reset_log_start or plan.reset_log_start
                if plan.high_watermark is not None:
                    old = first.high_watermark[0] if first.high_watermark else plan.high_watermark[0]
                    first.high_watermark = (old, plan.high_watermark[1])
            first = first or plan
            if plan.lost and not accept_data_loss:
                first.applied = False
                return first
            apply_repair(self.storage, plan)
            if plan.reset_log_start is not None:
                self._start_offsets.pop(key, None)
                self.checkpoint()
            if plan.high_watermark is not None:
                self._state.high_watermarks[key] = plan.high_watermark[1]
                pub.write_state(self.storage, self._state)
            first.applied = True
        self.log(topic, partition)  # still damaged: raises
        return first


@dataclass
class Repair:
    """What ``pylog recover`` does to make a damaged partition writable again, and what that
    loses (``lost`` empty: nothing).  File paths are relative to the root."""

    topic: str
    partition: int
    problems: list[str]
    """What is wrong (the :class:`DamagedLogError`'s problems)."""
    renames: list[tuple[str, str]] = field(default_factory=list)
    """``.log`` files renamed after their first batch (their offset indexes are rebuilt)."""
    removals: list[str] = field(default_factory=list)
    """``.log`` files removed with their indexes."""
    cut: tuple[str, int] | None = None
    """(``.log`` file, size): the file truncated to its valid batches (invalid bytes from there on:
    a bad CRC, offsets out of order, a batch cut short), its indexes rebuilt."""
    reset_log_start: int | None = None
    """A log-start checkpoint entry dropped (it pointed beyond the log's end)."""
    high_watermark: tuple[int, int] | None = None
    """(old, new): the high watermark lowered to the log end."""
    lost: list[str] = field(default_factory=list)
    """What the repair loses, one statement each."""
    lost_records: int = 0
    """Records in removed segments."""
    lost_offsets: int = 0
    """Acknowledged offsets below the old high watermark that are no longer readable."""
    applied: bool = False

    def describe(self) -> list[str]:
        """The repair's steps and losses, one line each."""
        steps = [f"rename {a} to {b}" for a, b in self.renames]
        steps += [f"remove {f}" for f in self.removals]
        if self.cut is not None:
            steps.append(f"truncate {self.cut[0]} to {self.cut[1]} bytes (its valid batches)")
        if self.reset_log_start is not None:
            steps.append(
                f"drop the {ckpt.LOG_START_OFFSET} entry {self.reset_log_start} (beyond the log end)"
            )
        if self.high_watermark is not None:
            steps.append(
                f"lower the high watermark from {self.high_watermark[0]} to {self.high_watermark[1]}"
            )
        return steps + [f"loses {what}" for what in self.lost]


@dataclass
class _Segment:
    path: str
    base: int
    first: int | None  # offset of its first batch; None: no valid batch
    end: int  # offset after its last valid batch (base if none)
    records: int  # in its valid batches
    size: int
    valid: int = 0  # bytes of its valid batches (the file's size: all valid)
    problem: str | None = None  # why the bytes from ``valid`` on are invalid


def plan_repair(
    storage: Storage,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    problems: list[str],
    log_start_offset: int,
    high_watermark: int | None,
    segments: list[LogSegment] | None = None,
) -> Repair:
    """The repair of a damaged partition, planned from a read-only view of its files (nothing
    is changed), or from ``segments`` (a writer's open log).  Every batch is read and checked as
    Kafka's recovery checks it (CRC, offsets increasing).  Segments are put in the order of their
    first batches: each one whose offsets follow the previous one's is kept, renamed after its
    first batch when its name does not fit; one whose offsets overlap those of a segment before
    it is removed (its records are lost, or held twice).  The log then ends at its first invalid
    byte (the segment holding it truncated there, every later one removed, as Kafka's recovery
    does after a crash) or, where offsets are dense (see :func:`layout.dense_offsets`), at the
    first segment that ends below the next one's base offset (offsets no segment holds: the later
    segments are removed, so that no acknowledged offset is unreadable and none gets a second
    value).  Then a log end below the high watermark lowers it, and a log-start checkpoint
    entry beyond the end is dropped.  ``problems`` gets the damage found that is not in it."""
    directory = partition_dir(topic, partition)
    own = segments is None
    if segments is None:
        segments = load_log(storage, directory, config, read_only=True, had_clean_shutdown=True).log.segments
    try:
        with naming_io_errors(directory, "planning the repair of"):
            segs = [_describe_segment(seg) for seg in segments if seg.suffix == ""]
    finally:
        for seg in segments if own else []:
            seg.close_files()
    plan = Repair(topic, partition, list(problems))
    content = sorted((s for s in segs if s.first is not None), key=lambda s: (s.first, s.base))
    kept: list[_Segment] = []
    for s in content:
        assert s.first is not None
        prev = kept[-1] if kept else None
        if prev is not None and s.first < prev.end:
            plan.removals.append(s.path)
            plan.lost_records += s.records
            plan.lost.append(
                f"{s.records} records of {s.path} (offsets {s.first}..{s.end - 1}; offsets from "
                f"{s.first} on are also held by {prev.path})"
            )
            continue
        low = prev.end if prev is not None else -1
        new_base = s.base if low <= s.base <= s.first else s.first
        path = s.path
        if new_base != s.base:
            path = _renamed(s.path, new_base)
            plan.renames.append((s.path, path))
        kept.append(_Segment(path, new_base, s.first, s.end, s.records, s.size, s.valid, s.problem))
    for s in (s for s in segs if s.first is None):  # empty (or not starting with a valid batch)
        if any(k.base <= s.base < k.end or k.base == s.base for k in kept):
            plan.removals.append(s.path)
            if s.size:
                plan.lost.append(f"{s.size} bytes of {s.path}, which do not start with a valid batch")
        else:
            kept.append(s)
    kept.sort(key=lambda s: s.base)
    kept = _end_at_damage(plan, kept, layout.dense_offsets(storage, directory, config), high_watermark)
    leo = kept[-1].end if kept else 0
    if high_watermark is not None and leo < high_watermark:
        plan.high_watermark = (high_watermark, leo)
        plan.lost_offsets = high_watermark - leo
        plan.lost.append(
            f"offsets {leo}..{high_watermark - 1} of {directory}: acknowledged (high watermark "
            f"{high_watermark}) but in no segment; the next append gets offset {leo}"
        )
    if log_start_offset > min(leo, high_watermark if high_watermark is not None else leo):
        plan.reset_log_start = log_start_offset
    return plan


def _end_at_damage(plan: Repair, kept: list[_Segment], dense: bool, hw: int | None) -> list[_Segment]:
    """``kept`` (by base offset) up to the first invalid byte, or (``dense``) up to the first
    segment that ends below the next one's base and below the high watermark ``hw`` (what lies
    above it the writer's load truncates); what that cuts off goes into ``plan``."""
    for k, s in enumerate(kept):
        hole = dense and k + 1 < len(kept) and s.end < kept[k + 1].base and (hw is None or s.end < hw)
        if s.problem is None and not hole:
            continue
        later = kept[k + 1 :]
        if s.problem is not None:
            if s.problem not in plan.problems:
                plan.problems.append(s.problem)
            plan.lost.append(f"{s.size - s.valid} bytes of {s.path} from byte {s.valid} on (invalid)")
            if s.valid == 0 and k > 0:  # nothing valid: removed (it would end the log below its base)
                later, s = kept[k:], kept[k - 1]
            else:
                plan.cut = (s.path, s.valid)
        elif not plan.problems:  # (a writer's refusal states it already)
            plan.problems.append(
                f"{s.path} ends at offset {s.end} and {later[0].path} starts at {later[0].base}: offsets "
                f"{s.end}..{later[0].base - 1} are held by no segment"
            )
        if later:
            n = sum(x.records for x in later)
            plan.removals += [x.path for x in later]
            plan.lost_records += n
            lo, hi = min(x.base for x in later), max(x.end for x in later)
            segments = "the segment" if len(later) == 1 else f"the {len(later)} segments"
            plan.lost.append(
                f"{n} records of {segments} after it (offsets {lo}..{hi - 1}): the log ends at offset "
                f"{s.end}, where the damage is, as recovery after a crash would end it"
            )
        return kept[: kept.index(s) + 1]
    return kept


def _describe_segment(seg: LogSegment) -> _Segment:
    """The segment's valid batches (Kafka recovery's checks: CRC, offsets increasing; not its
    base offset, which may be wrong) and why the bytes after them are invalid."""
    first: int | None = None
    end, records, valid, prev = seg.base_offset, 0, 0, -1
    problem = None
    try:
        for loc in seg.iter_batches(0):
            h = loc.headers
            crc_ok = B.verify_crcs(loc.data, relative_headers(h, loc.start))
            prevs = np.concatenate([[prev], h.last_offset[:-1]])
            bad = ~crc_ok | (h.last_offset < h.base_offset) | (h.base_offset <= prevs)
            n = int(np.argmax(bad)) if bad.any() else len(h)
            if n:
                first = int(h.base_offset[0]) if first is None else first
                prev = int(h.last_offset[n - 1])
                end = prev + 1
                records += int(h.records_count[:n].sum())
                valid = int(h.position[n - 1] + h.size[n - 1])
            if n < len(h):
                why = (
                    "its CRC does not match its bytes"
                    if not crc_ok[n]
                    else (
                        f"its offsets {int(h.base_offset[n])}..{int(h.last_offset[n])} do not follow offset "
                        f"{int(prevs[n])}"
                    )
                )
                problem = f"{seg.log_path}: the batch at byte {int(h.position[n])} is invalid: {why}"
                break
    except CorruptRecordError as e:
        problem = f"{seg.log_path}: byte {e.position}: {e.reason}"
    if problem is None and valid < seg.size:
        problem = (
            f"{seg.log_path}: {seg.size - valid} bytes at byte {valid} are not a complete batch (the "
            f"file ends at byte {seg.size})"
        )
    return _Segment(seg.log_path, seg.base_offset, first, end, records, seg.size, valid, problem)


def _renamed(path: str, base: int) -> str:
    directory, _, _ = path.rpartition("/")
    return f"{directory}/{segment_name(base)}.log"


def apply_repair(storage: Storage, plan: Repair) -> None:
    """Carry out the file changes of ``plan`` (removals, then renames, then the cut; the offset
    and time indexes of renamed and cut segments are removed, and rebuilt when the writer loads
    the log); the
    caller changes the high watermark and the checkpoints.  Each step is atomic: a crash leaves
    a log that is damaged less, which ``pylog recover`` repairs again."""
    directory = partition_dir(plan.topic, plan.partition)
    for path in plan.removals:
        stem = path[: -len(".log")]
        for ext in (".index", ".timeindex", ".txnindex", ".log"):
            storage.delete(stem + ext)
    pending = list(plan.renames)
    while pending:
        ready = [(a, b) for a, b in pending if not storage.exists(b)]
        if not ready:
            raise PylogError(
                f"{directory}: cannot rename {', '.join(f'{a} to {b}' for a, b in pending)}: the new names "
                "are taken; rename the files by hand"
            )
        for a, b in ready:
            old, new = a[: -len(".log")], b[: -len(".log")]
            for ext in (".index", ".timeindex", ".txnindex"):
                storage.delete(new + ext)  # without a .log: left over, never this segment's
            for ext in (".index", ".timeindex"):  # relative offsets: rebuilt under the new name
                storage.delete(old + ext)
            storage.rename(a, b)
            if storage.exists(old + ".txnindex"):  # absolute offsets: still right
                storage.rename(old + ".txnindex", new + ".txnindex")
            pending.remove((a, b))
    if plan.cut is not None:  # its indexes are rebuilt when the writer loads the log
        path, size = plan.cut
        for ext in (".index", ".timeindex", ".txnindex"):
            storage.delete(path[: -len(".log")] + ext)
        storage.truncate(path, size)
    storage.fsync_dir(directory)
