"""A cleaning pass beside the writer of a local root (storage/maintenance/detached.py): the
writer lock is held only for the swap, appends made meanwhile stay, and a pass whose segments
changed while it read is discarded and run again."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pylog.storage.errors import StorageIOError
from pylog.storage.maintenance import detached
from pylog.storage.maintenance.detached import STAGE_MARK, clean_detached
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root.opening import open_root
from tests.storage.compaction_util import rows

NOW = 1_700_000_000_000
KEYS = 10
PAD = b"." * 300


def _root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    with open_root(path) as root:
        root.create_topic(
            "c",
            1,
            {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"},
        )
        for i in range(60):
            key = b"k%d" % (i % KEYS)
            root.append("c", pa.table({"key": [key], "value": [b"v%d-" % i + PAD]}), partition=0)
    return path


def _opener(path: Path, lock_timeout: float = 0.0) -> detached.RootOpener:
    return lambda read_only: open_root(path, read_only=read_only, lock_timeout=lock_timeout)


def _rows(path: Path) -> list[tuple[int, bytes, bytes]]:
    with open_root(path, read_only=True) as r:
        return [(o, k, v) for o, k, v in rows(r.log("c", 0)) if k is not None and v is not None]


def _check_cleaned(history: list[tuple[int, bytes, bytes]], after: list[tuple[int, bytes, bytes]]) -> None:
    """``after`` is a compaction of everything ``history`` (rows as read at different times,
    overlapping) ever held: values at their offsets, the latest of every key."""
    by_offset = {o: (k, v) for o, k, v in history}
    for o, k, v in after:  # offsets and values never change
        assert by_offset[o] == (k, v)
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(set(offsets))
    latest = {k: v for _, (k, v) in sorted(by_offset.items())}
    kept = {k: v for _, k, v in after}
    assert kept == latest


def _hook_before_swap(monkeypatch: pytest.MonkeyPatch, action: Any, times: int = 1) -> list[int]:
    """Run ``action()`` between a pass's reading and its swap (the first ``times`` passes)."""
    real = detached._swap
    calls: list[int] = []

    def swap(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) <= times:
            action()
        real(*args, **kwargs)

    monkeypatch.setattr(detached, "_swap", swap)
    return calls


def test_appends_during_the_pass_stay_and_the_lock_is_free_while_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _root(tmp_path)
    before = _rows(path)

    def append_without_waiting() -> None:  # lock_timeout 0: fails if the pass held the lock
        with open_root(path, lock_timeout=0.0) as root:
            for i in range(20):
                root.append("c", pa.table({"key": [b"live"], "value": [b"live-%d" % i + PAD]}), partition=0)
        before.extend(_rows(path))

    _hook_before_swap(monkeypatch, append_without_waiting)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert not report.error and report.conflicts == 0
    assert report.passes and report.passes[0].records_removed > 0
    after = _rows(path)
    _check_cleaned(before, after)
    live = [v for _, k, v in after if k == b"live"]
    assert [v[: v.index(b".")] for v in live] == [b"live-%d" % i for i in range(20)]  # all, once, in order
    assert len(after) < len(before)
    assert not [n for n in os.listdir(path / "c-0") if STAGE_MARK in n]


def test_a_pass_whose_segments_were_cleaned_meanwhile_is_discarded_and_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _root(tmp_path)
    before = _rows(path)

    def writer_cleans() -> None:  # the sink's embedded compactor, say; then more appends
        with open_root(path) as root:
            assert maintain(root, now=NOW, force=True).cleaning
            for i in range(40):
                root.append(
                    "c", pa.table({"key": [b"k%d" % (i % 3)], "value": [b"w%d-" % i + PAD]}), partition=0
                )
        before.extend(_rows(path))

    calls = _hook_before_swap(monkeypatch, writer_cleans)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert report.conflicts == 1 and len(calls) == 2, report
    assert not report.error and report.passes and report.passes[0].records_removed > 0
    _check_cleaned(before, _rows(path))
    assert not [n for n in os.listdir(path / "c-0") if STAGE_MARK in n]  # the discarded pass's files


