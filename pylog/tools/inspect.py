"""Read-only inspection of a pylog root: ``describe`` (what is there) and ``verify`` (is it
all valid).  Both open the root read-only: they never take the writer lock and never modify a
file, so they are safe beside a running writer.  Results are plain dicts/lists (JSON-able) for
``pylog describe --json`` / ``pylog verify --json``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import numpy as np

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.errors import PylogError, UnknownTopicError
from pylog.storage.maintenance.cleanable import log_to_clean
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition import layout
from pylog.storage.partition.segment import LogSegment
from pylog.storage.root import publish as pub
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
    cleanable_bytes: int  # compacted topics: bytes of dirty segments the cleaner would rewrite
    segments: list[SegmentInfo]


class TopicInfo(TypedDict):
    topic: str
    cleanable_bytes: int
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


def describe(root: Root, only: Sequence[str] | None = None) -> RootInfo:
    """Topics, partitions, segments, sizes, offsets and configs of ``root`` (of the topics
    ``only``, when given: the consumer groups then show those topics' partitions only)."""
    names = root.topics()
    if only:
        missing = [t for t in only if t not in names]
        if missing:
            raise UnknownTopicError(
                f"no topic {', '.join(map(repr, missing))} in {root.storage.describe()}; "
                f"its topics: {', '.join(names) or 'none'}"
            )
        names = [t for t in names if t in only]
    topics: list[TopicInfo] = []
    cleaner = ckpt.read_offsets(root.storage, ckpt.CLEANER_OFFSET)  # {} when there is none
    now = int(time.time() * 1000)
    for topic in names:
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
                    "cleanable_bytes": (
                        log_to_clean(lg, cleaner.get((topic, p)), now, with_lso=False).cleanable_bytes
                        if lg.config.compact
                        else 0
                    ),
                }
            )
        cfg = root._topic(topic).get("config") or {}
        topics.append(
            {
                "topic": topic,
                "partitions": parts,
                "config_overrides": dict(cfg),
                "bytes": sum(p["bytes"] for p in parts),
                "cleanable_bytes": sum(p["cleanable_bytes"] for p in parts),
            }
        )
    latest = {(t["topic"], p["partition"]): p["log_end_offset"] for t in topics for p in t["partitions"]}
    consumers: list[ConsumerInfo] = []
    for group, consumed in sorted(read_consumer_offsets(root.storage).items()):
        if only:
            consumed = {tp: off for tp, off in consumed.items() if tp[0] in names}
            if not consumed:
                continue
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
            f"  {'partition':>9} {'start':>12} {'end':>12} {'offsets*':>12} {'segments':>8} {'bytes':>14}"
        )
        for p in t["partitions"]:
            span = p["log_end_offset"] - p["log_start_offset"]
            out.append(
                f"  {p['partition']:>9} {p['log_start_offset']:>12} {p['log_end_offset']:>12} "
                f"{span:>12} {len(p['segments']):>8} {p['bytes']:>14,}"
            )
        if t["cleanable_bytes"]:
            out.append(
                f"  compaction backlog: {t['cleanable_bytes']:,} bytes of dirty segments (pylog compact, "
                "or pylog.connector.maintenance.run as a Spark job)"
            )
    if info["topics"]:
        out.append(
            "\n* end - start: offsets in range; a partition may hold fewer records "
            "(compaction and transaction markers leave gaps)"
        )
    for c in info.get("consumers", []):
        out.append(f"\nconsumer group {c['group']}: lag {c['lag']} records")
        for cp in c["partitions"]:
            out.append(f"  {cp['topic']}-{cp['partition']}: consumed up to {cp['consumed']}, lag {cp['lag']}")
    if info.get("consumers"):
        out.append(
            "\nconsumed: the offsets a group committed; lag: from there to the end. A Spark query "
            "commits a micro-batch's offsets when it plans its next micro-batch: the last one it "
            "read counts as lag until then"
        )
    return "\n".join(out)


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong: the file concerned, what is wrong, and its kind:
    ``checkpoint``, ``state``, ``missing-partition``, ``unreadable``, ``corrupt`` (a batch that
    does not decode: CRC, sizes, records), ``tail`` (invalid bytes at the end of a segment),
    ``order`` (offsets not increasing), ``misnamed`` (a batch below its segment's base offset),
    ``overlap`` (segments holding the same offsets), ``missing`` (offsets no segment holds that
    compaction cannot have removed: a missing or truncated segment), ``below-high-watermark``,
    ``log-start`` (the log start offset beyond the end) or ``index``."""

    file: str
    message: str
    kind: str = "corrupt"


def verify(
    root: Root, *, progress: Callable[[str], None] | None = None
) -> tuple[list[Problem], dict[str, int]]:
    """Validate every file of ``root``: checkpoints, the state file, every batch (CRC, sizes,
    records), offsets increasing within and across segments, segments agreeing with their names
    and covering every offset up to the high watermark, and every index against its log.

    Offsets no segment holds are damage unless compaction can have removed them: in a topic
    that is or was compacted (``cleanup.policy`` has ``compact``, or the partition has a
    cleaner checkpoint), anywhere below the active segment, which the cleaner never rewrites.
    Compaction keeps each segment's base offset (a cleaned segment takes the base of the first
    segment it replaces) and may remove any batch, so there a missing segment cannot be told
    from a cleaned one; in any other topic every offset up to the log end has a batch.

    Returns the problems found and counters (segments, batches, records checked)."""
    problems: list[Problem] = []
    counts = {"segments": 0, "batches": 0, "records": 0, "bytes": 0}
    checkpoints: dict[str, dict[tuple[str, int], int]] = {}
    for name in (ckpt.RECOVERY_POINT, ckpt.LOG_START_OFFSET, ckpt.CLEANER_OFFSET):
        try:
            checkpoints[name] = ckpt.read_offsets(root.storage, name)
        except PylogError as e:
            problems.append(Problem(name, str(e), "checkpoint"))
            checkpoints[name] = {}
    try:
        high_watermarks = pub.read_state(root.storage).high_watermarks
    except PylogError as e:
        problems.append(Problem(pub.STATE_FILE, str(e), "state"))
        high_watermarks = {}
    for topic in root.topics():
        for p in range(root.partitions(topic)):
            d = partition_dir(topic, p)
            if not root.storage.isdir(d):
                problems.append(Problem(d, "partition directory is missing", "missing-partition"))
                continue
            try:
                lg = root.log(topic, p)
            except PylogError as e:
                problems.append(Problem(d, str(e), "unreadable"))
                continue
            key = (topic, p)
            compacted = root.config(topic).compact or key in checkpoints[ckpt.CLEANER_OFFSET]
            walk = _Walk(lg.segments[-1].base_offset if compacted else -1)
            for i, seg in enumerate(lg.segments):
                if progress:
                    progress(seg.log_path)
                counts["segments"] += 1
                _verify_segment(root, lg.segments[i - 1] if i else None, seg, walk, problems, counts)
            _verify_ends(d, walk, lg.segments[-1], key, high_watermarks, checkpoints, problems)
    return problems, counts


@dataclass
class _Walk:
    """Where the check of one partition's segments is."""

    gaps_below: int
    """Offsets below it may be missing (removed by compaction); -1: none may."""
    last: int = -1
    """The last offset of the batches checked so far (-1: none yet)."""
    end: int = 0
    """The log end so far: after the last batch, or the base of an empty newest segment."""

    def gap(self, lo: int, hi: int) -> bool:
        """Whether offsets ``lo..hi-1`` may not be missing."""
        return hi > lo and hi > self.gaps_below


