"""Maintenance run by a writer that stays open, on local disk and on S3.

A root's writer keeps each partition's ``Log`` open across its appends.  Retention stops at
the log's high watermark and the cleaner at its last stable offset, both read from
``Log.high_watermark``: if that stays at its value of when the root was opened, maintenance of a
long-running writer never sees its own appends ("nothing to do").  These tests check:

* a root created, closed and opened again with ``pylog.open``, then appended to and maintained;
* one root kept open across 1,000 appends (200 on S3, where every append is a commit) to a
  compacted and a delete-policy topic, with maintenance every 20 appends at a simulated clock,
  against a model of Kafka's semantics after every run: the cleaner keeps the latest record of
  every key below the first uncleanable offset and everything above it, offsets unchanged, and
  tombstones until ``delete.retention.ms`` after the pass that first kept them (KIP-534's delete
  horizon); retention removes exactly the segments Kafka's ``deleteOldSegments`` removes (log
  start, then ``retention.bytes``, then ``retention.ms`` by each segment's largest timestamp,
  walking from the oldest and stopping at the first that stays, never a segment that reaches
  beyond the high watermark; the active segment only when all of it may go, as in Kafka: it is
  rolled first and an empty one stays at the log end).  On local disk, some runs see an
  unacknowledged tail past the high watermark (appended to the ``Log`` directly, truncated after
  the run, as a reopening writer would): neither retention nor the cleaner may go into it.
* retention's ``retention.bytes`` rule measures the log after the log-start rule's deletions.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

import pylog
from pylog.storage.backends.local import LocalStorage
from pylog.storage.maintenance.runner import MaintenanceReport, maintain
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.log import Log
from pylog.storage.root.manager import Root
from tests.conftest import Backend

T0 = 1_700_000_000_000
SEC = 1_000
MIN = 60 * SEC
HOUR = 60 * MIN

Row = tuple[int, bytes | None, bytes | None]


def rows(root: Root, topic: str) -> list[Row]:
    t = root.read_table(topic)
    return list(
        zip(
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )


def assert_increasing(got: list[Row]) -> None:
    offsets = [o for o, _, _ in got]
    assert all(a < b for a, b in itertools.pairwise(offsets)), offsets


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about what maintenance keeps, not durability: an append's fsyncs (about 8
    of them) would take most of the run."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


# ============================================================================ (a) the report


def test_reopened_root_maintenance_sees_its_own_appends(backend: Backend) -> None:
    """The issue's reproduction: ``pylog.open`` an existing root, append, ``maintain``."""
    with backend.open() as root:
        root.create_topic("c", config={"cleanup.policy": "compact", "segment.bytes": 4096})
        root.create_topic("d", config={"retention.ms": HOUR, "segment.bytes": 1024})
    per = 25 if backend.is_local else 125  # rows per append (S3: fewer appends, each is a commit)
    keys = [b"k%02d" % (j % 25) for j in range(per)]
    with backend.open() as root:  # opened again: its high watermarks are 0 at this moment
        for i in range(6000 // per):
            root.append("c", {"key": keys, "value": [b"v%03d" % i] * per}, timestamp=T0)
        for _ in range(20):
            root.append("d", {"key": [b"x"], "value": [b"y" * 200]}, timestamp=T0)
        assert root.high_watermark("c", 0) == root.log("c", 0).high_watermark == 6000
        assert root.high_watermark("d", 0) == root.log("d", 0).high_watermark == 20
        upper = root.log("c", 0).active.base_offset  # the first uncleanable offset
        assert 0 < upper < 6000

        report = maintain(root, now=T0, force=True)
        assert report.summary() != "nothing to do"
        assert report.cleaner_checkpoints == {"c-0": upper} and report.records_removed == upper - 25
        latest = {j: max(o for o in range(upper) if o % 25 == j) for j in range(25)}
        expected = [
            (o, keys[o % 25], b"v%03d" % (o // per)) for o in range(6000) if o >= upper or latest[o % 25] == o
        ]
        got = rows(root, "c")
        assert got == expected and len(got) == 25 + 6000 - upper  # (250 locally), not 6,000
        assert rows(root, "d") == [(o, b"x", b"y" * 200) for o in range(20)]  # not expired yet

        report = maintain(root, now=T0 + HOUR + 1)  # every record of d is older than retention.ms
        (r,) = report.retention
        assert r.directory == "d-0" and r.reasons == ["retention.ms"] and r.log_start_offset == 20
        assert rows(root, "d") == [] and root.log_start_offset("d", 0) == 20
    with backend.open(read_only=True) as reader:  # what the writer did is what the next one sees
        assert rows(reader, "c") == expected and rows(reader, "d") == []


# ============================================================================ (b) the model


@dataclass
class CompactedModel:
    """A compacted partition: every acknowledged record, and the offsets a reader must see."""

    delete_retention_ms: int
    records: dict[int, tuple[bytes, bytes | None]] = field(default_factory=dict)
    kept: list[int] = field(default_factory=list)
    checkpoint: int = 0  # the cleaner's first dirty offset
    horizons: dict[int, int] = field(default_factory=dict)  # tombstone -> delete horizon
    end: int = 0  # the high watermark
    removed: int = 0
    tombstones_removed: int = 0
    tombstones_kept_after_a_pass: int = 0

    def append(self, first: int, keys: list[bytes], values: list[bytes | None]) -> None:
        assert first == self.end
        for i, kv in enumerate(zip(keys, values, strict=True)):
            self.records[first + i] = kv
            self.kept.append(first + i)
        self.end += len(keys)

    def clean(self, upper: int, now: int) -> bool:
        """One forced cleaning pass up to the first uncleanable offset ``upper`` (a segment
        base), if anything below it is dirty; returns whether one runs."""
        if upper <= self.checkpoint:
            return False
        latest = {self.records[o][0]: o for o in self.kept if o < upper}
        out = []
        for o in self.kept:
            key, value = self.records[o]
            if o < upper and latest[key] != o:
                self.removed += 1
                continue
            if o < upper and value is None:
                if o not in self.horizons:
                    self.horizons[o] = now + self.delete_retention_ms  # the first pass stamps it
                elif now >= self.horizons[o]:
                    self.removed += 1
                    self.tombstones_removed += 1
                    continue
                else:
                    self.tombstones_kept_after_a_pass += 1
            out.append(o)
        self.kept = out
        self.checkpoint = upper
        return True

    def rows(self) -> list[Row]:
        return [(o, *self.records[o]) for o in self.kept]


@dataclass
class DeleteModel:
    """A delete-policy partition: its records and Kafka's ``deleteOldSegments``."""

    retention_ms: int
    retention_bytes: int
    records: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # offset -> (value, timestamp)
    start: int = 0
    end: int = 0  # the high watermark
    reasons: set[str] = field(default_factory=set)
    deleted_everything: int = 0

    def append(self, first: int, values: list[bytes], timestamps: list[int]) -> None:
        assert first == self.end
        for i, vt in enumerate(zip(values, timestamps, strict=True)):
            self.records[first + i] = vt
        self.end += len(values)

    def retain(
        self, segments: list[tuple[int, int]], leo: int, now: int
    ) -> tuple[list[int], list[int], list[str]]:
        """The base offsets of the segments retention deletes at ``now``, of those left, and the
        rules that deleted, from the log's segments (base offset, bytes; the last is the active
        one) before it."""
        segs = list(segments)
        deleted: list[int] = []
        reasons: list[str] = []

        def max_ts(lo: int, hi: int) -> int:
            return max(self.records[o][1] for o in range(lo, hi))

        def run(reason: str, predicate: Callable[[int, int, int, int], bool]) -> None:
            n = 0
            for i, (base, size) in enumerate(segs):
                upper = segs[i + 1][0] if i + 1 < len(segs) else leo
                if i + 1 == len(segs) and size == 0:  # an empty active segment stays
                    break
                if not (upper <= self.end and predicate(i, base, size, upper)):
                    break
                n += 1
            if not n:
                return
            reasons.append(reason)
            self.reasons.add(reason)
            deleted.extend(b for b, _ in segs[:n])
            if n == len(segs):  # everything goes: an empty active segment is rolled at the end
                segs[:] = [(leo, 0)]
                self.deleted_everything += 1
            else:
                del segs[:n]
            self.start = max(self.start, segs[0][0])

        run("log start offset", lambda i, b, s, u: i + 1 < len(segs) and segs[i + 1][0] <= self.start)
        size = sum(s for _, s in segs)
        if size >= self.retention_bytes >= 0:
            diff = [size - self.retention_bytes]

            def size_breached(i: int, b: int, s: int, u: int) -> bool:
                if diff[0] - s < 0:
                    return False
                diff[0] -= s
                return True

            run("retention.bytes", size_breached)
        run("retention.ms", lambda i, b, s, u: now - max_ts(b, u) > self.retention_ms)
        return deleted, [b for b, _ in segs], reasons

    def rows(self) -> list[Row]:
        return [(o, b"x", self.records[o][0]) for o in range(self.start, self.end)]


DELETE_RETENTION_MS = 8 * MIN  # longer than the 5 simulated minutes between runs: kept by one more
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": 400,
    "delete.retention.ms": DELETE_RETENTION_MS,
    "min.cleanable.dirty.ratio": 0.0,  # every dirty segment qualifies, with or without force
}
RETENTION_MS, RETENTION_BYTES = 10 * MIN, 2500
DELETE = {
    "cleanup.policy": "delete",
    "segment.bytes": 400,
    "retention.ms": RETENTION_MS,
    "retention.bytes": RETENTION_BYTES,
}
HOT_KEYS = [b"k0", b"k1", b"k2", b"k3"]
RARE_KEYS = [b"r%d" % i for i in range(8)]  # written now and then, half of the time deleted


def compacted_record(rng: random.Random, n: int, i: int) -> tuple[bytes, bytes | None]:
    if rng.random() < 0.1:
        return rng.choice(RARE_KEYS), None if rng.random() < 0.5 else b"r%04d-%d" % (n, i)
    return rng.choice(HOT_KEYS), None if rng.random() < 0.1 else b"c%04d-%d" % (n, i) + b"." * 20


def segments(lg: Log) -> list[tuple[int, int]]:
    return [(s.base_offset, s.size) for s in lg.segments]


def floor_base(segs: list[tuple[int, int]], offset: int) -> int:
    return max(b for b, _ in segs if b <= offset)


def append_tail(lg: Log, key: bytes, ts: int) -> None:
    """Records appended to the writer's log but never acknowledged (past its high watermark),
    one batch each, enough of them to roll a segment."""
    for i in range(8):
        lg.append([b"tail-%02d-" % i + b"." * 40], key=[key], timestamp=[ts])


@pytest.mark.slow  # 1,000 appends (200 on S3), each maintenance run checked against the model
def test_one_writer_across_appends_and_maintenance_keeps_kafka_semantics(backend: Backend) -> None:
    appends = 1000 if backend.is_local else 200
    every = 20
    steps = appends // every
    # pauses longer than retention.ms: every acknowledged record of the delete topic expires (at the
    # first one, on local disk, with an expired unacknowledged tail past the high watermark)
    jumps = (steps // 2, steps * 5 // 6)
    rng = random.Random(30)
    with backend.open() as root:
        root.create_topic("c", config=COMPACTED)
        root.create_topic("d", config=DELETE)
        root.append("c", {"key": [b"k0"], "value": [b"first"]}, timestamp=T0)
        root.append("d", {"key": [b"x"], "value": [b"first"]}, timestamp=T0)
    cm = CompactedModel(DELETE_RETENTION_MS)
    cm.append(0, [b"k0"], [b"first"])
    dm = DeleteModel(RETENTION_MS, RETENTION_BYTES)
    dm.append(0, [b"first"], [T0])
    clock = T0
    passes = tails = 0
    root = backend.open()  # one root, reopened once, then open for the whole run
    try:
        for n in range(1, appends + 1):
            clock += 15 * SEC
            count = rng.randint(1, 3)
            if rng.random() < 0.5:
                pairs = [compacted_record(rng, n, i) for i in range(count)]
                keys, values = [k for k, _ in pairs], [v for _, v in pairs]
                info = root.append("c", {"key": keys, "value": values}, timestamp=clock, partition=0)[0]
                cm.append(info.first_offset, keys, values)
            else:
                roll = rng.random()  # now and then a record from the future or a late one
                ts = clock + 20 * MIN if roll < 0.05 else clock - 30 * MIN if roll < 0.15 else clock
                dvalues = [b"d%04d-%d" % (n, i) + b"." * 30 for i in range(count)]
                written = root.append(
                    "d", {"key": [b"x"] * count, "value": dvalues}, timestamp=ts, partition=0
                )
                dm.append(written[0].first_offset, dvalues, [ts] * count)
            if n % every:
                continue
            step = n // every
            if step in jumps:
                clock += 45 * MIN
            # the writer's own appends are acknowledged, in the root and in its open logs
            for topic, end in (("c", cm.end), ("d", dm.end)):
                assert root.high_watermark(topic, 0) == root.log(topic, 0).high_watermark == end
            tail = backend.is_local and (step % 4 == 3 or step == jumps[0])
            if tail:  # records past the high watermark: maintenance must leave them alone
                append_tail(root.writable_log("c", 0), b"k0", clock)
                append_tail(root.writable_log("d", 0), b"x", clock - HOUR)  # expired, if acknowledged
                tails += 1
            c_segs, d_segs = segments(root.log("c", 0)), segments(root.log("d", 0))
            upper = floor_base(c_segs, min(cm.end, c_segs[-1][0]))  # min(LSO = HW, active base)
            cleans = cm.clean(upper, clock)
            expect_deleted, expect_left, reasons = dm.retain(d_segs, root.log("d", 0).log_end_offset, clock)

            report = maintain(root, now=clock, force=step % 2 == 0)
            check_report(report, cleans, upper, expect_deleted, reasons)
            assert root.log_start_offset("d", 0) == dm.start
            assert [b for b, _ in segments(root.log("d", 0))] == expect_left
            if tail:
                assert root.log("c", 0).log_end_offset > cm.end and root.log("d", 0).log_end_offset > dm.end
                if step == jumps[0]:  # every acknowledged segment expired: retention stops at the HW
                    assert expect_left[0] <= dm.end < expect_left[1] and len(expect_deleted) > 1
                root.writable_log("c", 0).truncate_to(cm.end)
                root.writable_log("d", 0).truncate_to(dm.end)
            passes += cleans
            got = rows(root, "c")
            assert_increasing(got)
            assert got == cm.rows(), f"step {step}: the compacted topic differs from the model"
            assert rows(root, "d") == dm.rows(), f"step {step}: the delete topic differs from the model"
    finally:
        root.close()
    # maintenance really removed things, by every rule the model knows
    assert passes >= steps // 2 and cm.removed > appends // 2
    assert cm.tombstones_removed > 0 and cm.tombstones_kept_after_a_pass > 0
    assert dm.reasons == {"retention.bytes", "retention.ms"} and dm.deleted_everything >= 1
    assert dm.start > dm.end // 2
    assert tails > steps // 5 if backend.is_local else tails == 0
    with backend.open(read_only=True) as reader:  # and the next process sees the same
        assert rows(reader, "c") == cm.rows() and rows(reader, "d") == dm.rows()


def check_report(
    report: MaintenanceReport, cleans: bool, upper: int, deleted: list[int], reasons: list[str]
) -> None:
    if cleans:
        assert report.cleaner_checkpoints == {"c-0": upper}, report.summary()
    else:
        assert report.cleaner_checkpoints == {}, report.summary()
    assert not report.uncleanable and not report.budget_exhausted
    retention = {r.directory: r for r in report.retention}
    assert set(retention) == ({"d-0"} if deleted else set()), report.summary()
    if deleted:
        assert retention["d-0"].deleted_base_offsets == deleted, report.summary()
        assert retention["d-0"].reasons == reasons, report.summary()


# ============================================================================ retention.bytes


def test_retention_bytes_measures_the_log_after_the_log_start_rule(tmp_path: Path) -> None:
    """A log start checkpointed beyond whole segments (a crash between the checkpoint and the
    renames): the log-start rule deletes them first, and ``retention.bytes`` then measures what
    is left, as Kafka's ``deleteRetentionSizeBreachedSegments`` does (not the size before)."""
    path = tmp_path / "root"
    with pylog.open(path) as root:
        root.create_topic("d", config={"segment.bytes": 300})
        for _ in range(12):
            root.append("d", pa.table({"key": [b"k"], "value": [b"x" * 100]}), timestamp=T0)
        segs = segments(root.log("d", 0))
    assert len(segs) == 12 and len({s for _, s in segs}) == 1
    ckpt.write_offsets(LocalStorage(path), ckpt.LOG_START_OFFSET, {("d", 0): segs[2][0]})
    size = segs[0][1]
    with pylog.open(path) as root:
        root.alter_config("d", {"retention.bytes": 10 * size - 10})  # the 10 segments left fit, barely
        report = maintain(root, now=T0)
        (r,) = report.retention
        assert r.reasons == ["log start offset"] and r.deleted_base_offsets == [segs[0][0], segs[1][0]]
        assert [b for b, _ in segments(root.log("d", 0))] == [b for b, _ in segs[2:]]
        root.alter_config("d", {"retention.bytes": 9 * size})  # now one more must go
        assert maintain(root, now=T0).retention[0].deleted_base_offsets == [segs[2][0]]