def test_retention_between_read_and_swap_is_a_conflict_not_a_resurrection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _root(tmp_path)

    def retention_deletes_the_oldest() -> None:
        with open_root(path) as root:
            root.alter_config("c", {"cleanup.policy": "compact,delete", "retention.bytes": "8000"})
            assert maintain(root, now=NOW, compaction=False).segments_deleted > 0
            root.alter_config("c", {"cleanup.policy": "compact"})

    _hook_before_swap(monkeypatch, retention_deletes_the_oldest)
    with open_root(path, read_only=True) as r:
        start_before = r.log("c", 0).log_start_offset
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert report.conflicts == 1, report
    with open_root(path, read_only=True) as r:
        lg = r.log("c", 0)
        assert lg.log_start_offset > start_before  # what retention removed did not come back
        offsets = r.read_table("c").column("offset").to_pylist()
    assert min(offsets) >= lg.log_start_offset


def test_too_many_conflicts_leave_the_log_as_it_was_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _root(tmp_path)
    n = [0]

    def writer_cleans_and_appends() -> None:  # each pass finds its segments changed, and new work
        with open_root(path) as root:
            maintain(root, now=NOW, force=True)
            for _ in range(20):
                n[0] += 1
                root.append("c", pa.table({"key": [b"k1"], "value": [b"x%d" % n[0] + PAD]}), partition=0)

    _hook_before_swap(monkeypatch, writer_cleans_and_appends, times=99)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True, attempts=2)
    assert report.conflicts == 2 and "left for the next run" in report.error
    assert not report.passes
    assert not [n for n in os.listdir(path / "c-0") if STAGE_MARK in n]


def test_staged_files_of_a_dead_pass_are_swept_when_stale_and_left_by_recovery(tmp_path: Path) -> None:
    path = _root(tmp_path)
    d = path / "c-0"
    stale = d / f"00000000000000000000.log{STAGE_MARK}dead"
    fresh = d / f"00000000000000000000.log{STAGE_MARK}live"
    stale.write_bytes(b"x" * 100)
    fresh.write_bytes(b"x" * 100)
    old = time.time() - detached.STALE_STAGE_S - 60
    os.utime(stale, (old, old))
    with open_root(path) as root:  # a writer's recovery does not touch another process's pass
        root.writable_log("c", 0)
    assert stale.exists() and fresh.exists()
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert report.stale_files_removed == 1
    assert not stale.exists() and fresh.exists()


def test_an_io_error_while_swapping_stops_with_the_file_named_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pylog.storage.backends.local import LocalStorage

    path = _root(tmp_path)
    before = _rows(path)
    real = LocalStorage.rename

    def rename(self: LocalStorage, src: str, dst: str) -> None:
        if dst.endswith(".swap"):
            raise StorageIOError.wrap(OSError(28, "No space left on device"), src, "rename it")
        real(self, src, dst)

    monkeypatch.setattr(LocalStorage, "rename", rename)
    with pytest.raises(StorageIOError, match="No space left"):
        clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    monkeypatch.undo()
    assert _rows(path) == before  # nothing lost, nothing cleaned
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)  # the fault is gone
    assert report.passes and not report.error
    _check_cleaned(before, _rows(path))


def test_a_partition_that_is_not_compacted_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "root"
    with open_root(path) as root:
        root.create_topic("c", 1, {"segment.bytes": "4096"})
        for i in range(30):
            root.append("c", pa.table({"key": [b"k"], "value": [b"v%d" % i + PAD]}), partition=0)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert not report.passes and not report.error and report.lock_held_s == 0


class Killed(BaseException):
    """The process running the pass dies here."""


