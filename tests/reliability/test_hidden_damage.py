"""Damage below the active segment, which a writer's recovery after a clean shutdown does not
scan: a segment cut short, a batch whose CRC fails in one.

* A read that crosses acknowledged offsets no segment holds, in a topic whose offsets are dense
  (never compacted), raises :class:`DamagedLogError` naming the file instead of skipping them;
  the writer refuses such a partition (found from each segment's end, as overlaps are).
* ``pylog recover`` checks every batch: it reports a bad CRC it finds, exits 1, and only with
  ``--accept-data-loss`` ends the log there (Kafka's recovery semantics).
* ``pylog consume`` prints the records that precede a bad batch, then fails naming the file and
  the byte.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import pylog
from pylog.cli import main
from pylog.storage.errors import CorruptRecordError, DamagedLogError
from pylog.storage.maintenance.runner import maintain
from tests.reliability.test_damaged_logs import (
    T0,
    TOPIC_DIR,
    expected,
    four_segments,
    high_watermark,
    name,
    remove_segment,
    values,
)


def batch_positions(path: Path, base: int) -> list[int]:
    with pylog.open(path, read_only=True) as r:
        (seg,) = [s for s in r.log("t", 0).segments if s.base_offset == base]
        return [int(p) for loc in seg.iter_batches(0) for p in loc.headers.position]


def _cut_mid_batch(d: Path) -> None:
    """The issue's case: 00..50 loses the last 10 bytes of its last batch (offsets 70..74);
    its index still points at that batch's header, which is whole: the writer's load passes."""
    seg = d / name(50)
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 10)


def _cut_at_batch(d: Path) -> None:
    """00..50 cut at a batch boundary: 3 of its 5 batches left (offsets 65..74 gone)."""
    cut = batch_positions(d.parent, 50)[3]
    with open(d / name(50), "r+b") as f:
        f.truncate(cut)


def _removed(d: Path) -> None:
    remove_segment(d, 50)


CUTS: dict[str, tuple[Callable[[Path], None], int]] = {
    "cut-mid-batch": (_cut_mid_batch, 70),  # the first offset no segment holds
    "cut-at-batch": (_cut_at_batch, 65),
    "segment-removed": (_removed, 50),
}


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_offsets_no_segment_holds_are_damage_in_a_delete_policy_topic(
    cut: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a clean shutdown, a segment below the active one cut short (or removed): reads
    across the hole raise, the writer refuses the partition instead of appending, and
    ``pylog verify`` reports it."""
    d = four_segments(tmp_path)
    fn, hole = CUTS[cut]
    fn(d)
    culprit = name(25) if cut == "segment-removed" else name(50)

    # readers: an error naming the file for any read across the hole, never fewer rows
    for kwargs in ({}, {"start_offset": hole - 2}, {"start_offset": hole, "end_offset": hole + 1}):
        with pytest.raises(DamagedLogError, match=f"{culprit}.*offsets {hole}..74 are held by no segment"):
            values(tmp_path, **kwargs)
    assert values(tmp_path, end_offset=hole) == expected(0, hole)  # what the damage does not touch
    assert values(tmp_path, start_offset=75) == expected(75)
    with pylog.open(tmp_path, read_only=True) as r, pytest.raises(DamagedLogError, match=culprit):
        r.log("t", 0).read(hole)  # a raw fetch (pylog serve's) too

    # the writer refuses it, and changes no .log (its load may rebuild an index pointing beyond one)
    files = {p.name: p.stat().st_size for p in d.glob("*.log")}
    writer = pylog.open(tmp_path)
    with pytest.raises(DamagedLogError, match=f"{culprit}.*held by no segment") as info:
        writer.append("t", [b"x"], partition=0)
    assert "pylog recover" in str(info.value)
    writer.close()
    assert {p.name: p.stat().st_size for p in d.glob("*.log")} == files

    # recover states the loss, and ends the log at the hole only when it is accepted
    assert main(["recover", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "held by no segment" in out.out and f"remove {TOPIC_DIR}/{name(75)}" in out.out, out.out
    assert "--accept-data-loss" in out.err
    assert {p.name: p.stat().st_size for p in d.glob("*.log")} == files and high_watermark(tmp_path) == 100
    assert main(["recover", str(tmp_path), "--accept-data-loss"]) == 0
    capsys.readouterr()
    assert high_watermark(tmp_path) == hole
    assert values(tmp_path) == expected(0, hole)
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"after"], partition=0)[0].first_offset == hole
    assert values(tmp_path) == [*expected(0, hole), b"after"]
    assert main(["verify", str(tmp_path)]) == 0


def test_offsets_no_segment_holds_above_the_high_watermark_are_not_damage(tmp_path: Path) -> None:
    """What a power cut leaves: the unflushed tail of a rolled segment lost, the next segment
    there, neither acknowledged (high watermark 70).  Readers stop at 70 without an error (also
    a raw fetch at the end), and the writer truncates what lies past 70, as before."""
    d = four_segments(tmp_path)
    _cut_mid_batch(d)
    state = json.loads((tmp_path / "pylog-state.json").read_text())
    state["high_watermarks"]["t"]["0"] = 70
    (tmp_path / "pylog-state.json").write_text(json.dumps(state))
    assert values(tmp_path) == expected(0, 70)
    with pylog.open(tmp_path, read_only=True) as r:
        lg = r.log("t", 0)
        assert lg.log_end_offset == 70 and lg.read_table(68)["offset"].to_pylist() == [68, 69]
        lg.read(70)  # no error at the end of acknowledged data
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"after"], partition=0)[0].first_offset == 70
    assert values(tmp_path) == [*expected(0, 70), b"after"]


