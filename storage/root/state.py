"""The state a root publishes: high watermarks and the streaming queries' committed batches.

    <root>/pylog-state.json   {"version": 2,
                               "high_watermarks": {"<topic>": {"<partition>": <offset>}},
                               "queries": {"<query id>": {"batch": <last committed batch id>,
                                                          "seen": <ms of its last commit>}},
                               "journal": "<id of the journal records that extend it>"}
    <root>/pylog-state.journal  one JSON line per change since: {"id": "<journal id>",
                               "seq": 1, 2, ..., "hw": [["<topic>", <partition>, <offset>]...],
                               "del": [["<topic>", <partition>]...], "queries": {...}}

``queries`` holds one record per streaming query (Spark's query id, kept in the query's
checkpoint): the exactly-once key.  A record not refreshed by a commit for the retention time
(``DEFAULT_QUERY_RETENTION_MS``, the sink option ``queryRetentionMs``) is dropped by the next
commit, as Delta Lake expires its ``txn`` entries.  A state file of another version than 2 is
refused (:class:`~pylog.storage.errors.UnsupportedFormatError`); a ``"sinks"`` key, if
present, is ignored.

On local disk a change is one line appended to the journal and fsynced (:func:`write_state`):
its cost does not depend on how many partitions the root has.  A record holds the high
watermarks it moved (``hw``) or removed (``del``) and, when they changed, all query records.
The journal is folded into the state file (a new journal id, then the journal emptied) once it
is a quarter of the state file's size, and at every checkpoint of the writer, so a root closed
cleanly has no journal records.  Records of another id than the state file's
(left by a crash during a fold) and a last line cut short (a crash while appending) are not
part of the state.  On object stores the state file alone is written: the commit of the
transaction publishes it.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pylog.storage.backends.base import Storage
from pylog.storage.errors import CorruptMetadataError, UnsupportedFormatError
from pylog.storage.root.metadata import root_step

STATE_FILE = "pylog-state.json"

DEFAULT_QUERY_RETENTION_MS = 7 * 24 * 3600 * 1000
"""How long the record of a streaming query that stopped committing is kept (7 days): a
query restarted later than that from its checkpoint is a new query, and a replay of its last
batch is written again."""

STATE_VERSION = 2


@dataclass(frozen=True)
class QueryRecord:
    batch: int  # the last batch id the query published
    seen: int  # ms since the epoch of that commit


@dataclass(frozen=True)
class BatchCommit:
    """What a publish records with its high watermarks: ``batch`` of the writer ``query``
    (Spark's streaming query id), at ``now`` ms; records of other queries older than
    ``retention_ms`` are dropped."""

    query: str
    batch: int
    now: int
    retention_ms: int = DEFAULT_QUERY_RETENTION_MS


class _Tracked(dict[tuple[str, int], int]):
    """High watermarks that note the keys set or removed since the state was last written
    (``changed`` None: not known, the next write replaces the whole state file)."""

    changed: set[tuple[str, int]] | None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.changed = set()

    def __setitem__(self, key: tuple[str, int], value: int) -> None:
        super().__setitem__(key, value)
        if self.changed is not None:
            self.changed.add(key)

    def __delitem__(self, key: tuple[str, int]) -> None:
        super().__delitem__(key)
        if self.changed is not None:
            self.changed.add(key)

    def pop(self, key: tuple[str, int], *default: Any) -> Any:
        if self.changed is not None:
            self.changed.add(key)
        return super().pop(key, *default)

    def _unknown(self) -> None:
        self.changed = None

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._unknown()
        super().update(*args, **kwargs)

    def setdefault(self, *args: Any) -> Any:
        self._unknown()
        return super().setdefault(*args)

    def popitem(self) -> tuple[tuple[str, int], int]:
        self._unknown()
        return super().popitem()

    def clear(self) -> None:
        self._unknown()
        super().clear()

    def __ior__(self, other: Any) -> _Tracked:  # type: ignore[override,misc]
        self._unknown()
        super().update(other)
        return self


@dataclass
class _Journal:
    """Where a state stands in the journal it was read with (or wrote)."""

    id: str  # the snapshot's journal id: records of another id are not its own
    seq: int  # its last record (0: none)
    end: int  # bytes of the journal up to that record
    exists: bool  # whether the journal file existed then
    snapshot_size: int  # bytes of the snapshot it belongs to
    queries: dict[str, QueryRecord]  # the query records as of ``seq``


@dataclass
class PublishState:
    """High watermarks per (topic, partition) and the last committed batch per query."""

    high_watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    queries: dict[str, QueryRecord] = field(default_factory=dict)
    _journal: _Journal | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.high_watermarks) is not _Tracked:
            self.high_watermarks = _Tracked(self.high_watermarks)

    def last_batch(self, query: str) -> int:
        """The last batch ``query`` published (-1 if none)."""
        rec = self.queries.get(query)
        return -1 if rec is None else rec.batch

    def record(self, commit: BatchCommit) -> None:
        """Record a published batch and expire queries not seen for ``retention_ms``."""
        self.queries[commit.query] = QueryRecord(commit.batch, commit.now)
        horizon = commit.now - commit.retention_ms
        for q in [q for q, r in self.queries.items() if r.seen < horizon and q != commit.query]:
            del self.queries[q]

    def copy(self) -> PublishState:
        return PublishState(dict(self.high_watermarks), dict(self.queries))

    def to_json(self, journal: str | None = None) -> bytes:
        """The state file's bytes; ``journal``: the id of the journal records that extend it."""
        hw: dict[str, dict[str, int]] = {}
        offsets = self.high_watermarks
        for topic, group in itertools.groupby(sorted(offsets), _topic_of):  # whole-topic passes
            keys = list(group)
            hw[topic] = dict(
                zip(map(str, map(_partition_of, keys)), map(offsets.__getitem__, keys), strict=True)
            )
        doc: dict[str, object] = {
            "version": STATE_VERSION,
            "high_watermarks": hw,
            "queries": _queries_json(self.queries),
        }
        if journal is not None:
            doc["journal"] = journal
        return json.dumps(doc, separators=(",", ":")).encode()  # (the C encoder, no indent)

    @staticmethod
    def from_json(data: bytes, path: str) -> PublishState:
        return _parse_snapshot(data, path)[0]


_topic_of, _partition_of = operator.itemgetter(0), operator.itemgetter(1)


def _queries_json(queries: Mapping[str, QueryRecord]) -> dict[str, dict[str, int]]:
    return {q: {"batch": r.batch, "seen": r.seen} for q, r in sorted(queries.items())}


def _queries(doc: Mapping[str, Any]) -> dict[str, QueryRecord]:
    return {str(q): QueryRecord(int(r["batch"]), int(r["seen"])) for q, r in doc.items()}


def _parse_snapshot(data: bytes, path: str) -> tuple[PublishState, str | None]:
    """The state file's content and the id of its journal (None: no journal extends it)."""
    try:
        doc = json.loads(data)
        version = doc.get("version")
        if type(version) is not int:
            raise ValueError(f"version {version!r} is not an integer")
        if version != STATE_VERSION:
            why = (
                "upgrade pylog to open this root"
                if version > STATE_VERSION
                else "an unreleased development format"
            )
            raise UnsupportedFormatError(
                f"{path}: state file version {version} is not supported (this pylog reads version "
                f"{STATE_VERSION} only: {why}); nothing is changed"
            )
        hw: dict[tuple[str, int], int] = {}
        for topic, parts in doc["high_watermarks"].items():  # whole-topic passes, no step per entry
            offsets = list(parts.values())
            if set(map(type, offsets)) - {int}:
                raise ValueError(f"high watermarks of topic {topic!r} must be integers")
            keys = zip(itertools.repeat(str(topic), len(offsets)), map(int, parts), strict=True)
            hw.update(zip(keys, offsets, strict=True))
        queries = _queries(doc["queries"])
        journal = doc.get("journal")
        if journal is not None and not isinstance(journal, str):
            raise ValueError(f"journal id {journal!r} is not a string")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{path}: not a valid pylog state file: {e}") from e
    return PublishState(hw, queries), journal


JOURNAL_FILE = "pylog-state.journal"
"""Changes of the state since the state file was written, one JSON line each: see
:func:`write_state`."""

JOURNAL_MIN_BYTES = 16 << 10
"""The journal is folded into the state file once longer than this or a quarter of the state
file, whichever is larger: a fold costs as much as a state file's worth of appends."""


def read_state(storage: Storage) -> PublishState:
    """The state as the state file and its journal describe it (journal first: a fold between
    the two reads leaves journal records the newer state file already holds, never the other
    way round)."""
    with root_step(storage, JOURNAL_FILE, "read it"):
        journal = storage.read(JOURNAL_FILE) if storage.exists(JOURNAL_FILE) else None
    with root_step(storage, STATE_FILE, "read it"):  # an I/O error names the file
        data = storage.read(STATE_FILE) if storage.exists(STATE_FILE) else None
    if data is None:
        return PublishState()
    key = storage.describe()
    hit = _parsed_states.get(key)
    if hit is None or hit[0] != data:  # (read again unchanged: a root opened, then writing)
        state, jid = _parse_snapshot(data, f"{key}/{STATE_FILE}")
        hit = (bytes(data), state, jid)
        _remember(key, hit)
    state, jid = hit[1].copy(), hit[2]
    if jid is not None:
        state._journal = _Journal(jid, 0, 0, journal is not None, len(data), dict(state.queries))
        if journal:
            _replay(state, state._journal, journal, f"{key}/{JOURNAL_FILE}")
    hw = state.high_watermarks
    assert isinstance(hw, _Tracked)
    hw.changed = set()
    return state


def _replay(state: PublishState, j: _Journal, data: bytes, path: str) -> None:
    """Apply the records of ``data`` that extend ``state`` (its id, seq 1, 2...).  A last line
    cut short (a crash while appending, or a writer appending now) is not a record; a journal
    that does not end with a record of this state's, or with a last line cut short, cannot be
    appended to (``state._journal`` None: the next write replaces the state file)."""
    lines = data.split(b"\n")
    torn = lines.pop() != b""
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        records = None
    if records is None:  # find the line (a last one cut short is a crash's, not damage)
        records = []
        for number, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except ValueError as e:
                if number == len(lines) and not torn:
                    lines.pop()
                    torn = True
                    break
                raise CorruptMetadataError(f"{path}: line {number} is not a journal record: {e}") from e
    hw = state.high_watermarks
    for number, (line, rec) in enumerate(zip(lines, records, strict=True), start=1):
        try:
            if rec["id"] != j.id:  # left by a fold that a crash interrupted: the state file has them
                state._journal = None
                return
            if rec["seq"] != j.seq + 1:
                raise ValueError(f"record {rec['seq']!r} follows record {j.seq}")
            for topic, p, offset in rec.get("hw", ()):
                if type(offset) is not int:
                    raise ValueError(f"offset {offset!r} is not an integer")
                hw[(str(topic), int(p))] = offset
            for topic, p in rec.get("del", ()):
                hw.pop((str(topic), int(p)), None)
            if "queries" in rec:
                state.queries = _queries(rec["queries"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptMetadataError(f"{path}: line {number} is not a valid journal record: {e}") from e
        j.seq += 1
        j.end += len(line) + 1
    j.queries = dict(state.queries)
    if torn:
        state._journal = None


_PARSED_KEPT = 16
_parsed_states: dict[str, tuple[bytes, PublishState, str | None]] = {}
"""The last state files parsed (or written), by root, with their bytes and journal ids."""


def _remember(key: str, hit: tuple[bytes, PublishState, str | None]) -> None:
    _parsed_states.pop(key, None)
    _parsed_states[key] = hit
    while len(_parsed_states) > _PARSED_KEPT:
        del _parsed_states[next(iter(_parsed_states))]


def write_state(storage: Storage, state: PublishState) -> None:
    """Durably record ``state``: one atomic step, so that what it publishes (high watermarks
    and a query's batch) becomes visible together or not at all.

    On local disk the changes since ``state`` was read or last written are appended to
    ``pylog-state.journal`` as one line and fsynced (the line is the commit: one cut short by
    a crash is not a record); a write costs the same however many partitions the root has.
    The state file is replaced (tmp → fsync → rename → fsync dir) instead when the journal is
    due for folding (:data:`JOURNAL_MIN_BYTES`), when the files are not the ones ``state``
    was read from, and on object stores, whose commit publishes the state file."""
    with root_step(storage, JOURNAL_FILE, "append to it"):
        if _append(storage, state):
            return
    with root_step(storage, STATE_FILE, "write it"):
        _write_snapshot(storage, state)


def fold_state(storage: Storage, state: PublishState) -> None:
    """Fold the journal into the state file (at a checkpoint: a root closed cleanly has only
    its state file), when it has records."""
    j = state._journal
    transactional = getattr(storage, "transactional", False)
    if j is not None and j.seq == 0 and not transactional:
        return
    if j is None and (transactional or not storage.exists(JOURNAL_FILE)):
        return
    with root_step(storage, STATE_FILE, "write it"):
        _write_snapshot(storage, state)


def _append(storage: Storage, state: PublishState) -> bool:
    j = state._journal
    hw = state.high_watermarks
    changed = hw.changed if isinstance(hw, _Tracked) else None
    if j is None or changed is None or getattr(storage, "transactional", False):
        return False
    if j.end > max(JOURNAL_MIN_BYTES, j.snapshot_size // 4):
        return False  # fold
    present = storage.exists(JOURNAL_FILE)
    if (storage.size(JOURNAL_FILE) if present else -1) != (j.end if j.exists else -1):
        return False  # not the journal this state was read with
    if not storage.exists(STATE_FILE) or storage.size(STATE_FILE) != j.snapshot_size:
        return False
    rec: dict[str, object] = {"id": j.id, "seq": j.seq + 1}
    keys = sorted(changed)
    rec["hw"] = [[t, p, hw[(t, p)]] for t, p in keys if (t, p) in hw]
    gone = [[t, p] for t, p in keys if (t, p) not in hw]
    if gone:
        rec["del"] = gone
    if state.queries != j.queries:
        rec["queries"] = _queries_json(state.queries)
    line = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    f = storage.open_append(JOURNAL_FILE)
    try:
        f.write(line)
        f.fsync()
    finally:
        f.close()
    if not j.exists:
        storage.fsync_dir("")  # the new file's name is durable too
    j.seq += 1
    j.end += len(line)
    j.exists = True
    j.queries = dict(state.queries)
    changed.clear()
    return True


def _write_snapshot(storage: Storage, state: PublishState) -> None:
    """Replace the state file with ``state`` (on local disk with a new journal id, then empty
    the journal: records of the old id left by a crash between the two are not read)."""
    transactional = getattr(storage, "transactional", False)
    jid = None if transactional else os.urandom(8).hex()
    data = state.to_json(journal=jid)
    storage.write_atomic(STATE_FILE, data)
    present = storage.exists(JOURNAL_FILE)
    if transactional:
        if present:
            storage.delete(JOURNAL_FILE)
        state._journal = None
    else:
        if present and storage.size(JOURNAL_FILE):
            storage.truncate(JOURNAL_FILE, 0)
        assert jid is not None
        state._journal = _Journal(jid, 0, 0, present, len(data), dict(state.queries))
    if not isinstance(state.high_watermarks, _Tracked):
        state.high_watermarks = _Tracked(state.high_watermarks)
    state.high_watermarks.changed = set()
    _remember(storage.describe(), (data, state.copy(), jid))  # the next read parses nothing


__all__ = [
    "DEFAULT_QUERY_RETENTION_MS",
    "JOURNAL_FILE",
    "JOURNAL_MIN_BYTES",
    "STATE_FILE",
    "STATE_VERSION",
    "BatchCommit",
    "PublishState",
    "QueryRecord",
    "fold_state",
    "read_state",
    "write_state",
]
