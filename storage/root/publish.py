"""Atomic publishing: high watermarks and exactly-once sink commits in one state file.

    <root>/pylog-state.json   {"version": 1,
                               "high_watermarks": {"<topic>": {"<partition>": <offset>}},
                               "sinks": {"<sink id>": <last committed batch id>}}

The high watermark (HW) of a partition is the end of its *acknowledged* data: readers never
read at or beyond it, and a writer that opens the root truncates each log back to its HW
(data past it was written by a publish that never completed), as a Kafka follower truncates
to its high watermark.  A publish therefore is:

1. append the staged batches to their partition logs (offsets assigned by the log, as a
   partition leader does) and fsync them;
2. replace ``pylog-state.json`` (tmp → fsync → rename → fsync dir) with the new HWs *and*
   the sink's batch id.

Step 2 is a single atomic rename, so the data becoming visible and the record of
(sink, batchId) that makes a replay a no-op happen together: a crash before it leaves the
appended bytes invisible (and truncated by the next writer), a crash after it leaves a
committed batch that a replayed ``commit`` skips.  Partitions without a HW entry (logs copied
from Kafka, or roots from before this file existed) are readable up to their log end.

Staged data (what Spark tasks write before the driver commits) lives in hidden files inside
the partition directories, ``.pylog-stage.<sink>.<batch>.<task>.<attempt>``: Kafka and the
log loader ignore files that are not segment files, and a sweep removes those of committed
or abandoned batches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pylog.storage.backends.fs import Storage
from pylog.storage.errors import CorruptMetadataError, PylogError
from pylog.storage.root.metadata import partition_dir

STATE_FILE = "pylog-state.json"
STAGE_PREFIX = ".pylog-stage."
_SINK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


@dataclass
class PublishState:
    """High watermarks per (topic, partition) and the last committed batch per sink."""

    high_watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    sinks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        hw: dict[str, dict[str, int]] = {}
        for (topic, p), off in sorted(self.high_watermarks.items()):
            hw.setdefault(topic, {})[str(p)] = off
        return json.dumps(
            {"version": 1, "high_watermarks": hw, "sinks": dict(sorted(self.sinks.items()))}, indent=1
        ).encode()

    @staticmethod
    def from_json(data: bytes, path: str) -> PublishState:
        try:
            doc = json.loads(data)
            if doc.get("version") != 1:
                raise ValueError(f"unsupported version {doc.get('version')!r} (expected 1)")
            hw = {
                (str(t), int(p)): int(o)
                for t, parts in doc["high_watermarks"].items()
                for p, o in parts.items()
            }
            sinks = {str(k): int(v) for k, v in doc["sinks"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptMetadataError(f"{path}: not a valid pylog state file: {e}") from e
        return PublishState(hw, sinks)


def read_state(storage: Storage) -> PublishState:
    if not storage.exists(STATE_FILE):
        return PublishState()
    return PublishState.from_json(storage.read(STATE_FILE), f"{storage.describe()}/{STATE_FILE}")


def write_state(storage: Storage, state: PublishState) -> None:
    storage.write_atomic(STATE_FILE, state.to_json())


def validate_sink_id(sink_id: str) -> str:
    if not isinstance(sink_id, str) or not _SINK_ID.match(sink_id):
        raise PylogError(f"sink id {sink_id!r} must be 1-128 characters of [A-Za-z0-9_-]")
    return sink_id


def stage_name(sink_id: str, batch_id: int, task: int, attempt: int) -> str:
    """File name (inside a partition directory) of one task attempt's staged batches."""
    return f"{STAGE_PREFIX}{validate_sink_id(sink_id)}.{int(batch_id)}.{int(task)}.{int(attempt)}"


def parse_stage_name(name: str) -> tuple[str, int, int, int] | None:
    if not name.startswith(STAGE_PREFIX):
        return None
    parts = name[len(STAGE_PREFIX) :].split(".")
    if len(parts) != 4 or not all(p.lstrip("-").isdigit() for p in parts[1:]):
        return None
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


@dataclass(frozen=True)
class StagedFile:
    """Where a task staged encoded batches for one partition: a file inside the partition
    directory, or (small stagings on object stores) the bytes themselves, carried to the
    driver in the task's commit message instead of a PUT, a GET and a DELETE."""

    topic: str
    partition: int
    name: str  # file name inside the partition directory
    data: bytes | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"topic": self.topic, "partition": self.partition, "name": self.name}
        if self.data is not None:
            d["data"] = self.data
        return d

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> StagedFile:
        data = d.get("data")
        return StagedFile(
            str(d["topic"]),
            int(d["partition"]),  # type: ignore[call-overload]
            str(d["name"]),
            None if data is None else bytes(data),  # type: ignore[call-overload]
        )


def group_staged(staged: Iterable[StagedFile]) -> dict[tuple[str, int], list[StagedFile]]:
    """Staged files per (topic, partition), in the deterministic order a publish appends
    them: by topic, partition, then file name."""
    groups: dict[tuple[str, int], list[StagedFile]] = {}
    for f in sorted(staged, key=lambda f: (f.topic, f.partition, f.name)):
        groups.setdefault((f.topic, f.partition), []).append(f)
    return groups


def read_staged(storage: Storage, files: Iterable[StagedFile]) -> bytes:
    """The encoded batches of ``files`` (of one partition), one after the other."""
    return b"".join(
        f.data if f.data is not None else storage.read(f"{partition_dir(f.topic, f.partition)}/{f.name}")
        for f in files
    )


def sweep_staged(
    storage: Storage, sink_id: str, up_to_batch: int, partitions: Iterable[tuple[str, int]]
) -> int:
    """Delete the staged files of ``sink_id`` for batches <= ``up_to_batch`` in the
    directories of ``partitions``; returns how many were removed."""
    removed = 0
    for topic, p in partitions:
        d = partition_dir(topic, p)
        for name in storage.listdir(d):
            parsed = parse_stage_name(name)
            if parsed and parsed[0] == sink_id and parsed[1] <= up_to_batch:
                storage.delete(f"{d}/{name}")
                removed += 1
    return removed


__all__ = [
    "STAGE_PREFIX",
    "STATE_FILE",
    "PublishState",
    "StagedFile",
    "group_staged",
    "parse_stage_name",
    "read_staged",
    "read_state",
    "stage_name",
    "sweep_staged",
    "validate_sink_id",
    "write_state",
]
