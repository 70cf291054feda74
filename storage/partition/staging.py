"""Staged segments: batches written before a commit decides their offsets, in their final form.

A writer that prepares data ahead of a commit (a Spark task of the sink) writes the batches it
has for one partition as *staged segments* in the partition directory::

    <stem>.<relative base offset, 20 digits>.log.staged        record batches, offsets from 0
    <stem>.<relative base offset, 20 digits>.index.staged      offset index, as the log builds it
    <stem>.<relative base offset, 20 digits>.timeindex.staged  time index, as the log builds it

Each staged segment is rolled as a log segment is (``segment.bytes``, a full index, 32-bit
relative offsets), so any one of them can become a segment of the log.  Kafka and the log
loader ignore these names (they end in neither ``.log`` nor an index suffix).

A commit *links* a staged segment into the log (:func:`link`): every batch's ``baseOffset``
(bytes 0-7 of its header, outside the CRC-32C, which covers bytes 21 on) gets the log end
offset minus the staged segment's relative base added, the file is fsynced, the active segment
is rolled, and the three files are renamed to ``%020d.log``/``.index``/``.timeindex`` of the
new base offset.  The indexes stay valid as they are: their entries hold offsets relative to
the segment's base and byte positions.  Cost: one 61-byte header read and one 8-byte write per
batch and three renames (O(batches), not O(bytes)); the record bytes never pass through the
committing process.  Patching is idempotent (each ``baseOffset`` is set, not incremented), so a
commit interrupted while patching can run again.

What makes a linked segment visible is the caller's high watermark (see
:mod:`pylog.storage.root.publish`): a crash after some renames leaves segments past it, which
the next writer truncates; a staged file never renamed stays staged and is swept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pylog.storage.backends.base import Storage, join
from pylog.storage.backends.objectstore import overlay
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptRecordError, InvalidOffsetError, RecordTooLargeError
from pylog.storage.partition import producer_state
from pylog.storage.partition.consistency import now_ms
from pylog.storage.partition.log import AppendInfo, Log
from pylog.storage.partition.segment import LogSegment, fitting_batches, segment_name
from pylog.storage.partition.segments import base_offsets

STAGED_SUFFIX = ".staged"
_KINDS = ("index", "timeindex", "log")  # renamed in this order: a .log is never without its indexes
STAGED_KINDS = ("index", "timeindex", "txnindex", "log")
"""The files a staged segment may have, indexes first (the order of :func:`staged_paths`)."""
_BASE = B.FIELD["base_offset"]
_NOT_LINKABLE = B.TRANSACTIONAL_MASK | B.CONTROL_MASK


@dataclass(frozen=True)
class StagedSegment:
    """One staged segment: relative base offset, offset after its last batch, size in bytes.

    A segment staged as objects (object stores, see :func:`adopt`) also carries the sizes of
    its files (``files``: kind -> bytes) and where its batches start with their relative base
    offsets (``batches``, in the patch layout of :mod:`pylog.storage.backends.objectstore.overlay`), so
    that a commit adopts it without reading it."""

    base: int
    next_offset: int
    size: int
    files: tuple[tuple[str, int], ...] | None = None
    batches: bytes | None = field(default=None, repr=False)
    inline: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    """Small index files (kind, bytes) carried with the message instead of uploaded."""

    @property
    def records(self) -> int:
        return self.next_offset - self.base


def staged_stem(name: str, base: int) -> str:
    """File stem (inside the partition directory) of the staged segment ``base`` of ``name``."""
    return f"{name}.{segment_name(base)}"


def staged_log_path(directory: str, name: str, seg: StagedSegment) -> str:
    """The ``.log`` of a staged segment (its batches)."""
    if seg.files is not None:
        return next(join(directory, f) for f, _ in seg.files if _object_kind(f) == "log")
    return f"{join(directory, staged_stem(name, seg.base))}.log{STAGED_SUFFIX}"


def staged_paths(directory: str, name: str, seg: StagedSegment) -> list[str]:
    """Every file a staged segment may have (index files first, the ``.log`` last); for one
    staged as objects, the objects it uploaded."""
    if seg.files is not None:
        return [join(directory, f) for f, _ in seg.files]
    stem = join(directory, staged_stem(name, seg.base))
    return [f"{stem}.{kind}{STAGED_SUFFIX}" for kind in STAGED_KINDS]


def _object_kind(name: str) -> str:
    """The kind (``log``, ``index``...) of an uploaded staged object's name (see below)."""
    return name.split(".")[-3]


