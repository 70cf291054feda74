"""Atomic publishing: high watermarks and exactly-once sink commits in one atomic step.

The state (high watermarks, the queries' committed batches) is kept by :mod:`state`: the
state file ``pylog-state.json`` and, on local disk, its journal ``pylog-state.journal``.

The high watermark (HW) of a partition is the end of its *acknowledged* data: readers never
read at or beyond it, and a writer that opens the root truncates each log back to its HW
(data past it was written by a publish that never completed), as a Kafka follower truncates
to its high watermark.  A publish therefore is:

1. append the staged batches to their partition logs (offsets assigned by the log, as a
   partition leader does) and fsync them;
2. record the new HWs *and* the query's batch id in one atomic step
   (:func:`state.write_state`): one line appended to the state's journal and fsynced on local
   disk (a line cut short by a crash is not a record), the state file replaced by the
   transaction's commit on object stores.

Step 2 is a single atomic step, so the data becoming visible and the record of
(query, batchId) that makes a replay a no-op happen together: a crash before it leaves the
appended bytes invisible (and truncated by the next writer), a crash after it leaves a
committed batch that a replayed ``commit`` skips.  Partitions without a HW entry (logs copied
from Kafka, or roots from before this file existed) are readable up to their log end.

Staged data (what Spark tasks write before the driver commits, see :mod:`stage`) lives in
hidden files inside the partition directories, named after
``.pylog-stage.<query>.<batch>.<task>.<attempt>``: on a local disk staged segments with their
indexes (``<that>.<relative base>.log.staged``, ``.index.staged``, ``.timeindex.staged``), which
step 1 *links* into the log (each batch's ``baseOffset`` patched, the files renamed: the
record bytes are not copied) or, when smaller than ``COPY_BELOW_BYTES``, copies into the
active segment; on object stores one file of batches per task and partition (or its bytes,
carried in the commit message), which step 1 copies.  Kafka and the log loader ignore these
names, and a sweep removes those of committed or abandoned batches.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pylog.storage.backends.base import STAGE_PREFIX, Storage
from pylog.storage.errors import PylogError
from pylog.storage.partition import staging
from pylog.storage.partition.log import AppendInfo, Log
from pylog.storage.partition.staging import StagedSegment
from pylog.storage.root.metadata import partition_dir
from pylog.storage.root.state import (
    DEFAULT_QUERY_RETENTION_MS,
    JOURNAL_FILE,
    STATE_FILE,
    STATE_VERSION,
    BatchCommit,
    PublishState,
    QueryRecord,
    fold_state,
    read_state,
    write_state,
)

_SINK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


COPY_BELOW_BYTES = 8 << 20
"""A staged segment smaller than this is copied into the partition's active segment by the
commit instead of becoming a segment of its own: small micro-batches do not make a segment
each (copying 8 MiB costs a few milliseconds; a larger one is linked, at O(batches))."""


def validate_sink_id(sink_id: str) -> str:
    """A writer's identity (a streaming query id, or a sink id) as used in file names."""
    if not isinstance(sink_id, str) or not _SINK_ID.match(sink_id):
        raise PylogError(f"sink id {sink_id!r} must be 1-128 characters of [A-Za-z0-9_-]")
    return sink_id


def stage_name(sink_id: str, batch_id: int, task: int, attempt: int) -> str:
    """File name (inside a partition directory) of one task attempt's staged batches."""
    return f"{STAGE_PREFIX}{validate_sink_id(sink_id)}.{int(batch_id)}.{int(task)}.{int(attempt)}"


