"""Maintenance of a whole root as a Spark job: one task per partition that needs work.

    from pylog.connector import maintenance
    summary = maintenance.run(spark, "s3://bucket/logs", topics=["events"])
    print(summary.describe())

The driver only plans: it opens the root, lists the partitions of the topics (all by default)
that hold data, and runs one Spark task per partition.  Each task opens the root itself and runs
:func:`pylog.storage.maintenance.runner.maintain` for its partition alone - retention, the
cleaner pass (Kafka's semantics; ``force`` cleans whatever the dirty ratio), and on object stores
the merging of small segments - and returns what it did.  The heavy work (reading, the offset
map, rewriting) happens on the executors; the driver's memory does not grow with the log.

Beside running writers (a streaming sink, appends):

- on an object store each task's work is one commit that touches only its partition's files;
  a commit that races with a writer of other partitions is re-based on it (see the commit log of
  :mod:`pylog.storage.backends.objectstore.commitlog`), one that races with an append to the same partition
  runs again on the newest state: appends are never lost or duplicated, offsets and values
  never change, readers of older states finish;
- on local disk a task reads and rewrites its partition without the root's writer lock and
  takes the lock (waiting up to ``lock_timeout_s`` for a sink's commit to finish) only for
  retention and to swap the rewritten segments in, after checking that the segments it read
  are unchanged (:mod:`pylog.storage.maintenance.detached`); tasks of one root clean in
  parallel and a sink's commits wait at most for a swap, not for a pass.

Progress shows as Spark job descriptions; the return value sums it up.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pylog.storage.root.manager as manager
import pylog.storage.root.opening as opening
from pylog.storage.maintenance.detached import DetachedReport, clean_detached
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition.checkpoint import TopicPartition


@dataclass
class PartitionResult:
    """What one task did for one partition."""

    topic: str
    partition: int
    bytes_before: int
    bytes_after: int
    records_removed: int
    segments_deleted: int
    segments_merged: int
    cleaned: bool
    elapsed_s: float
    error: str = ""
    conflicts: int = 0  # local disk: passes run again because a segment changed while read
    lock_held_s: float = 0.0  # local disk: time the task held the root's writer lock
    worker: str = ""  # host:pid of the process that ran the task


@dataclass
class MaintenanceSummary:
    """What :func:`run` did, per partition and in all."""

    path: str
    now: int
    partitions: list[PartitionResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def bytes_before(self) -> int:
        return sum(p.bytes_before for p in self.partitions)

    @property
    def bytes_after(self) -> int:
        return sum(p.bytes_after for p in self.partitions)

    @property
    def partitions_cleaned(self) -> int:
        return sum(p.cleaned for p in self.partitions)

    @property
    def records_removed(self) -> int:
        return sum(p.records_removed for p in self.partitions)

    @property
    def errors(self) -> dict[str, str]:
        return {f"{p.topic}-{p.partition}": p.error for p in self.partitions if p.error}

    def describe(self) -> str:
        return (
            f"{self.path}: {len(self.partitions)} partitions in {self.elapsed_s:.1f} s, "
            f"{self.partitions_cleaned} cleaned, {self.records_removed:,} records removed, "
            f"{self.bytes_before:,} -> {self.bytes_after:,} bytes"
            + (f", {len(self.errors)} failed: {self.errors}" if self.errors else "")
        )


def _size(root: manager.Root, tp: TopicPartition) -> int:
    return sum(s.size for s in root.log(*tp).segments)


def plan(
    path: str, storage_options: Mapping[str, Any] | None, topics: Iterable[str] | None
) -> list[TopicPartition]:
    """The partitions of ``topics`` (all by default) that hold data."""
    with opening.open_root(path, storage_options, read_only=True) as root:
        names = root.topics() if topics is None else list(topics)
        out = []
        for t in names:
            for p in range(root.partitions(t)):
                lg = root.log(t, p)
                if lg.log_end_offset > lg.log_start_offset:
                    out.append((t, p))
        return out


def run_partition(
    path: str,
    storage_options: Mapping[str, Any] | None,
    tp: TopicPartition,
    *,
    now: int,
    force: bool = False,
    retention: bool = True,
    compaction: bool = True,
    lock_timeout_s: float = 60.0,
) -> PartitionResult:
    """One task: maintenance of one partition (also usable without Spark)."""
    started = time.monotonic()

    def opener(read_only: bool) -> manager.Root:
        return opening.open_root(path, storage_options, read_only=read_only, lock_timeout=lock_timeout_s)

    with opener(True) as reader:
        transactional = reader.transactional
        before = _size(reader, tp)
        lg = reader.log(*tp)  # retention of a compacted-only topic removes only what lies below
        below_start = len(lg.segments) > 1 and lg.segments[1].base_offset <= lg.log_start_offset
        retention = retention and (lg.config.delete or below_start)  # the log start (no lock else)
    if transactional:  # an object store: one commit, re-based or re-run on a race
        with opener(False) as root:
            report = maintain(
                root, now=now, partitions=[tp], force=force, retention=retention, compaction=compaction
            )
        passes, removed, deleted, merged = (
            report.cleaning,
            report.records_removed,
            report.segments_deleted,
            report.segments_merged,
        )
        error, conflicts, held = "; ".join(report.uncleanable.values()), 0, 0.0
    else:  # a local disk: the writer lock only for retention and the swaps
        t0 = time.monotonic()
        deleted = 0
        if retention:
            with opener(False) as root:
                deleted = maintain(root, now=now, partitions=[tp], compaction=False).segments_deleted
        held = time.monotonic() - t0
        detached = clean_detached(opener, *tp, now=now, force=force) if compaction else DetachedReport()
        passes, merged = detached.passes, 0
        removed = sum(p.records_removed for p in passes)
        error, conflicts, held = detached.error, detached.conflicts, held + detached.lock_held_s
    with opener(True) as reader:
        after = _size(reader, tp)
    return PartitionResult(
        tp[0],
        tp[1],
        before,
        after,
        removed,
        deleted,
        merged,
        bool(passes),
        time.monotonic() - started,
        error,
        conflicts,
        held,
        f"{socket.gethostname()}:{os.getpid()}",
    )


def run(
    spark: Any,
    path: str,
    *,
    topics: Iterable[str] | None = None,
    now: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    force: bool = False,
    retention: bool = True,
    compaction: bool = True,
    lock_timeout_s: float = 60.0,
    max_tasks: int | None = None,
) -> MaintenanceSummary:
    """Retention, compaction and merging of ``path`` as a Spark job (see the module doc).
    ``now`` (ms, default: the clock) is the time retention and the cleaner judge by;
    ``max_tasks`` caps the tasks (default: one per partition; fewer run several partitions
    each, one after another)."""
    started = time.monotonic()
    now = int(time.time() * 1000) if now is None else now
    options = dict(storage_options or {})
    todo = plan(path, options, topics)
    summary = MaintenanceSummary(path, now)
    if not todo:
        return summary
    sc = spark.sparkContext
    sc.setJobDescription(f"pylog maintenance of {path}: {len(todo)} partitions")
    try:
        results = (
            sc.parallelize(todo, min(len(todo), max_tasks or len(todo)))
            .map(
                lambda tp: run_partition(
                    path,
                    options,
                    tp,
                    now=now,
                    force=force,
                    retention=retention,
                    compaction=compaction,
                    lock_timeout_s=lock_timeout_s,
                )
            )
            .collect()
        )
    finally:
        sc.setJobDescription(None)
    summary.partitions = sorted(results, key=lambda r: (r.topic, r.partition))
    summary.elapsed_s = time.monotonic() - started
    return summary


__all__ = ["MaintenanceSummary", "PartitionResult", "plan", "run", "run_partition"]