def unique_staged_path(path: str, token: str) -> str:
    """``<stem>.<kind>.staged`` as ``<stem>.<kind>.<token>.staged``: the name of an object a
    commit adopts, never reused by another run of the same task attempt."""
    return f"{path[: -len(STAGED_SUFFIX)]}.{token}{STAGED_SUFFIX}"


class StagingLog:
    """Writes one task's batches for one partition as staged segments named after ``name``.

    Batches appended must be numbered from :attr:`next_offset` on (encode them with
    ``base_offset=stager.next_offset``).  :meth:`finish` makes them durable."""

    def __init__(
        self, storage: Storage, directory: str, name: str, config: LogConfig, *, direct: bool = True
    ):
        self.storage = storage
        self.directory = directory
        self.name = name
        self.config = config
        self.direct = direct
        self.next_offset = 0
        self.segments: list[StagedSegment] = []
        self._seg: LogSegment | None = None
        self._batches: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # base -> positions, offsets

    @property
    def size(self) -> int:
        """Bytes staged so far."""
        return sum(s.size for s in self.segments) + (self._seg.size if self._seg is not None else 0)

    def _open(self, base: int) -> LogSegment:
        seg = LogSegment(
            self.storage,
            self.directory,
            base,
            self.config,
            suffix=STAGED_SUFFIX,
            stem=staged_stem(self.name, base),
            created_ms=now_ms(),
        )
        # written once and fsynced before the commit links it: around the page cache by default
        # (the page cache would add a copy of every byte), through it when readers of the topic
        # soon after the commit should find it in memory
        seg.open_for_append(direct=self.direct)
        return seg

    def append(self, data: np.ndarray | bytes | memoryview, h: B.BatchHeaders) -> None:
        """Append encoded batches (``h`` positions relative to ``data``), rolling as a log does."""
        if len(h) == 0:
            return
        if int(h.base_offset[0]) != self.next_offset:
            raise InvalidOffsetError(
                f"{self.directory}/{self.name}: staged batches must start at offset {self.next_offset}, "
                f"not {int(h.base_offset[0])}"
            )
        too_big = np.nonzero(h.size > min(self.config.max_message_bytes, self.config.segment_bytes))[0]
        if too_big.size:
            raise RecordTooLargeError(
                f"{self.directory}: a batch of {int(h.size[too_big[0]])} bytes exceeds max.message.bytes="
                f"{self.config.max_message_bytes} or segment.bytes={self.config.segment_bytes}"
            )
        raw = B.as_uint8(data)
        i, n = 0, len(h)
        while i < n:
            seg = self._seg
            if seg is None or (
                seg.size > self.config.segment_bytes - int(h.size[i])
                or seg.indexes_full()
                or not seg.can_convert_to_relative_offset(int(h.last_offset[i]))
            ):
                self._close_segment()
                seg = self._seg = self._open(int(h.base_offset[i]))
            j = fitting_batches(seg, h, i, self.config.segment_bytes)
            lo, hi = int(h.position[i]), int(h.position[j - 1] + h.size[j - 1])
            self._batches.setdefault(seg.base_offset, []).append(
                (seg.size + h.position[i:j] - lo, h.base_offset[i:j].copy())
            )
            seg.append(raw[lo:hi], h.take(slice(i, j)))
            i = j
        self.next_offset = int(h.last_offset[-1]) + 1

    def _close_segment(self) -> None:
        seg = self._seg
        if seg is None:
            return
        seg.on_become_inactive()  # final time index entry, fsync, close
        self.segments.append(StagedSegment(seg.base_offset, seg.read_next_offset(), seg.size))
        self._seg = None

    def finish(self) -> list[StagedSegment]:
        """Close (and fsync) the staged segments; returns them in offset order."""
        self._close_segment()
        return list(self.segments)

    def batches(self, base: int) -> bytes:
        """Positions and relative base offsets of the batches of staged segment ``base``, in
        the patch layout of :mod:`pylog.storage.backends.objectstore.overlay`."""
        parts = self._batches.get(base, [])
        if not parts:
            return b""
        return overlay.encode(np.concatenate([p for p, _ in parts]), np.concatenate([o for _, o in parts]))

    def abandon(self) -> None:
        """Remove every file written so far."""
        if self._seg is not None:
            self._seg.close_files()
            self.segments.append(StagedSegment(self._seg.base_offset, self._seg.base_offset, 0))
            self._seg = None
        for seg in self.segments:
            for path in staged_paths(self.directory, self.name, seg):
                self.storage.delete(path)
        self.segments = []