def _verify_segment(
    root: Root,
    prev: LogSegment | None,
    seg: LogSegment,
    walk: _Walk,
    problems: list[Problem],
    counts: dict[str, int],
) -> None:
    """The batches of ``seg`` (``prev``: the segment before it) and its indexes; the checks
    between segments and of a segment's name are those of :mod:`~pylog.storage.partition.layout`
    that writers and readers make."""
    path = seg.log_path
    if prev is not None:
        overlap = layout.overlap_problem(prev, seg)
        if overlap is not None:
            problems.append(Problem(path, overlap, "overlap"))
        elif seg.base_offset > walk.gaps_below:  # offsets below it may not be missing
            hole = layout.hole_problem(prev, seg)
            if hole is not None:
                problems.append(Problem(path, hole, "missing"))
    misnamed = layout.misnamed_problem(root.storage, seg.base_offset, path, seg.size)
    if misnamed is not None:
        problems.append(Problem(path, misnamed, "misnamed"))
    expected = seg.base_offset  # the first offset the next batch should have
    first = True
    end = 0
    batches = seg.iter_batches(0)
    while True:
        try:
            loc = next(batches, None)
        except PylogError as e:
            problems.append(
                Problem(path, f"{seg.size - end} invalid bytes at the end of the log ({e})", "tail")
            )
            break
        if loc is None:
            if seg.size > end:  # iteration stops quietly at a torn tail
                problems.append(
                    Problem(
                        path,
                        f"{seg.size - end} invalid bytes at the end of the log (after byte {end})",
                        "tail",
                    )
                )
            break
        h = loc.headers
        try:
            rs = records.decode(loc.data, path=path, base_position=loc.start)
        except PylogError as e:
            problems.append(Problem(path, str(e), "corrupt"))
            break
        counts["batches"] += len(h)
        counts["records"] += len(rs)
        counts["bytes"] += int(h.size.sum())
        # the offset each batch must follow: the previous batch's last, and for the first batch of a
        # segment also its base offset (a misnamed one is reported above: compared with the batches)
        below = first and int(h.base_offset[0]) < seg.base_offset
        before = walk.last if below or not first else max(walk.last, expected - 1)
        prevs = np.concatenate([[before], h.last_offset[:-1]])
        bad = np.nonzero(h.base_offset <= prevs)[0]
        if bad.size:
            i = int(bad[0])
            problems.append(
                Problem(
                    path,
                    f"byte {int(h.position[i])}: batch base offset {int(h.base_offset[i])} does not follow "
                    f"offset {int(prevs[i])}",
                    "order",
                )
            )
        legacy = np.concatenate([[False], h.magic[:-1] < 2]) | (h.magic < 2)
        gaps = np.nonzero((h.base_offset > prevs + 1) & ~legacy)[0]
        for i in gaps.tolist():
            lo, hi = int(prevs[i]) + 1, int(h.base_offset[i])
            if walk.gap(lo, hi):
                problems.append(
                    Problem(
                        path,
                        f"offsets {lo}..{hi - 1} are missing: no batch holds them before byte "
                        f"{int(h.position[i])} (a truncated or damaged segment)",
                        "missing",
                    )
                )
                break
        walk.last = int(h.last_offset[-1])
        expected = walk.last + 1
        end = int(h.position[-1] + h.size[-1])
        first = False
    walk.end = max(walk.last + 1, seg.base_offset) if first else walk.last + 1
    for idx in (seg.offset_index, seg.time_index, seg.txn_index):
        if idx is not seg.txn_index or root.storage.exists(idx.path):
            try:
                idx.sanity_check()
            except PylogError as e:
                problems.append(Problem(idx.path, str(e), "index"))
    if isinstance(root.storage, LocalStorage):
        problems.extend(_verify_indexes(root.storage, seg))


