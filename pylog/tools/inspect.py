"""Read-only inspection of a pylog root: ``describe`` (what is there) and ``verify`` (is it
all valid).  Both open the root read-only: they never take the writer lock and never modify a
file, so they are safe beside a running writer.  Results are plain dicts/lists (JSON-able) for
``pylog describe --json`` / ``pylog verify --json``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import numpy as np

from pylog.storage.backends.fs import LocalStorage
from pylog.storage.codec import records
from pylog.storage.errors import PylogError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root.consumers import consumer_lag, read_consumer_offsets
from pylog.storage.root.manager import CLEAN_SHUTDOWN, Root, partition_dir


class SegmentInfo(TypedDict):
    base_offset: int
    next_offset: int
    bytes: int
    index_entries: int
    time_index_entries: int
    largest_timestamp: int
    file: str


class PartitionInfo(TypedDict):
    partition: int
    log_start_offset: int
    log_end_offset: int
    bytes: int
    segments: list[SegmentInfo]


class TopicInfo(TypedDict):
    topic: str
    partitions: list[PartitionInfo]
    config_overrides: dict[str, Any]
    bytes: int


class ConsumerPartitionInfo(TypedDict):
    topic: str
    partition: int
    consumed: int
    lag: int


class ConsumerInfo(TypedDict):
    group: str
    lag: int
    partitions: list[ConsumerPartitionInfo]


class RootInfo(TypedDict):
    """What :func:`describe` returns (``pylog describe --json`` prints it as is)."""

    root: str
    clean_shutdown: bool
    topics: list[TopicInfo]
    consumers: list[ConsumerInfo]


def describe(root: Root) -> RootInfo:
    """Topics, partitions, segments, sizes, offsets and configs of ``root``."""
    topics: list[TopicInfo] = []
    for topic in root.topics():
        parts: list[PartitionInfo] = []
        for p in range(root.partitions(topic)):
            lg = root.log(topic, p)
            segs: list[SegmentInfo] = [
                {
                    "base_offset": s.base_offset,
                    "next_offset": s.read_next_offset(),
                    "bytes": s.size,
                    "index_entries": len(s.offset_index),
                    "time_index_entries": len(s.time_index),
                    "largest_timestamp": s.largest_timestamp,
                    "file": s.log_path,
                }
                for s in lg.segments
            ]
            parts.append(
                {
                    "partition": p,
                    "log_start_offset": lg.log_start_offset,
                    "log_end_offset": lg.log_end_offset,
                    "bytes": lg.size,
                    "segments": segs,
                }
            )
        cfg = root._topic(topic).get("config") or {}
        topics.append(
            {
                "topic": topic,
                "partitions": parts,
                "config_overrides": dict(cfg),
                "bytes": sum(p["bytes"] for p in parts),
            }
        )
    latest = {(t["topic"], p["partition"]): p["log_end_offset"] for t in topics for p in t["partitions"]}
    consumers: list[ConsumerInfo] = []
    for group, consumed in sorted(read_consumer_offsets(root.storage).items()):
        subscribed = {tp: end for tp, end in latest.items() if tp[0] in {t for t, _ in consumed}}
        lag = consumer_lag(consumed, subscribed)
        lags: list[ConsumerPartitionInfo] = [
            {"topic": t, "partition": p, "consumed": consumed.get((t, p), 0), "lag": n}
            for (t, p), n in sorted(lag.items())
        ]
        consumers.append({"group": group, "lag": sum(lag.values()), "partitions": lags})
    return {
        "root": root.storage.describe(),
        "clean_shutdown": root.storage.exists(CLEAN_SHUTDOWN),
        "topics": topics,
        "consumers": consumers,
    }


def format_describe(info: RootInfo) -> str:
    out = [f"root {info['root']}  (clean shutdown marker: {'yes' if info['clean_shutdown'] else 'no'})"]
    if not info["topics"]:
        out.append("no topics")
    for t in info["topics"]:
        overrides = ", ".join(f"{k}={v}" for k, v in sorted(t["config_overrides"].items())) or "defaults"
        out.append(
            f"\ntopic {t['topic']}  partitions {len(t['partitions'])}  {t['bytes']:,} bytes  "
            f"config: {overrides}"
        )
        out.append(
            f"  {'partition':>9} {'start':>12} {'end':>12} {'records*':>12} {'segments':>8} {'bytes':>14}"
        )
        for p in t["partitions"]:
            span = p["log_end_offset"] - p["log_start_offset"]
            out.append(
                f"  {p['partition']:>9} {p['log_start_offset']:>12} {p['log_end_offset']:>12} "
                f"{span:>12} {len(p['segments']):>8} {p['bytes']:>14,}"
            )
    if info["topics"]:
        out.append("\n* end - start: the offsets in range (compaction and control records leave gaps)")
    for c in info.get("consumers", []):
        out.append(f"\nquery {c['group']}: lag {c['lag']} records")
        for cp in c["partitions"]:
            out.append(f"  {cp['topic']}-{cp['partition']}: consumed up to {cp['consumed']}, lag {cp['lag']}")
    return "\n".join(out)


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong."""

    file: str
    message: str