def parse_stage_name(name: str) -> tuple[str, int, int, int] | None:
    """(writer, batch, task, attempt) of a staged file's name: a staging itself or one of its
    staged segments' files (``<staging>.<relative base>.<kind>.staged``, or as uploaded
    objects ``<staging>.<relative base>.<kind>.<token>.staged``); None otherwise."""
    if not name.startswith(STAGE_PREFIX):
        return None
    parts = name[len(STAGE_PREFIX) :].split(".")
    if len(parts) in (7, 8) and parts[-1] == staging.STAGED_SUFFIX[1:] and parts[4].isdigit():
        parts = parts[:4]  # a staged segment's file (8: an object, <kind>.<token>.staged)
    if len(parts) != 4 or not all(p.isascii() and p.lstrip("-").isdigit() for p in parts[1:]):
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:  # e.g. "--3": not a name pylog gave
        return None


@dataclass(frozen=True)
class StagedFile:
    """Where a task staged encoded batches for one partition: a file inside the partition
    directory, or (small stagings on object stores) the bytes themselves, carried to the
    driver in the task's commit message instead of a PUT, a GET and a DELETE."""

    topic: str
    partition: int
    name: str  # file name inside the partition directory (staged segments: their stem's start)
    data: bytes | None = field(default=None, repr=False)
    segments: tuple[StagedSegment, ...] | None = None  # staged segments (see :mod:`staging`)

    @property
    def size(self) -> int | None:
        """Bytes staged, when known without reading anything."""
        if self.data is not None:
            return len(self.data)
        return None if self.segments is None else sum(s.size for s in self.segments)

    def paths(self) -> list[str]:
        """The files this staging wrote (none when its bytes travel in the message)."""
        d = partition_dir(self.topic, self.partition)
        if self.data is not None:
            return []
        if self.segments is None:
            return [f"{d}/{self.name}"]
        return [p for s in self.segments for p in staging.staged_paths(d, self.name, s)]

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"topic": self.topic, "partition": self.partition, "name": self.name}
        if self.data is not None:
            d["data"] = self.data
        if self.segments is not None:
            d["segments"] = [
                [s.base, s.next_offset, s.size]
                if s.files is None
                else [
                    s.base,
                    s.next_offset,
                    s.size,
                    [list(f) for f in s.files],
                    s.batches,
                    [list(i) for i in s.inline],
                ]
                for s in self.segments
            ]
        return d

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> StagedFile:
        data = d.get("data")
        segs = d.get("segments")
        return StagedFile(
            str(d["topic"]),
            int(d["partition"]),  # type: ignore[call-overload]
            str(d["name"]),
            None if data is None else bytes(data),  # type: ignore[call-overload]
            None if segs is None else tuple(_segment(s) for s in segs),  # type: ignore[attr-defined]
        )


def _segment(s: list[object]) -> StagedSegment:
    base, nxt, size = (int(x) for x in s[:3])  # type: ignore[call-overload]
    if len(s) == 3:
        return StagedSegment(base, nxt, size)
    files = tuple((str(k), int(n)) for k, n in s[3])  # type: ignore[attr-defined]
    inline = tuple((str(k), bytes(b)) for k, b in (s[5] if len(s) > 5 else ()))  # type: ignore[attr-defined]
    return StagedSegment(base, nxt, size, files, bytes(s[4]), inline)  # type: ignore[call-overload]


def group_staged(staged: Iterable[StagedFile]) -> dict[tuple[str, int], list[StagedFile]]:
    """Staged files per (topic, partition), in the deterministic order a publish appends
    them: by topic, partition, then file name."""
    groups: dict[tuple[str, int], list[StagedFile]] = {}
    for f in sorted(staged, key=lambda f: (f.topic, f.partition, f.name)):
        groups.setdefault((f.topic, f.partition), []).append(f)
    return groups


def read_staged(storage: Storage, files: Iterable[StagedFile]) -> bytes:
    """The encoded batches of flat stagings ``files`` (of one partition), one after the other."""
    return b"".join(
        f.data if f.data is not None else storage.read(f"{partition_dir(f.topic, f.partition)}/{f.name}")
        for f in files
    )