def _patches(
    storage: Storage, path: str, seg: StagedSegment, delta: int, config: LogConfig
) -> list[tuple[int, bytes]]:
    """The ``baseOffset`` writes that move the batches of staged segment ``seg`` by ``delta``,
    after checking each header: v2, non-transactional, numbered consecutively from
    ``seg.base`` (or already moved: an interrupted link run again), within the file and
    ``max.message.bytes``."""
    edits: list[tuple[int, bytes]] = []
    pos, expect = 0, seg.base
    size = storage.size(path)
    if size != seg.size:
        raise CorruptRecordError(
            f"staged segment has {size} bytes, {seg.size} were staged", path=path, position=0
        )
    with storage.open_reader(path) as read:
        while pos < size:
            raw = read(pos, pos + B.HEADER_SIZE)
            f, length = _checked_header(raw, pos, expect, delta, size, path)
            if length > config.max_message_bytes:
                raise RecordTooLargeError(
                    f"{path}: a batch of {length} bytes exceeds max.message.bytes={config.max_message_bytes}"
                )
            edits.append((pos, _BASE.pack(expect + delta)))
            expect += int(f["last_offset_delta"]) + 1
            pos += length
    if expect != seg.next_offset:
        raise CorruptRecordError(
            f"staged segment ends at offset {expect}, {seg.next_offset} were staged", path=path, position=size
        )
    return edits


def _checked_header(
    raw: bytes, pos: int, expect: int, delta: int, size: int, path: str
) -> tuple[dict[str, int], int]:
    """The fields and the size of the staged batch header ``raw`` at ``pos``, checked."""
    if len(raw) < B.HEADER_SIZE:
        raise CorruptRecordError("torn batch header", path=path, position=pos)
    f = dict(zip((name for name, _ in B.HEADER_FIELDS), B.HEADER.unpack_from(raw), strict=True))
    length = int(f["batch_length"]) + B.LOG_OVERHEAD
    problem = None
    if f["magic"] != 2:
        problem = f"magic {f['magic']} (only RecordBatch v2 is staged)"
    elif int(f["base_offset"]) not in (expect, expect + delta):
        problem = f"base offset {f['base_offset']}, expected {expect}"
    elif length < B.HEADER_SIZE or pos + length > size:
        problem = f"batch length {length} does not fit the file"
    elif int(f["attributes"]) & _NOT_LINKABLE:
        problem = "a transactional or control batch"
    if problem:
        raise CorruptRecordError(f"staged batch: {problem}", path=path, position=pos)
    return f, length


def _retire_active(log: Log) -> None:
    """Before a staged segment joins ``log`` at its end: the active segment is sealed, or
    removed when empty (as a roll does)."""
    old = log.active
    if old.size == 0:
        old.delete()
        log.segments.pop()
    else:
        old.on_become_inactive()


def link(log: Log, name: str, seg: StagedSegment, *, now: int | None = None) -> AppendInfo:
    """Make staged segment ``seg`` (of the staging ``name``, see :class:`StagingLog`) the new
    active segment of ``log``, at its log end offset; returns what it added.  Nothing is visible to readers
    before the caller moves the high watermark; the caller fsyncs the directory (``Log.flush``)."""
    log._check_writable()
    storage, directory = log.storage, log.directory
    base = log.log_end_offset
    stem = join(directory, staged_stem(name, seg.base))
    staged_log = staged_log_path(directory, name, seg)
    edits = _patches(storage, staged_log, seg, base - seg.base, log.config)  # checks: nothing changed yet
    try:
        storage.write_at(staged_log, edits)
        log.faults.step("link-patched")
        _retire_active(log)
        final = join(directory, segment_name(base))
        for kind in _KINDS:
            src = f"{stem}.{kind}{STAGED_SUFFIX}"
            if kind == "log" or storage.exists(src):
                storage.rename(src, f"{final}.{kind}")
            log.faults.step(f"link-renamed-{kind}")
        new = LogSegment(storage, directory, base, log.config, created_ms=now_ms() if now is None else now)
        new.open_for_append()
        new.set_next_offset(base + seg.records)  # known: no read of its last batch
        log.segments.append(new)
        log._bases = base_offsets(log.segments)  # (no segment object made)
    except BaseException as e:  # the log's files are half changed: reopen (and recover) it
        log._failed = e
        raise
    producer_state.on_link(log, base + seg.records)
    last = base + seg.records - 1
    return AppendInfo(base, last, new.max_timestamp_so_far, seg.records, len(edits), seg.size)


