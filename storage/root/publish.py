"""Atomic publishing: high watermarks and exactly-once sink commits in one state file.

    <root>/pylog-state.json   {"version": 2,
                               "high_watermarks": {"<topic>": {"<partition>": <offset>}},
                               "queries": {"<query id>": {"batch": <last committed batch id>,
                                                          "seen": <ms of its last commit>}},
                               "sinks": {"<sink id>": <last committed batch id>}}

``queries`` holds one record per streaming query (Spark's query id, kept in the query's
checkpoint): the exactly-once key.  A record not refreshed by a commit for the retention time
(``DEFAULT_QUERY_RETENTION_MS``, the sink option ``queryRetentionMs``) is dropped by the next
commit, as Delta Lake expires its ``txn`` entries.  ``sinks`` are records of version 1 files,
keyed by a hash of the checkpoint location: kept as read, consulted once by the first commit of
a query that names that sink (``legacy_sink``), and then replaced by the query's record.  A
version 1 file is read as version 2 with its ``sinks`` and no ``queries``, and written back as
version 2.

The high watermark (HW) of a partition is the end of its *acknowledged* data: readers never
read at or beyond it, and a writer that opens the root truncates each log back to its HW
(data past it was written by a publish that never completed), as a Kafka follower truncates
to its high watermark.  A publish therefore is:

1. append the staged batches to their partition logs (offsets assigned by the log, as a
   partition leader does) and fsync them;
2. replace ``pylog-state.json`` (tmp → fsync → rename → fsync dir) with the new HWs *and*
   the query's batch id.

Step 2 is a single atomic rename, so the data becoming visible and the record of
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

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pylog.storage.backends.base import STAGE_PREFIX, Storage
from pylog.storage.errors import CorruptMetadataError, PylogError
from pylog.storage.partition import staging
from pylog.storage.partition.log import AppendInfo, Log
from pylog.storage.partition.staging import StagedSegment
from pylog.storage.root.metadata import partition_dir, root_step

STATE_FILE = "pylog-state.json"
_SINK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


DEFAULT_QUERY_RETENTION_MS = 7 * 24 * 3600 * 1000
"""How long the record of a streaming query that stopped committing is kept (7 days): a
query restarted later than that from its checkpoint is a new query, and a replay of its last
batch is written again."""

STATE_VERSION = 2

COPY_BELOW_BYTES = 8 << 20
"""A staged segment smaller than this is copied into the partition's active segment by the
commit instead of becoming a segment of its own: small micro-batches do not make a segment
each (copying 8 MiB costs a few milliseconds; a larger one is linked, at O(batches))."""


@dataclass(frozen=True)
class QueryRecord:
    batch: int  # the last batch id the query published
    seen: int  # ms since the epoch of that commit


@dataclass(frozen=True)
class BatchCommit:
    """What a publish records with its high watermarks: ``batch`` of the writer ``query``
    (Spark's streaming query id), at ``now`` ms; records of other queries older than
    ``retention_ms`` are dropped; ``legacy_sink`` names a version 1 sink record that this
    commit replaces."""

    query: str
    batch: int
    now: int
    retention_ms: int = DEFAULT_QUERY_RETENTION_MS
    legacy_sink: str | None = None


@dataclass
class PublishState:
    """High watermarks per (topic, partition) and the last committed batch per query."""

    high_watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    sinks: dict[str, int] = field(default_factory=dict)  # version 1 records, by sink id
    queries: dict[str, QueryRecord] = field(default_factory=dict)

    def last_batch(self, query: str, legacy_sink: str | None = None) -> int:
        """The last batch ``query`` published (-1 if none).  A query without a record of its
        own is answered from the version 1 record of ``legacy_sink`` (a query that ran on an
        older pylog, keyed by its checkpoint), until its first commit replaces it."""
        rec = self.queries.get(query)
        if rec is not None:
            return rec.batch
        if query in self.sinks:  # direct callers that keyed their publishes by sink id
            return self.sinks[query]
        return self.sinks.get(legacy_sink, -1) if legacy_sink else -1

    def record(self, commit: BatchCommit) -> None:
        """Record a published batch and expire queries not seen for ``retention_ms``."""
        self.sinks.pop(commit.query, None)
        if commit.legacy_sink:
            self.sinks.pop(commit.legacy_sink, None)
        self.queries[commit.query] = QueryRecord(commit.batch, commit.now)
        horizon = commit.now - commit.retention_ms
        for q in [q for q, r in self.queries.items() if r.seen < horizon and q != commit.query]:
            del self.queries[q]

    def to_json(self) -> bytes:
        hw: dict[str, dict[str, int]] = {}
        for (topic, p), off in sorted(self.high_watermarks.items()):
            hw.setdefault(topic, {})[str(p)] = off
        queries = {q: {"batch": r.batch, "seen": r.seen} for q, r in sorted(self.queries.items())}
        return json.dumps(
            {
                "version": STATE_VERSION,
                "high_watermarks": hw,
                "queries": queries,
                "sinks": dict(sorted(self.sinks.items())),
            },
            separators=(",", ":"),  # (no indent: the C encoder, a root of thousands of partitions)
        ).encode()

    @staticmethod
    def from_json(data: bytes, path: str) -> PublishState:
        try:
            doc = json.loads(data)
            version = doc.get("version")
            if version not in (1, STATE_VERSION):
                raise ValueError(f"unsupported version {version!r} (expected 1 or {STATE_VERSION})")
            hw = {
                (str(t), int(p)): int(o)
                for t, parts in doc["high_watermarks"].items()
                for p, o in parts.items()
            }
            sinks = {str(k): int(v) for k, v in doc["sinks"].items()}
            queries = {
                str(q): QueryRecord(int(r["batch"]), int(r["seen"]))
                for q, r in (doc["queries"] if version == STATE_VERSION else {}).items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptMetadataError(f"{path}: not a valid pylog state file: {e}") from e
        return PublishState(hw, sinks, queries)


def read_state(storage: Storage) -> PublishState:
    with root_step(storage, STATE_FILE, "read it"):  # an I/O error names the file
        if not storage.exists(STATE_FILE):
            return PublishState()
        data = storage.read(STATE_FILE)
    key = storage.describe()
    hit = _parsed_states.get(key)
    if hit is None or hit[0] != data:  # (read again unchanged: a root opened, then writing)
        hit = (bytes(data), PublishState.from_json(data, f"{key}/{STATE_FILE}"))
        _parsed_states[key] = hit
        while len(_parsed_states) > _PARSED_KEPT:
            del _parsed_states[next(iter(_parsed_states))]
    state = hit[1]
    return PublishState(dict(state.high_watermarks), dict(state.sinks), dict(state.queries))


_PARSED_KEPT = 16
_parsed_states: dict[str, tuple[bytes, PublishState]] = {}
"""The last state files parsed, by root, with their bytes."""


def write_state(storage: Storage, state: PublishState) -> None:
    with root_step(storage, STATE_FILE, "write it"):
        storage.write_atomic(STATE_FILE, state.to_json())


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
    "STAGE_PREFIX",
    "STATE_FILE",
    "STATE_VERSION",
    "BatchCommit",
    "PublishState",
    "QueryRecord",
    "StagedFile",
    "append_staged",
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