def test_a_pass_killed_while_writing_leaves_the_log_as_it_was_and_its_retry_applies_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pylog.storage.maintenance import cleaner as cleaner_module
    from pylog.storage.maintenance.cleaner import Cleaner
    from pylog.tools.inspect import verify

    path = _root(tmp_path)
    before = _rows(path)
    real = Cleaner._clean_group
    groups = [0]

    def clean_group(self: Cleaner, *args: Any, **kwargs: Any) -> int:
        groups[0] += 1
        if groups[0] == 3:  # two groups staged, the third half written
            raise Killed()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Cleaner, "_clean_group", clean_group)
    monkeypatch.setattr(cleaner_module, "fits_group", lambda *_: False)  # a group per segment
    with pytest.raises(Killed):
        clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    monkeypatch.undo()
    left = [n for n in os.listdir(path / "c-0") if STAGE_MARK in n]
    assert left  # what a killed process leaves: staged files, nothing else changed
    assert _rows(path) == before
    with open_root(path) as root:  # a writer opens, appends, verifies: the leftovers are inert
        root.append("c", pa.table({"key": [b"k0"], "value": [b"after-" + PAD]}), partition=0)
        problems, _ = verify(root)
    assert not problems, problems
    history = before + _rows(path)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert report.passes and report.passes[0].records_removed > 0 and not report.error
    again = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert sum(p.records_removed for p in again.passes) == 0  # applied once
    _check_cleaned(history, _rows(path))
    assert sorted(n for n in os.listdir(path / "c-0") if STAGE_MARK in n) == sorted(left)  # until stale


def test_a_staged_segment_swept_before_the_swap_is_a_conflict_not_a_hole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _root(tmp_path)
    before = _rows(path)
    d = path / "c-0"

    def another_pass_sweeps_it() -> None:  # as for a pass older than STALE_STAGE_S
        staged = sorted(n for n in os.listdir(d) if STAGE_MARK in n and ".log" in n)
        (d / staged[0]).unlink()

    _hook_before_swap(monkeypatch, another_pass_sweeps_it)
    report = clean_detached(_opener(path), "c", 0, now=NOW, force=True)
    assert report.conflicts == 1 and report.passes, report  # the second pass did the work
    _check_cleaned(before, _rows(path))  # no offset lost


def test_pylog_compact_on_a_local_root_lets_a_writer_commit_during_its_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pylog compact`` beside a running sink: the sink's commits (here appends that do not
    wait for the lock) go on while a pass reads and rewrites; the lock is taken to swap."""
    import json

    from pylog.cli import main

    path = _root(tmp_path)
    before = _rows(path)

    def sink_commits() -> None:
        with open_root(path, lock_timeout=0.0) as root:
            root.append("c", pa.table({"key": [b"k0"], "value": [b"during-" + PAD]}), partition=0)
        before.extend(_rows(path))

    calls = _hook_before_swap(monkeypatch, sink_commits)
    assert main(["compact", str(path), "--force", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert calls and [c["directory"] for c in report["cleaning"]] == ["c-0"]
    _check_cleaned(before, _rows(path))
    assert _rows(path)[-1][2].startswith(b"during-")


def test_maintain_detached_cleans_compacted_partitions_within_its_budget(tmp_path: Path) -> None:
    from pylog.storage.maintenance.detached import maintain_detached

    path = _root(tmp_path)
    with open_root(path) as root:  # a second compacted topic and one that is not
        root.create_topic("d", 1, {"cleanup.policy": "compact", "segment.bytes": "4096"})
        root.create_topic("plain", 1, {"segment.bytes": "4096"})
        for i in range(60):
            for topic in ("d", "plain"):
                root.append(
                    topic, pa.table({"key": [b"k%d" % (i % 5)], "value": [b"v%d-" % i + PAD]}), partition=0
                )
    ticks = iter(range(100))
    spent = maintain_detached(_opener(path), now=NOW, force=True, budget_s=1.5, clock=lambda: next(ticks))
    assert spent.budget_exhausted and [c.directory for c in spent.cleaning] == [
        "c-0"
    ]  # one, then out of time
    report = maintain_detached(_opener(path), now=NOW, force=True)
    assert [c.directory for c in report.cleaning] == ["d-0"]  # c-0 is clean now; plain is not compacted
    assert not report.budget_exhausted and not report.uncleanable
    assert "d-0: cleaned" in report.summary()