def adopt(log: Log, name: str, seg: StagedSegment, *, now: int | None = None) -> AppendInfo:
    """Make staged segment ``seg``, uploaded as objects (``seg.files``, ``seg.batches``), a
    segment of ``log`` at its log end offset on an object store: its objects become the
    segment's files as they are (:meth:`Storage.adopt`), each batch's ``baseOffset`` set by a
    patch read over the ``.log`` object.  Nothing is downloaded or uploaded, so the record
    bytes never pass through the committing process.  A new active segment follows it (an
    object is never appended to).  As with :func:`link`, nothing is visible before the caller
    moves the high watermark; a commit that never happens leaves the objects staged (swept)."""
    log._check_writable()
    storage, directory = log.storage, log.directory
    if seg.files is None or seg.batches is None:
        raise InvalidOffsetError(f"{directory}/{name}: staged segment {seg.base} was not staged as objects")
    pairs = overlay.pairs(seg.batches)
    offsets = pairs["value"].astype(np.int64)
    positions = pairs["position"].astype(np.int64)
    if (
        not pairs.size
        or int(positions[0]) != 0
        or int(offsets[0]) != seg.base
        or (np.diff(positions) <= 0).any()
        or (np.diff(offsets) <= 0).any()
        or int(offsets[-1]) >= seg.next_offset
        or int(positions[-1]) >= seg.size
    ):
        raise CorruptRecordError(
            f"staged segment {seg.base}: its batch list does not describe {seg.size} bytes of offsets "
            f"{seg.base}..{seg.next_offset - 1}",
            path=staged_log_path(directory, name, seg),
            position=0,
        )
    base = log.log_end_offset
    patch = overlay.encode(positions, offsets + (base - seg.base))
    sizes = {_object_kind(f): (f, n) for f, n in seg.files}  # kind -> (object name, bytes)
    if sizes.get("log", ("", -1))[1] != seg.size:
        raise CorruptRecordError(
            f"staged segment {seg.base}: its .log object has {sizes.get('log', ('', 0))[1]} bytes, "
            f"{seg.size} were staged",
            path=staged_log_path(directory, name, seg) if "log" in sizes else directory,
            position=0,
        )
    try:
        _retire_active(log)
        final = join(directory, segment_name(base))
        for kind, data in seg.inline:  # small indexes: written into the state, no object
            storage.write_atomic(f"{final}.{kind}", data)
        for kind in STAGED_KINDS:
            if kind in sizes:
                src, n = sizes[kind]
                storage.adopt(join(directory, src), f"{final}.{kind}", n, patch if kind == "log" else None)
                log.faults.step(f"adopted-{kind}")
        new = LogSegment(storage, directory, base, log.config, created_ms=now_ms() if now is None else now)
        new.set_next_offset(base + seg.records)
        log.segments.append(new)
        log._bases = base_offsets(log.segments)  # (no segment object made)
        log.roll(now=now)  # the adopted object is never appended to
    except BaseException as e:
        log._failed = e
        raise
    producer_state.on_link(log, base + seg.records)
    return AppendInfo(
        base, base + seg.records - 1, new.max_timestamp_so_far, seg.records, len(pairs), seg.size
    )


__all__ = [
    "STAGED_KINDS",
    "STAGED_SUFFIX",
    "StagedSegment",
    "StagingLog",
    "adopt",
    "link",
    "staged_log_path",
    "staged_paths",
    "staged_stem",
    "unique_staged_path",
]