def verify(
    root: Root, *, progress: Callable[[str], None] | None = None
) -> tuple[list[Problem], dict[str, int]]:
    """Validate every file of ``root``: checkpoints, every batch (CRC, sizes, records), offsets
    increasing within and across segments, and every index against its log.

    Returns the problems found and counters (segments, batches, records checked)."""
    problems: list[Problem] = []
    counts = {"segments": 0, "batches": 0, "records": 0, "bytes": 0}
    for name in (ckpt.RECOVERY_POINT, ckpt.LOG_START_OFFSET, ckpt.CLEANER_OFFSET):
        try:
            ckpt.read_offsets(root.storage, name)
        except PylogError as e:
            problems.append(Problem(name, str(e)))
    for topic in root.topics():
        for p in range(root.partitions(topic)):
            d = partition_dir(topic, p)
            if not root.storage.isdir(d):
                problems.append(Problem(d, "partition directory is missing"))
                continue
            lg = root.log(topic, p)
            prev_last = -1
            for seg in lg.segments:
                if progress:
                    progress(seg.log_path)
                counts["segments"] += 1
                prev_last = _verify_segment(root, seg, prev_last, problems, counts)
    return problems, counts


def _verify_segment(
    root: Root, seg: Any, prev_last: int, problems: list[Problem], counts: dict[str, int]
) -> int:
    end = 0
    try:
        for loc in seg.iter_batches(0):
            h = loc.headers
            rs = records.decode(loc.data, path=seg.log_path, base_position=loc.start)
            counts["batches"] += len(h)
            counts["records"] += len(rs)
            counts["bytes"] += int(h.size.sum())
            firsts = np.concatenate([[prev_last], h.last_offset[:-1]])
            bad = np.nonzero(h.base_offset <= firsts)[0]
            if bad.size:
                i = int(bad[0])
                problems.append(
                    Problem(
                        seg.log_path,
                        f"byte {int(h.position[i])}: batch base offset "
                        f"{int(h.base_offset[i])} does not follow offset {int(firsts[i])}",
                    )
                )
            if (h.base_offset < seg.base_offset).any():
                problems.append(Problem(seg.log_path, "a batch has offsets below the segment's base offset"))
            prev_last = int(h.last_offset[-1])
            end = int(h.position[-1] + h.size[-1])
        if seg.size > end:  # iteration stops quietly at a torn tail
            problems.append(
                Problem(
                    seg.log_path, f"{seg.size - end} invalid bytes at the end of the log (after byte {end})"
                )
            )
    except PylogError as e:
        problems.append(Problem(seg.log_path, str(e)))
    for idx in (seg.offset_index, seg.time_index, seg.txn_index):
        if idx is not seg.txn_index or root.storage.exists(idx.path):
            try:
                idx.sanity_check()
            except PylogError as e:
                problems.append(Problem(idx.path, str(e)))
    if isinstance(root.storage, LocalStorage):
        problems.extend(_verify_indexes(root.storage, seg))
    return prev_last


def _verify_indexes(storage: LocalStorage, seg: Any) -> list[Problem]:
    """Index entries checked against the log with the dump tool's --verify-index-only."""
    from pylog.tools.dump import dump

    found = []
    for idx in (seg.offset_index, seg.time_index):
        path = storage.resolve(idx.path)
        if not path.exists() or path.stat().st_size == 0:
            continue
        err = io.StringIO()
        if dump([str(path)], verify_index_only=True, out=io.StringIO(), err=err) != 0:
            found.append(Problem(idx.path, err.getvalue().strip() or "index does not match the log"))
    return found


def problems_as_json(problems: list[Problem]) -> list[dict[str, str]]:
    return [asdict(p) for p in problems]
