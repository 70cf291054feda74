"""Damaged partitions are refused, reported and repaired explicitly.

* A writer never appends to a partition whose files contradict each other or its acknowledged
  end: log end below the high watermark (segment files removed from outside), overlapping
  segments, a segment whose first batch does not match its file name.  It raises
  :class:`DamagedLogError` naming the partition and the files, pointing at ``pylog recover``;
  readers raise it for the offsets concerned instead of returning fewer rows.
* ``pylog recover`` (``Root.recover``) repairs what it can without loss (a misnamed segment is
  renamed), states what would be lost otherwise, and loses it only with ``--accept-data-loss``.
* ``pylog verify`` fails on every kind of damage: missing segments, gaps compaction cannot have
  left, log start beyond the end, damaged tails, truncated middle segments, end below the high
  watermark.
* Partitions per topic are bounded (1..1048576), checked before anything is written.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.cli import main
from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import ConfigError, CorruptMetadataError, DamagedLogError
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root.metadata import MAX_PARTITIONS
from pylog.tools.inspect import verify

T0 = 1_700_000_000_000
TOPIC_DIR = "t-0"


def name(base: int, ext: str = "log") -> str:
    return f"{base:020d}.{ext}"


def four_segments(path: Path, config: dict[str, str] | None = None) -> Path:
    """Topic ``t``, one partition: segments at 0, 25, 50 and 75 (the active one) of 25 records
    each, in batches of 5; high watermark 100; closed cleanly.  Returns the partition directory."""
    with pylog.open(path) as root:
        root.create_topic("t", 1, {"index.interval.bytes": "0", **(config or {})})
        for s in range(4):
            if s:
                root.writable_log("t", 0).roll()
            for b in range(5):
                first = 25 * s + 5 * b
                root.append(
                    "t",
                    [b"v%03d" % o for o in range(first, first + 5)],
                    key=[b"k%03d" % o for o in range(first, first + 5)],
                    timestamp=[T0 + first] * 5,
                    partition=0,
                )
    d = path / TOPIC_DIR
    assert sorted(p.name for p in d.glob("*.log")) == [name(b) for b in (0, 25, 50, 75)]
    return d


def expected(lo: int = 0, hi: int = 100) -> list[bytes]:
    return [b"v%03d" % o for o in range(lo, hi)]


def rename_segment(d: Path, old: int, new: int) -> None:
    for ext in ("log", "index", "timeindex"):
        src = d / name(old, ext)
        if src.exists():
            src.rename(d / name(new, ext))


def remove_segment(d: Path, base: int) -> None:
    for f in d.glob(f"{base:020d}.*"):
        f.unlink()


def values(path: Path, **kwargs: Any) -> list[bytes]:
    with pylog.open(path, read_only=True) as reader:
        return reader.read_table("t", **kwargs)["value"].to_pylist()


def high_watermark(path: Path) -> int:
    return json.loads((path / "pylog-state.json").read_text())["high_watermarks"]["t"]["0"]


# ============================================================================ row 4: the writer refuses


def test_newest_segment_removed_the_writer_refuses_and_recover_states_the_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newest segment's files removed from outside: the reopened writer refuses log end 75 <
    high watermark 100 instead of giving offset 75 a second value."""
    d = four_segments(tmp_path)
    remove_segment(d, 75)

    writer = pylog.open(tmp_path)
    with pytest.raises(DamagedLogError) as info:
        writer.append("t", [b"second value"], partition=0)
    message = str(info.value)
    for part in (TOPIC_DIR, "high watermark 100", "75", "pylog recover", "pylog-state.json"):
        assert part in message, message
    writer.close()

    # readers: the undamaged range reads, the damaged one is an error, never fewer rows
    assert values(tmp_path, end_offset=75) == expected(0, 75)
    with pytest.raises(DamagedLogError, match="high watermark 100"):
        values(tmp_path)
    with pytest.raises(DamagedLogError):
        values(tmp_path, start_offset=80)

    # recover states what would be lost and does nothing without the flag
    before = sorted(p.name for p in d.iterdir())
    assert main(["recover", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "offsets 75..99" in out.out and "--accept-data-loss" in out.out + out.err
    assert sorted(p.name for p in d.iterdir()) == before and high_watermark(tmp_path) == 100
    assert main(["recover", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (damaged,) = report["damaged"]
    assert damaged["partition"] == 0 and damaged["applied"] is False and damaged["lost_offsets"] == 25

    assert main(["recover", str(tmp_path), "--accept-data-loss", "--json"]) == 0
    (damaged,) = json.loads(capsys.readouterr().out)["damaged"]
    assert damaged["applied"] is True and damaged["high_watermark"] == [100, 75]
    assert high_watermark(tmp_path) == 75
    with pylog.open(tmp_path) as root:  # writable again
        assert root.append("t", [b"after"], partition=0)[0].first_offset == 75
    assert values(tmp_path) == [*expected(0, 75), b"after"]
    assert main(["verify", str(tmp_path)]) == 0


def test_segment_renamed_to_a_higher_base_is_refused_then_renamed_back_without_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A segment renamed to a wrong base (00..50 -> 00..80, which makes it the newest file): the
    writer neither appends at offset 75 (a second value for it) nor lets recovery empty it."""
    d = four_segments(tmp_path)
    rename_segment(d, 50, 80)
    writer = pylog.open(tmp_path)
    with pytest.raises(DamagedLogError) as info:
        writer.append("t", [b"x"], partition=0)
    message = str(info.value)
    assert name(80) in message and "offset 50" in message and "pylog recover" in message, message
    writer.close()
    assert (d / name(80)).stat().st_size > 0  # nothing was truncated
    with pytest.raises(DamagedLogError, match=name(80)):
        values(tmp_path, start_offset=50, end_offset=75)

    assert main(["verify", str(tmp_path)]) == 1
    capsys.readouterr()
    assert main(["recover", str(tmp_path)]) == 0  # a rename loses nothing: no flag needed
    out = capsys.readouterr().out
    assert f"rename {TOPIC_DIR}/{name(80)} to {TOPIC_DIR}/{name(50)}" in out, out
    assert values(tmp_path) == expected()
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"next"], partition=0)[0].first_offset == 100
    assert main(["verify", str(tmp_path)]) == 0


def test_segment_renamed_to_a_lower_base_overlaps_its_predecessor(tmp_path: Path) -> None:
    """00..75 renamed 00..60: it overlaps 00..50 (offsets 50..74); reads of 60..74 raise
    instead of returning nothing."""
    d = four_segments(tmp_path)
    rename_segment(d, 75, 60)
    with pytest.raises(DamagedLogError, match="overlap"):
        pylog.open(tmp_path).append("t", [b"x"], partition=0)
    for lo, hi in ((60, 75), (55, 65)):
        with pytest.raises(DamagedLogError, match=name(60)):
            values(tmp_path, start_offset=lo, end_offset=hi)
    assert values(tmp_path, start_offset=80) == expected(80)  # offsets the damage does not touch
    with pylog.open(tmp_path) as root:
        (repair,) = root.recover()
    assert repair.applied and not repair.lost
    assert repair.renames == [(f"{TOPIC_DIR}/{name(60)}", f"{TOPIC_DIR}/{name(75)}")]
    assert values(tmp_path) == expected()


def test_duplicate_segment_is_removed_only_when_the_loss_is_accepted(tmp_path: Path) -> None:
    """A copy of 00..50 as 00..90: two values for offsets 50..74.  Removing the copy loses its
    records, so the API reports the plan and applies it only with accept_data_loss."""
    d = four_segments(tmp_path)
    for ext in ("log", "index", "timeindex"):
        shutil.copy(d / name(50, ext), d / name(90, ext))
    with pytest.raises(DamagedLogError):
        pylog.open(tmp_path).append("t", [b"x"], partition=0)
    root = pylog.open(tmp_path)
    (plan,) = root.recover()
    assert not plan.applied and plan.removals == [f"{TOPIC_DIR}/{name(90)}"]
    assert any("offsets 50..74" in lost for lost in plan.lost), plan.lost
    assert (d / name(90)).exists()
    (done,) = root.recover(accept_data_loss=True)
    assert done.applied and not (d / name(90)).exists()
    root.append("t", [b"next"], partition=0)
    root.close()
    assert values(tmp_path) == [*expected(), b"next"]


def test_log_start_checkpoint_beyond_the_end_does_not_empty_the_log(tmp_path: Path) -> None:
    """A log-start checkpoint beyond the acknowledged end: the writer's load refuses it instead
    of emptying the log (all 100 acknowledged records), readers raise instead of returning
    nothing, and recovery repairs it without loss."""
    four_segments(tmp_path)
    (tmp_path / "log-start-offset-checkpoint").write_text("0\n1\nt 0 500\n")
    with pytest.raises(DamagedLogError, match="log-start-offset-checkpoint"):
        pylog.open(tmp_path).append("t", [b"x"], partition=0)
    with pytest.raises(DamagedLogError, match="500"):
        values(tmp_path)
    assert main(["verify", str(tmp_path)]) == 1
    with pylog.open(tmp_path) as root:
        (repair,) = root.recover()
        assert repair.applied and not repair.lost
    assert values(tmp_path) == expected()


def test_healthy_root_needs_no_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    four_segments(tmp_path)
    assert main(["recover", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["damaged"] == []
    with pylog.open(tmp_path) as root:
        assert root.recover(accept_data_loss=True) == []
    assert values(tmp_path) == expected()


# ============================================================================ row 6: verify fails


def _truncate_middle(d: Path) -> None:
    seg = d / name(25)
    with pylog.open(d.parent, read_only=True) as r:
        lg = r.log("t", 0)
        (segment,) = [s for s in lg.segments if s.base_offset == 25]
        cut = int(next(segment.iter_batches(0)).headers.position[2])  # keep 2 of 5 batches
    with open(seg, "r+b") as f:
        f.truncate(cut)


def _missing_middle(d: Path) -> None:
    remove_segment(d, 25)


def _log_start_beyond_end(d: Path) -> None:
    (d.parent / "log-start-offset-checkpoint").write_text("0\n1\nt 0 500\n")


def _zeros_after_tail(d: Path) -> None:
    with open(d / name(75), "ab") as f:
        f.write(bytes(100))


def _newest_removed(d: Path) -> None:
    remove_segment(d, 75)


def _renamed(d: Path) -> None:
    rename_segment(d, 50, 80)


DAMAGE = {
    "truncated-middle-log": (_truncate_middle, "missing", "offsets 35..49"),
    "missing-middle-segment": (_missing_middle, "missing", "offsets 25..49"),
    "log-start-beyond-end": (_log_start_beyond_end, "log-start", "500"),
    "zeros-after-tail": (_zeros_after_tail, "tail", "100"),
    "newest-segment-removed": (_newest_removed, "below-high-watermark", "high watermark 100"),
    "segment-renamed": (_renamed, "misnamed", name(80)),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_fails_on_every_damage(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pylog verify`` fails, naming the damage (not only an index mismatch), on a truncated
    middle ``.log``, a missing middle segment and a log start beyond the end."""
    d = four_segments(tmp_path)
    assert main(["verify", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    fn, kind, text = DAMAGE[damage]
    fn(d)
    assert main(["verify", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    hits = [p for p in out["problems"] if p["kind"] == kind and text in p["file"] + p["message"]]
    assert hits, out["problems"]
    assert all(p["file"].startswith(TOPIC_DIR) or "checkpoint" in p["file"] for p in hits)
    assert main(["verify", str(tmp_path)]) == 1
    assert text in capsys.readouterr().out


def test_verify_accepts_the_gaps_compaction_leaves(tmp_path: Path) -> None:
    """Compaction removes batches inside segments and empties whole segments, keeping their
    base offsets: those gaps are not damage."""
    with pylog.open(tmp_path) as root:
        root.create_topic(
            "c", 1, {"cleanup.policy": "compact", "segment.bytes": "600", "min.cleanable.dirty.ratio": "0.01"}
        )
        for i in range(200):
            root.append("c", [b"v%d" % i], key=[b"k%d" % (i % 7)], partition=0, timestamp=[T0 + i])
        report = maintain(root, now=T0 + 10_000, force=True)
        assert report.cleaning, report
        lg = root.log("c", 0)
        kept = root.read_table("c")["offset"].to_pylist()
        assert len(kept) < 100 and kept[-1] == 199  # gaps everywhere below the active segment
        assert len(lg.segments) > 1
    problems, _ = verify(pylog.open(tmp_path, read_only=True))
    assert problems == []
    # the same gap in a topic that never was compacted is damage
    four_segments(tmp_path / "plain")
    _missing_middle(tmp_path / "plain" / TOPIC_DIR)
    problems, _ = verify(pylog.open(tmp_path / "plain", read_only=True))
    assert [p.kind for p in problems] == ["missing"]


def test_missing_middle_segment_in_a_compacted_topic_above_the_cleaned_range(tmp_path: Path) -> None:
    """In a compacted topic, a gap inside the active segment (never cleaned) is damage too."""
    d = four_segments(tmp_path, {"cleanup.policy": "compact"})
    assert verify(pylog.open(tmp_path, read_only=True))[0] == []
    _missing_middle(d)
    assert verify(pylog.open(tmp_path, read_only=True))[0] == []  # compaction could have done it
    active = d / name(75)
    data = active.read_bytes()
    with pylog.open(tmp_path, read_only=True) as r:
        pos = next(r.log("t", 0).segments[-1].iter_batches(0)).headers.position.tolist()
    active.write_bytes(data[: pos[2]] + data[pos[3] :])  # the batch of offsets 85..89 cut out
    problems = [p for p in verify(pylog.open(tmp_path, read_only=True))[0] if p.kind != "index"]
    assert [(p.kind, "offsets 85..89" in p.message) for p in problems] == [("missing", True)], problems


# ============================================================================ row 7: partition limits


def count_makedirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Directories created from now on (more than 5 stop the test: the unfixed code would make
    10**12 of them)."""
    made: list[str] = []

    def makedirs(self: Any, path: str) -> None:
        made.append(path)
        if len(made) > 5:
            raise RuntimeError(f"{len(made)} directories created")

    monkeypatch.setattr(LocalStorage, "makedirs", makedirs)
    return made


def test_partition_count_is_bounded_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_topic(partitions=10**12)`` is refused before it creates a directory (it would
    create them for hours), and no metadata claims 10^12 partitions."""
    assert MAX_PARTITIONS == 1 << 20
    root = pylog.open(tmp_path / "r")
    made = count_makedirs(monkeypatch)
    for n in (10**12, MAX_PARTITIONS + 1):
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=r"partitions must be .*1048576"):
            root.create_topic("big", partitions=n)
        assert time.monotonic() - t0 < 1 and made == []
    assert root.topics() == [] and not (tmp_path / "r" / "pylog-topics.json").exists()
    monkeypatch.undo()
    root.create_topic("small", partitions=2)
    with pytest.raises(ConfigError, match="1048576"):
        root.add_partitions("small", MAX_PARTITIONS - 1)
    assert root.partitions("small") == 2
    root.close()


def test_cli_create_topic_refuses_too_many_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made = count_makedirs(monkeypatch)
    assert main(["create-topic", str(tmp_path / "r"), "big", "--partitions", "1000000000000"]) == 2
    assert "1048576" in capsys.readouterr().err
    assert made == [] and not (tmp_path / "r" / "pylog-topics.json").exists()


def test_metadata_claiming_too_many_partitions_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``pylog-topics.json`` claiming 10**12 partitions: opening the root and ``describe``
    refuse it at once, naming the file."""
    with pylog.open(tmp_path) as root:
        root.create_topic("t", 1)
    doc = json.loads((tmp_path / "pylog-topics.json").read_text())
    doc["topics"]["t"]["partitions"] = 10**12
    (tmp_path / "pylog-topics.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptMetadataError, match=r"pylog-topics\.json.*1048576"):
        pylog.open(tmp_path, read_only=True)
    t0 = time.monotonic()
    assert main(["describe", str(tmp_path)]) == 1
    assert "pylog-topics.json" in capsys.readouterr().err
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("policy", ["compact", "delete"])
def test_sealed_segment_cut_mid_batch_is_never_read_past_silently(tmp_path: Path, policy: str) -> None:
    """A sealed segment whose last batch was cut short mid-batch: a read that reaches the cut
    raises ``DamagedLogError`` naming the file and byte, whatever ``cleanup.policy`` says
    (compaction leaves gaps of offsets, never torn batches), after the records before it."""
    d = four_segments(tmp_path, {"cleanup.policy": policy})
    seg = d / name(25)
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 10)  # the last batch (offsets 45..49) loses its end
    with pytest.raises(DamagedLogError, match=rf"{name(25)}.*not a complete batch"):
        values(tmp_path)
    with pylog.open(tmp_path, read_only=True) as reader:
        before = reader.read_table("t", end_offset=45)["value"].to_pylist()
        assert before == expected(0, 45)
        assert reader.read_table("t", start_offset=50)["value"].to_pylist() == expected(50, 100)


def test_compacted_topic_reads_across_the_gaps_compaction_left(tmp_path: Path) -> None:
    """The gaps compaction leaves between segments (whole batches removed) are read across
    without a damage error: one record per key survives, the newest."""
    with pylog.open(tmp_path) as root:
        root.create_topic(
            "c", 1, {"cleanup.policy": "compact", "segment.bytes": "600", "min.cleanable.dirty.ratio": "0.01"}
        )
        for i in range(200):
            root.append("c", [b"v%03d" % i], key=[b"k%d" % (i % 7)], partition=0)
        maintain(root, now=int(time.time() * 1000), force=True)
    with pylog.open(tmp_path, read_only=True) as reader:
        t = reader.read_table("c")
    latest = {b"k%d" % (i % 7): b"v%03d" % i for i in range(200)}
    got = dict(zip(t["key"].to_pylist(), t["value"].to_pylist(), strict=True))
    assert got == latest