def append_staged(
    storage: Storage, lg: Log, files: list[StagedFile], *, copy_below: int = COPY_BELOW_BYTES
) -> AppendInfo | None:
    """Append the staged batches of ``files`` (one partition's, in order) to ``lg``, offsets
    assigned from its log end: staged segments of at least ``copy_below`` bytes are linked
    (:func:`staging.link`), the rest copied.  Returns what was added (None: nothing)."""
    parts: list[AppendInfo] = []
    d = partition_dir(files[0].topic, files[0].partition) if files else ""
    for f in files:
        if f.segments is None:  # a flat staging (object stores)
            data = read_staged(storage, [f])
            if data:
                parts.append(lg.append_batches(data, assign_offsets=True))
            continue
        for s in f.segments:
            if s.files is not None:  # uploaded as objects: adopted as they are
                parts.append(staging.adopt(lg, f.name, s))
            elif s.size >= copy_below:
                parts.append(staging.link(lg, f.name, s))
            else:
                parts.append(lg.append_batches(storage.read(staging.staged_log_path(d, f.name, s))))
    parts = [p for p in parts if p.num_batches]
    if not parts:
        return None
    return AppendInfo(
        parts[0].first_offset,
        parts[-1].last_offset,
        max(p.max_timestamp for p in parts),
        sum(p.num_records for p in parts),
        sum(p.num_batches for p in parts),
        sum(p.num_bytes for p in parts),
    )


STAGED_SWEEP_INTERVAL_S = 60.0
"""On an object store, abandoned staged objects are searched for (one LIST) at most this often
per root and process."""

_LAST_STAGED_SWEEP: dict[str, float] = {}


def staged_sweep_due(where: str, now_s: float | None = None) -> bool:
    """Whether the root ``where`` is due for a sweep of abandoned staged objects (and note it)."""
    now = time.monotonic() if now_s is None else now_s
    if now - _LAST_STAGED_SWEEP.get(where, -math.inf) < STAGED_SWEEP_INTERVAL_S:
        return False
    _LAST_STAGED_SWEEP[where] = now
    return True


def sweep_staged(
    storage: Storage,
    sink_id: str,
    up_to_batch: int,
    partitions: Iterable[tuple[str, int]],
    *,
    state: PublishState | None = None,
    now: int | None = None,
    max_age_ms: int | None = None,
) -> int:
    """Delete the staged files in the directories of ``partitions`` that no commit will
    publish; returns how many were removed:

    * those of ``sink_id`` for batches <= ``up_to_batch`` (committed, replayed or abandoned);
    * with ``state``, those of any writer for batches its record says it published (their
      commit, or its skipped replay, is over);
    * with ``now`` and ``max_age_ms``, those of any writer older than that: left by a query
      that stopped or was reset (a new checkpoint is a new query, which never publishes them),
      or by a task of a failed batch write.  Where a file's age is unknown it is kept."""
    removed = 0
    for topic, p in partitions:
        d = partition_dir(topic, p)
        for name in storage.listdir_staged(d):
            parsed = parse_stage_name(name)
            if not parsed:
                continue
            writer, batch = parsed[0], parsed[1]
            done = (writer == sink_id and batch <= up_to_batch) or (
                state is not None and writer in state.queries and batch <= state.last_batch(writer)
            )
            if not done and now is not None and max_age_ms is not None:
                modified = storage.modified_ms(f"{d}/{name}")
                done = modified is not None and now - modified > max_age_ms
            if done:
                storage.delete(f"{d}/{name}")
                removed += 1
    return removed


__all__ = [
    "COPY_BELOW_BYTES",
    "DEFAULT_QUERY_RETENTION_MS",
    "JOURNAL_FILE",
    "STAGE_PREFIX",
    "STATE_FILE",
    "STATE_VERSION",
    "BatchCommit",
    "PublishState",
    "QueryRecord",
    "StagedFile",
    "append_staged",
    "fold_state",
    "group_staged",
    "parse_stage_name",
    "read_staged",
    "read_state",
    "stage_name",
    "staged_sweep_due",
    "sweep_staged",
    "validate_sink_id",
    "write_state",
]