def test_the_gaps_compaction_leaves_are_read_and_written_as_before(tmp_path: Path) -> None:
    """Offsets no segment holds are what compaction leaves: no error in a compacted topic, nor
    after its policy became ``delete`` (its cleaner checkpoint says it was compacted)."""
    with pylog.open(tmp_path) as root:
        root.create_topic(
            "c", 1, {"cleanup.policy": "compact", "segment.bytes": "600", "min.cleanable.dirty.ratio": "0.01"}
        )
        for i in range(200):  # every other record under one key: compaction keeps only its last
            key = b"k" if i % 2 else b"u%d" % i
            root.append("c", [b"v%d" % i], key=[key], partition=0, timestamp=[T0 + i])
        assert maintain(root, now=T0 + 10_000, force=True).cleaning
        lg = root.log("c", 0)
        ends = [(s.read_next_offset(), n.base_offset) for s, n in itertools.pairwise(lg.segments)]
        assert any(end < base for end, base in ends), ends  # gaps between segments
        kept = root.read_table("c")["offset"].to_pylist()
    with pylog.open(tmp_path) as root:
        root.alter_config("c", {"cleanup.policy": "delete"})
    for _ in range(2):  # reads, then a writer's open and append
        with pylog.open(tmp_path, read_only=True) as r:
            assert r.read_table("c")["offset"].to_pylist()[: len(kept)] == kept
            lg = r.log("c", 0)
            assert all(lg.read(o)[1] for o in range(kept[-1]))  # raw fetches across the gaps
        with pylog.open(tmp_path) as root:
            root.append("c", [b"more"], key=[b"k"], partition=0)


def test_recover_reports_a_bad_crc_and_truncates_only_when_the_loss_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch of 00..25 (offsets 35..39) fails its CRC: ``pylog recover`` reports it and exits
    1 (as ``pylog verify`` does), and ends the log there only with ``--accept-data-loss``."""
    d = four_segments(tmp_path)
    bad = batch_positions(tmp_path, 25)[2]
    data = bytearray((d / name(25)).read_bytes())
    data[bad + 70] ^= 0xFF  # a byte of its records
    (d / name(25)).write_bytes(bytes(data))
    files = {p.name: p.stat().st_size for p in d.iterdir()}

    assert main(["recover", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert f"{TOPIC_DIR}/{name(25)}: the batch at byte {bad} is invalid" in out.out, out.out
    assert "nothing lost" not in out.out and "--accept-data-loss" in out.err
    assert f"would: truncate {TOPIC_DIR}/{name(25)} to {bad} bytes" in out.out, out.out
    assert {p.name: p.stat().st_size for p in d.iterdir()} == files  # nothing changed
    assert main(["recover", str(tmp_path), "--json"]) == 1
    (damaged,) = json.loads(capsys.readouterr().out)["damaged"]
    assert damaged["applied"] is False and damaged["cut"] == [f"{TOPIC_DIR}/{name(25)}", bad]
    assert main(["verify", str(tmp_path)]) == 1

    assert main(["recover", str(tmp_path), "--accept-data-loss"]) == 0
    out = capsys.readouterr()
    assert "repaired: truncate" in out.out and "lost data" in out.out, out.out
    assert values(tmp_path) == expected(0, 35) and high_watermark(tmp_path) == 35
    assert main(["verify", str(tmp_path)]) == 0
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"after"], partition=0)[0].first_offset == 35
        assert root.recover() == []  # healthy now
    assert main(["recover", str(tmp_path)]) == 0
    assert "nothing lost" in capsys.readouterr().out


def test_consume_prints_what_precedes_a_bad_batch_then_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2,000 records in batches of 50, the batch of offsets 1,650..1,699 fails its CRC:
    ``pylog consume`` prints the 1,650 records before the bad batch (read in the same chunk),
    then the error."""
    with pylog.open(tmp_path) as root:
        root.create_topic("t", 1)
        for i in range(40):
            root.append("t", [b"v%05d" % (50 * i + j) for j in range(50)], partition=0)
    bad = batch_positions(tmp_path, 0)[33]
    seg = tmp_path / TOPIC_DIR / name(0)
    data = bytearray(seg.read_bytes())
    data[bad + 70] ^= 0xFF
    seg.write_bytes(bytes(data))

    assert main(["consume", str(tmp_path), "t", "--format", "value"]) == 1
    out = capsys.readouterr()
    assert out.out.split() == [f"v{o:05d}" for o in range(1650)]
    assert "consumed 1650 records" in out.err
    assert f"{TOPIC_DIR}/{name(0)}: byte {bad}: batch at offset 1650" in out.err, out.err
    # the API streams the same way: the rows before the bad batch, then the error
    rows: list[bytes] = []
    with pylog.open(tmp_path, read_only=True) as r, pytest.raises(CorruptRecordError, match=f"byte {bad}"):
        for batch in r.read_batches("t"):
            rows += batch.column("value").to_pylist()
    assert len(rows) == 1650
