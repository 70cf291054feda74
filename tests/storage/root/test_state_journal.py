"""The root's state on local disk: an append writes one journal line, whatever the partition
count; the journal's crash rules (a line cut short, records of a fold a crash interrupted,
damage); checkpoint files parsed and written in whole-column passes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pylog
from pylog.storage.errors import CorruptMetadataError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root import state


def build(path: Path, partitions: int) -> None:
    with pylog.open(path) as root:
        root.create_topic("t", partitions=partitions)
        root.append("t", [b"first"], partition=partitions - 1)


def crash(root: pylog.Root) -> None:
    """Stop like a killed writer: the logs closed without a checkpoint, a fold or the
    clean-shutdown marker (what close does after a failed write)."""
    root._failed = RuntimeError("killed")
    root.close()


def stat(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def journal_size(path: Path) -> int:
    j = path / state.JOURNAL_FILE
    return j.stat().st_size if j.exists() else 0


def test_an_append_writes_and_parses_the_same_whatever_the_partition_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a root of 1,000 partitions and appending to one of them rewrites no root-wide
    file (one journal line is appended) and parses no per-partition data of the others (the
    files this process wrote at the last close are known): as for a root of 3 partitions."""
    parsed: list[str] = []
    real_snapshot, real_offsets = state._parse_snapshot, ckpt.parse_offsets

    def count_snapshot(data: bytes, path: str) -> tuple[state.PublishState, str | None]:
        parsed.append(path)
        return real_snapshot(data, path)

    def count_offsets(data: bytes, *, path: str | None = None) -> dict[tuple[str, int], int]:
        parsed.append(str(path))
        return real_offsets(data, path=path)

    monkeypatch.setattr(state, "_parse_snapshot", count_snapshot)
    monkeypatch.setattr(ckpt, "parse_offsets", count_offsets)
    grown = {}
    for n in (3, 1000):
        path = tmp_path / str(n)
        build(path, n)
        files = [state.STATE_FILE, ckpt.RECOVERY_POINT, ckpt.LOG_START_OFFSET]
        before = {f: stat(path / f) for f in files}
        size = journal_size(path)
        parsed.clear()
        root = pylog.open(path)
        assert root.append("t", [b"second"], partition=n - 1)[n - 1].first_offset == 1
        assert {f: stat(path / f) for f in files} == before  # not rewritten
        assert parsed == []
        grown[n] = journal_size(path) - size
        with pylog.open(path, read_only=True) as reader:  # the journal line is the commit
            assert reader.high_watermark("t", n - 1) == 2
            assert reader.read_table("t", partitions=[n - 1])["value"].to_pylist() == [b"first", b"second"]
        root.close()
        assert journal_size(path) == 0  # folded by the clean close
        with pylog.open(path, read_only=True) as reader:
            assert reader.high_watermark("t", n - 1) == 2 and reader.high_watermark("t", 0) == 0
    assert 0 < grown[3] < 100 and grown[1000] - grown[3] == len("999") - len("2")


def test_many_appends_fold_the_journal_and_lose_nothing(tmp_path: Path) -> None:
    with pylog.open(tmp_path) as root:
        root.create_topic("t", partitions=4)
        for i in range(400):  # ~60 bytes a line: folded at least once on the way
            root.append("t", [b"%d" % i], partition=i % 4)
            assert journal_size(tmp_path) <= state.JOURNAL_MIN_BYTES + 200
        with pylog.open(tmp_path, read_only=True) as reader:
            assert [reader.high_watermark("t", p) for p in range(4)] == [100] * 4
    with pylog.open(tmp_path, read_only=True) as reader:
        assert reader.read_table("t").num_rows == 400


def test_a_last_line_cut_short_is_not_a_record(tmp_path: Path) -> None:
    """A crash while appending a line: the state is the one before it, and the next writer
    replaces the state file (it never appends after the cut line)."""
    build(tmp_path, 2)
    root = pylog.open(tmp_path)
    root.append("t", [b"a"], partition=0)
    root.append("t", [b"b"], partition=0)
    j = tmp_path / state.JOURNAL_FILE
    data = j.read_bytes()
    crash(root)
    j.write_bytes(data[:-5])
    with pylog.open(tmp_path, read_only=True) as reader:
        assert reader.high_watermark("t", 0) == 1  # the second append was not acknowledged
    with pylog.open(tmp_path) as root:
        assert root.append("t", [b"c"], partition=0)[0].first_offset == 1  # "b" truncated
        with pylog.open(tmp_path, read_only=True) as reader:
            assert reader.read_table("t", partitions=[0])["value"].to_pylist() == [b"a", b"c"]


def test_records_of_an_interrupted_fold_are_not_read(tmp_path: Path) -> None:
    """A crash after a fold replaced the state file and before it emptied the journal: the
    journal's records (of the old journal id) are already in the state file."""
    build(tmp_path, 2)
    root = pylog.open(tmp_path)
    root.append("t", [b"a"], partition=0)
    old = (tmp_path / state.JOURNAL_FILE).read_bytes()
    root.close()
    (tmp_path / state.JOURNAL_FILE).write_bytes(old)
    with pylog.open(tmp_path) as root:
        assert root.high_watermark("t", 0) == 1
        root.append("t", [b"b"], partition=1)
        with pylog.open(tmp_path, read_only=True) as reader:
            assert [reader.high_watermark("t", p) for p in range(2)] == [1, 2]


def test_a_damaged_journal_line_names_the_file(tmp_path: Path) -> None:
    build(tmp_path, 2)
    root = pylog.open(tmp_path)
    root.append("t", [b"a"], partition=0)
    root.append("t", [b"b"], partition=1)
    crash(root)
    j = tmp_path / state.JOURNAL_FILE
    j.write_bytes(b"{not json\n" + j.read_bytes())
    with pytest.raises(CorruptMetadataError, match=r"pylog-state\.journal: line 1"):
        pylog.open(tmp_path, read_only=True)


def test_checkpoint_files_round_trip_in_column_passes() -> None:
    entries = {(f"topic-{p % 3}", p): p * 7 - 1 for p in range(5000)}
    data = ckpt.format_offsets(entries)
    lines = data.decode().splitlines()
    assert lines[:3] == ["0", "5000", "topic-0 0 -1"]
    assert ckpt.parse_offsets(data) == entries
    with pytest.raises(pylog.PylogError, match="topic name"):
        ckpt.format_offsets({**entries, ("bad topic", 1): 1})
    with pytest.raises(pylog.PylogError, match=r"must be an integer in \[0"):
        ckpt.format_offsets({**entries, ("t", -1): 1})
