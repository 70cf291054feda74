"""maintain() over logs and roots, the compact/retain CLI, and a model-based test of
appends, rolls, compaction and retention against an in-memory model.

The root-level tests and the CLI test take ``backend``: they run on local disk and on S3
(tests/conftest.py).  maintain(log) and the model test work on one Log in a local directory
(Log-level units); the corrupt-segment test damages a file on disk."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pylog
from pylog.cli import main
from pylog.storage.backends.local import LocalStorage
from pylog.storage.config import CleanerConfig
from pylog.storage.maintenance.cleaner import Cleaner, log_to_clean
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition import checkpoint as ckpt
from tests.conftest import Backend
from tests.storage.compaction_util import (
    DAY,
    DIR,
    T0,
    assert_kafka_valid,
    latest_per_key,
    open_log,
    put,
    put_many,
    reopen,
    rows,
    segment_files,
)

HOUR = 3_600_000


def dupes(lg, n: int, keys: int = 8, ts: int = T0) -> None:  # type: ignore[no-untyped-def]
    put_many(lg, [(b"k%d" % (i % keys), b"v%04d" % i) for i in range(n)], ts=ts)


# ============================================================================ maintain(log)


def test_maintain_log_cleans_when_dirty_ratio_is_exceeded(tmp_path: Path) -> None:
    lg = open_log(tmp_path, min_cleanable_dirty_ratio=0.5)
    dupes(lg, 80)
    lg.roll()
    before = rows(lg)
    report = maintain(lg, now=T0)
    assert len(report.cleaning) == 1 and report.cleaner_checkpoints == {"t-0": lg.active.base_offset}
    assert rows(lg) == latest_per_key(before, lg.active.base_offset)
    assert ckpt.read_offsets(LocalStorage(tmp_path), ckpt.CLEANER_OFFSET) == {("t", 0): lg.active.base_offset}
    assert report.records_removed == len(before) - len(rows(lg)) and "cleaned offsets" in report.summary()
    json.dumps(report.to_dict())
    # clean part is now large: a little new dirty data stays under the ratio
    dupes(lg, 3)
    lg.roll()
    ltc = log_to_clean(lg, lg.active.base_offset - 3, T0)
    assert 0 < ltc.cleanable_ratio < 0.5
    assert maintain(lg, now=T0).cleaning == []
    assert maintain(lg, now=T0, force=True).cleaning[0].first_dirty_offset == lg.active.base_offset - 3


def test_max_compaction_lag_forces_a_clean(tmp_path: Path) -> None:
    lg = open_log(tmp_path, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=HOUR)
    dupes(lg, 40)
    lg.roll()
    maintain(lg, now=T0)  # first pass: everything dirty, ratio 1.0
    dupes(lg, 2, ts=T0 + 10)
    lg.roll()
    assert maintain(lg, now=T0 + HOUR).cleaning == []  # not yet older than the lag
    ltc = log_to_clean(
        lg, ckpt.read_offsets(LocalStorage(tmp_path), ckpt.CLEANER_OFFSET)[("t", 0)], T0 + 2 * HOUR
    )
    assert ltc.need_compaction_now and ltc.cleanable_ratio < 0.99
    assert len(maintain(lg, now=T0 + 2 * HOUR).cleaning) == 1


def test_maintain_runs_retention_then_deletes_files_after_the_delay(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="delete", retention_ms=HOUR, file_delete_delay_ms=1000)
    for i in range(3):
        put(lg, b"k", b"v", ts=T0 + i)
        lg.roll()
    report = maintain(lg, now=T0 + 2 * HOUR)
    assert report.segments_deleted == 3 and report.files_deleted == 0
    assert any(n.endswith(".deleted") for n in segment_files(tmp_path))
    assert maintain(lg, now=T0 + 2 * HOUR + 1000).files_deleted == 3
    assert not any(n.endswith(".deleted") for n in segment_files(tmp_path))


def test_budget_stops_the_offset_map_early_but_progresses(tmp_path: Path) -> None:
    lg = open_log(tmp_path, segment_bytes=600)
    dupes(lg, 120)
    lg.roll()
    ticks = iter(range(1000))
    report = maintain(lg, now=T0, budget_s=2.5, clock=lambda: float(next(ticks)))
    assert report.budget_exhausted
    assert len(report.cleaning) == 1 and report.cleaning[0].map_full
    first = report.cleaning[0].end_offset
    assert 0 < first < lg.active.base_offset
    report = maintain(lg, now=T0)  # the next run continues from the checkpoint
    assert report.cleaning[0].first_dirty_offset == first


# ============================================================================ maintain(root)


def fill(root: pylog.Root, topic: str, n: int = 60, prefix: bytes = b"v") -> None:
    """``n`` acknowledged appends of one batch each, then a roll, as one transaction (so that an
    object store seals one segment per segment.bytes, as local disk does, not one per append)."""

    def run() -> None:
        for i in range(n):
            root.append(topic, [prefix + b"%04d" % i], key=[b"k%d" % (i % 8)], timestamp=T0, partition=0)
        root.writable_log(topic, 0).roll()

    root.transaction(run)


def make_root(where: Path | Backend) -> pylog.Root:
    root = where.open() if isinstance(where, Backend) else pylog.open(where)
    root.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": 1024})
    root.create_topic("d", 1, {"cleanup.policy": "compact", "segment.bytes": 1024})
    root.create_topic("r", 1, {"cleanup.policy": "delete", "retention.ms": HOUR, "segment.bytes": 1024})
    for t in ("c", "d", "r"):
        fill(root, t)
    return root


def export(root: pylog.Root, directory: str, dst: Path) -> Path:
    """Copy the files of a partition directory of ``root`` (any storage) to ``dst``/t-0."""
    out = dst / DIR
    out.mkdir(parents=True)
    for name in root.storage.listdir(directory):
        (out / name).write_bytes(root.storage.read(f"{directory}/{name}"))
    return dst


def test_b18_corrupt_log_is_uncleanable_others_still_cleaned(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    root.close()
    seg = sorted((tmp_path / "c-0").glob("*.log"))[1]
    data = bytearray(seg.read_bytes())
    data[16] = 0xFF  # invalid magic in a segment the cleaner must read
    seg.write_bytes(bytes(data))
    before_c = {p.name: p.read_bytes() for p in (tmp_path / "c-0").iterdir()}
    with pylog.open(tmp_path) as root:
        cleaner = Cleaner()
        report = maintain(root, now=T0 + 2 * HOUR, cleaner=cleaner)
        assert list(report.uncleanable) == ["c-0"] and "magic" in report.uncleanable["c-0"]
        assert [c.directory for c in report.cleaning] == ["d-0"]
        assert report.segments_deleted > 0  # retention of topic r
        assert "uncleanable" in report.summary()
        # remembered: not retried by the same cleaner
        again = maintain(root, now=T0 + 2 * HOUR, cleaner=cleaner, force=True)
        assert again.cleaning == [] and list(again.uncleanable) == ["c-0"]
    after_c = {p.name: p.read_bytes() for p in (tmp_path / "c-0").iterdir()}
    assert {k: v for k, v in after_c.items() if k.endswith(".log")} == {
        k: v for k, v in before_c.items() if k.endswith(".log")
    }


def test_maintain_root_topics_partitions_checkpoints(backend: Backend) -> None:
    root = make_root(backend)
    report = maintain(root, now=T0, topics=["c"])
    assert [c.directory for c in report.cleaning] == ["c-0"] and report.retention == []
    report = maintain(root, now=T0 + 2 * HOUR, partitions=[("r", 0)])
    assert report.cleaning == [] and report.segments_deleted == 5
    report = maintain(root, now=T0 + 2 * HOUR, retention=False)
    assert [c.directory for c in report.cleaning] == ["d-0"]
    root.close()
    with backend.open(read_only=True) as reader:
        cleaner_ckpt = ckpt.read_offsets(reader.storage, ckpt.CLEANER_OFFSET)
    assert set(cleaner_ckpt) == {("c", 0), ("d", 0)}
    with backend.open() as again:
        assert again.log("r", 0).log_start_offset == 60
        for t in ("c", "d"):
            assert again.log(t, 0).read_table().num_rows == 8


def test_cleaner_disabled_skips_compaction_but_not_retention(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    before = {t: root.log(t, 0).read_table().num_rows for t in ("c", "d")}
    off = CleanerConfig.from_dict({"log.cleaner.enable": "false"})
    report = maintain(root, now=T0 + 2 * HOUR, force=True, cleaner_config=off)
    assert report.segments_deleted == 5 and root.log("r", 0).log_start_offset == 60  # retention ran
    assert report.cleaning == [] and report.cleaner_checkpoints == {}  # compaction did not
    assert {t: root.log(t, 0).read_table().num_rows for t in ("c", "d")} == before == {"c": 60, "d": 60}
    assert report.compaction_skipped == "log.cleaner.enable=false"
    assert "compaction not run: log.cleaner.enable=false" in report.summary()
    assert json.loads(json.dumps(report.to_dict()))["compaction_skipped"] == "log.cleaner.enable=false"
    assert ckpt.read_offsets(root.storage, ckpt.CLEANER_OFFSET) == {}
    # the same through a cleaner passed in; with the cleaner enabled the same call compacts
    assert maintain(root, now=T0 + 2 * HOUR, force=True, cleaner=Cleaner(off)).cleaning == []
    report = maintain(root, now=T0 + 2 * HOUR, force=True)
    assert [c.directory for c in report.cleaning] == ["c-0", "d-0"] and report.compaction_skipped == ""
    root.close()


def test_retention_only_root_reports_no_skipped_compaction(tmp_path: Path) -> None:
    with pylog.open(tmp_path) as root:
        root.create_topic("r", 1, {"cleanup.policy": "delete", "retention.ms": HOUR, "segment.bytes": 1024})
        fill(root, "r")
        off = CleanerConfig(enable=False)
        report = maintain(root, now=T0 + 2 * HOUR, cleaner_config=off)
        assert report.segments_deleted == 5 and report.compaction_skipped == ""


def test_throttle_sleeps_count_against_the_budget(tmp_path: Path) -> None:
    lg = open_log(tmp_path, segment_bytes=600)
    dupes(lg, 120)
    lg.roll()
    t = [0.0]

    def sleep(seconds: float) -> None:
        t[0] += seconds

    slow = CleanerConfig.from_dict({"log.cleaner.io.max.bytes.per.second": 1000})  # ~8 s for this log
    report = maintain(lg, now=T0, budget_s=1.0, cleaner_config=slow, clock=lambda: t[0], sleep=sleep)
    assert report.budget_exhausted and len(report.cleaning) == 1
    res = report.cleaning[0]
    assert res.map_full and 0 < res.end_offset < lg.active.base_offset  # a partial pass, within budget
    assert report.throttled_s == res.throttled_s == pytest.approx(t[0]) and report.elapsed_s == t[0]
    assert "throttled" in report.summary()
    # without the limit the same budget covers the whole log (nothing else moves the fake clock)
    report = maintain(lg, now=T0, budget_s=1.0, force=True, clock=lambda: t[0], sleep=sleep)
    assert not report.budget_exhausted and report.throttled_s == 0.0


def test_root_read_table_after_compaction_is_kafka_valid(backend: Backend, tmp_path: Path) -> None:
    root = make_root(backend)
    maintain(root, now=T0, force=True)
    root.close()
    with backend.open(read_only=True) as reader:
        for t in ("c", "d"):
            assert reader.read_table(t).num_rows == 8
            assert_kafka_valid(export(reader, f"{t}-0", tmp_path / t))


# ============================================================================ CLI


def test_cli_compact_and_retain(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    make_root(backend).close()
    url, opts = backend.url, backend.cli_args()
    assert main(["compact", url, *opts, "--topic", "c", "--now", str(T0), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [c["directory"] for c in out["cleaning"]] == ["c-0"] and out["cleaner_checkpoints"] == {"c-0": 60}
    assert main(["retain", url, *opts, "--now", str(T0 + 2 * HOUR)]) == 0
    text = capsys.readouterr().out
    assert "r-0: deleted 5 segments" in text
    assert main(["compact", url, *opts, "--force", "--now", str(T0), "--dedupe-buffer-size", "64"]) == 0
    assert "d-0: cleaned" in capsys.readouterr().out
    assert main(["compact", url, *opts, "--topic", "nope"]) == 1
    assert "unknown topic" in capsys.readouterr().err
    assert main(["compact", url, *opts, "--now", "-5"]) == 2
    assert main(["compact", url, *opts, "--dedupe-buffer-size", "10"]) == 2
    assert "holds no key" in capsys.readouterr().err
    with backend.open(read_only=True) as root:
        assert root.log("c", 0).read_table().num_rows == 8
        assert root.log("r", 0).log_start_offset == 60
    assert main(["retain", backend.child("missing").url, *opts]) == 1
    assert "missing" in capsys.readouterr().err


# ============================================================================ model-based test


class CompactionModel(RuleBasedStateMachine):
    """Appends (overwrites and tombstones over a few keys), rolls, flushes, compaction and
    retention at an advancing ``now``, reopens; after every step the log must read exactly as
    the model predicts, with every offset unchanged."""

    DR = 50  # delete.retention.ms
    RETENTION = 400  # retention.ms

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="pylog-model-"))
        self.cfg: dict[str, Any] = dict(
            cleanup_policy="compact,delete",
            segment_bytes=512,  # above the largest append (8 records of 40 bytes: 477 bytes)
            delete_retention_ms=self.DR,
            retention_ms=self.RETENTION,
            min_cleanable_dirty_ratio=0.5,
        )
        self.log = open_log(self.dir, **self.cfg)
        self.now = T0
        self.records: dict[int, tuple[bytes, bytes | None, int]] = {}  # offset -> key, value, batch
        self.horizon: dict[int, int] = {}  # batch base offset -> delete horizon
        self.first_dirty = 0
        self.start = 0
        self.cleaner = Cleaner(CleanerConfig.from_dict({"log.cleaner.dedupe.buffer.size": 1 << 16}))

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        items=st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.booleans()), min_size=1, max_size=8),
        roll=st.booleans(),
    )
    def append(self, items: list[tuple[int, bool, bool]], roll: bool) -> None:
        keys = [b"key-%d" % k for k, _, _ in items]
        vals = [None if tomb and not small else (b"x" * (3 if small else 40)) for _, tomb, small in items]
        info = self.log.append(vals, key=keys, timestamp=self.now)
        for i, (k, v) in enumerate(zip(keys, vals, strict=True)):
            self.records[info.first_offset + i] = (k, v, info.first_offset)
        if roll:
            self.log.roll(now=self.now)

    @rule()
    def roll(self) -> None:
        self.log.roll(now=self.now)

    @rule()
    def flush(self) -> None:
        self.log.flush(now=self.now)

    @rule(dt=st.sampled_from([1, 10, 30, 60, 200, 500]))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule()
    def compact(self) -> None:
        upper = self.log.active.base_offset
        report = maintain(self.log, now=self.now, retention=False, force=True, cleaner=self.cleaner)
        if upper <= self.first_dirty or not any(o < upper for o in self.records if o >= self.first_dirty):
            return
        assert [c.end_offset for c in report.cleaning] == [upper]
        latest: dict[bytes, int] = {}
        for o, (k, _, _) in sorted(self.records.items()):
            if self.first_dirty <= o < upper:
                latest[k] = o
        kept: dict[int, tuple[bytes, bytes | None, int]] = {}
        tombstone_batches: set[int] = set()
        for o, (k, v, b) in sorted(self.records.items()):
            if o >= upper:
                kept[o] = (k, v, b)
                continue
            if o < latest.get(k, -1):
                continue
            if v is None and b in self.horizon and self.now >= self.horizon[b]:
                continue
            kept[o] = (k, v, b)
            if v is None:
                tombstone_batches.add(b)
        for b in tombstone_batches:
            self.horizon.setdefault(b, self.now + self.DR)
        self.records = kept
        self.first_dirty = upper

    @precondition(lambda self: self.log.segments[0].base_offset < self.log.active.base_offset)
    @rule()
    def retain(self) -> None:
        segs = self.log.segments
        hw = max(self.log.recovery_point, self.log.active.base_offset)
        bounds = [s.base_offset for s in segs[1:]] + [self.log.log_end_offset]
        new_start = self.start
        for seg, upper in zip(segs, bounds, strict=True):
            if seg is segs[-1] and seg.size == 0:
                break
            ts = seg.largest_timestamp
            expired = (ts >= 0 and self.now - ts > self.RETENTION) or (
                ts < 0 and self._empty(seg.base_offset, upper)
            )
            if not (upper <= hw and expired):
                break
            new_start = max(new_start, upper)
        report = maintain(self.log, now=self.now, compaction=False)
        assert self.log.log_start_offset == new_start, report.summary()
        self.start = new_start
        self.records = {o: r for o, r in self.records.items() if o >= new_start}
        self.first_dirty = max(self.first_dirty, new_start)

    def _empty(self, lo: int, hi: int) -> bool:
        return not any(lo <= o < hi for o in self.records)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        self.log.close()
        self.log = reopen(self.dir, clean=clean, log_start_offset=self.start, **self.cfg)

    @invariant()
    def reads_match_the_model(self) -> None:
        got = rows(self.log)
        want = [(o, k, v) for o, (k, v, _) in sorted(self.records.items())]
        assert got == want
        assert self.log.log_start_offset == self.start


CompactionModel.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# 30 stateful examples of up to 40 steps, each checked against the model: a long property search
TestCompactionModel = pytest.mark.slow(CompactionModel.TestCase)


def test_model_day_scale_tombstones(tmp_path: Path) -> None:
    """The same model rules at realistic scales: tombstones survive exactly delete.retention.ms."""
    lg = open_log(tmp_path, delete_retention_ms=DAY)
    put_many(lg, [(b"a", b"1"), (b"a", None)])
    lg.roll()
    maintain(lg, now=T0, force=True)
    put(lg, b"b", b"2")
    lg.roll()
    maintain(lg, now=T0 + DAY - 1, force=True)
    assert rows(lg) == [(1, b"a", None), (2, b"b", b"2")]
    put(lg, b"c", b"3")
    lg.roll()
    maintain(lg, now=T0 + DAY, force=True)
    assert rows(lg) == [(2, b"b", b"2"), (3, b"c", b"3")]
    assert rows(reopen(tmp_path, delete_retention_ms=DAY)) == rows(lg)


def test_filthiest_log_is_cleaned_first(backend: Backend) -> None:
    root = make_root(backend)
    maintain(root, now=T0, topics=["d"])  # d: clean head
    fill(root, "d", prefix=b"w")  # ... then as much dirty data again
    points = ckpt.read_offsets(root.storage, ckpt.CLEANER_OFFSET)
    assert points == {("d", 0): 60}
    ratios = {t: log_to_clean(root.log(t, 0), points.get((t, 0)), T0).cleanable_ratio for t in "cd"}
    assert ratios["c"] == 1.0 > ratios["d"] > 0.5
    report = maintain(root, now=T0, topics=["c", "d"])
    assert [c.directory for c in report.cleaning] == ["c-0", "d-0"]
    root.close()