def _verify_ends(
    directory: str,
    walk: _Walk,
    active: LogSegment,
    key: tuple[str, int],
    high_watermarks: dict[tuple[str, int], int],
    checkpoints: dict[str, dict[tuple[str, int], int]],
    problems: list[Problem],
) -> None:
    """The log end against the high watermark, and the log start offset against the end."""
    hw = high_watermarks.get(key)
    if hw is not None and walk.end < hw:
        problems.append(
            Problem(
                directory,
                f"the log ends at offset {walk.end} ({active.log_path}), below its high watermark {hw} "
                f"({pub.STATE_FILE}): offsets {walk.end}..{hw - 1} were acknowledged but no segment "
                "holds them",
                "below-high-watermark",
            )
        )
    start = checkpoints[ckpt.LOG_START_OFFSET].get(key)
    limit = walk.end if hw is None else min(walk.end, hw)
    if start is not None and start > limit:
        problems.append(
            Problem(
                ckpt.LOG_START_OFFSET,
                f"{key[0]} {key[1]}: the log start offset {start} is beyond the end of {directory} "
                f"(offset {limit}): a writer would empty the log",
                "log-start",
            )
        )


def _verify_indexes(storage: LocalStorage, seg: LogSegment) -> list[Problem]:
    """Index entries checked against the log with the dump tool's --verify-index-only."""
    from pylog.tools.dump import dump

    found = []
    for idx in (seg.offset_index, seg.time_index):
        path = storage.resolve(idx.path)
        if not path.exists() or path.stat().st_size == 0:
            continue
        err = io.StringIO()
        if dump([str(path)], verify_index_only=True, out=io.StringIO(), err=err) != 0:
            found.append(Problem(idx.path, err.getvalue().strip() or "index does not match the log", "index"))
    return found


def problems_as_json(problems: list[Problem]) -> list[dict[str, str]]:
    return [asdict(p) for p in problems]
