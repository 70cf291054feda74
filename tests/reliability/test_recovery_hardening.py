"""Recovery that survives I/O errors and damaged files.

* An I/O error while a writer loads or recovers a partition (a full disk, a failing one) stops
  the open with a :class:`StorageError` naming the file; nothing is truncated or deleted because
  of it, and the open succeeds once the fault is gone, with every acknowledged record.
* Every segment's indexes are sanity-checked on load: a damaged one is rebuilt by a writer (and
  reported) and ignored by a reader, which scans the ``.log`` instead: no row goes missing.
* The tail of the active segment is validated even after a clean shutdown: bytes that are not a
  valid batch are truncated (and reported) before anything is appended behind them.

The long version (a fault at every storage step of recovery, more histories) is the campaign's
fault part, :mod:`tests.reliability.faults`, run by ``python -m tests.reliability.campaign``.
"""

from __future__ import annotations

import errno
import json
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import DamagedLogError, StorageError
from pylog.storage.root.manager import Root, partition_dir
from tests.reliability.checker import Stats, open_writer, read_storage
from tests.reliability.memfs import MemStorage

T0 = 1_700_000_000_000
SEG0 = "00000000000000000000"


def values(st: Any, topic: str = "t", partition: int = 0) -> list[bytes]:
    return [r[2] for r in read_storage(st, [topic]).get((topic, partition), [])]


def acked_root(st: Any, n: int, config: dict[str, str] | None = None, *, topic: str = "t") -> Root:
    """A writer that acknowledged ``n`` appends of one record each to ``topic``-0."""
    root = Root(st)
    root.create_topic(topic, 1, {"index.interval.bytes": "0", **(config or {})})
    for i in range(n):
        root.append(topic, [b"acked-%d" % i], partition=0, timestamp=[T0 + i])
    return root


# ============================================================================ the fault model


def test_memfs_faults_behave_as_a_full_then_a_failing_disk() -> None:
    st = MemStorage()
    st.makedirs("d")
    f = st.open_append("d/a")
    f.write(b"before")
    fault = st.fail(errno.ENOSPC, after=1)  # the next write still fits
    assert f.write(b"1234") == 4
    assert f.write(b"abcdef") == 3  # the disk fills up: a short write, as write(2)
    with pytest.raises(OSError) as e:
        f.write(b"x")
    assert e.value.errno == errno.ENOSPC and e.value.filename is None  # a descriptor: no name
    with pytest.raises(OSError) as e:
        st.open_append("d/new")
    assert e.value.filename == "d/new"  # a path operation names the file
    assert st.read("d/a") == b"before1234abc"  # reading, truncating, deleting still work
    st.truncate("d/a", 6)
    assert fault.failed == ["write d/a", "write d/a", "create d/new"]
    st.clear_faults()
    st.fail(errno.EIO, ops=frozenset({"read"}), path="d/a")
    with pytest.raises(OSError, match="Input/output error"):
        st.read("d/a")
    assert st.kill().read("d/a") == b"before"  # a new process: the faults are not copied


# ============================================================================ row 1: I/O errors


@pytest.mark.parametrize(
    ("err", "ops", "path"),
    [
        (errno.ENOSPC, None, ""),  # the disk is full: every write, create, fsync fails
        (errno.EIO, frozenset({"read"}), ".log"),  # the segment cannot be read
        (errno.EIO, frozenset({"truncate", "write"}), ".index"),  # the index cannot be rebuilt
    ],
    ids=["ENOSPC", "EIO-read-log", "EIO-write-index"],
)
def test_io_error_during_recovery_fails_the_open_and_loses_nothing(
    err: int, ops: frozenset[str] | None, path: str
) -> None:
    """A writer killed after 50 acknowledged appends; the disk fails when the next writer opens
    the root.  Recovery does not take the I/O error (ENOSPC, EIO) for corruption: nothing is
    truncated, and all 50 acknowledged records are readable once the fault is gone."""
    st = MemStorage()
    acked_root(st, 50)
    expected = [b"acked-%d" % i for i in range(50)]
    disk = st.kill()  # the writer was killed: the next one recovers
    fault = disk.fail(err, ops=ops, path=path)
    with pytest.raises(StorageError) as info:
        open_writer(disk)
    assert fault.failed, "the fault was never hit"
    message = str(info.value)
    assert f"{partition_dir('t', 0)}/{SEG0}." in message, message  # names the file
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == err
    # the same process retries once the fault is gone
    disk.clear_faults()
    again = Root(disk.kill())  # (a new process: the failed one still holds the lock)
    assert values(again.storage) == expected
    again.append("t", [b"after"], partition=0)
    assert values(again.storage) == [*expected, b"after"]


def test_io_error_during_recovery_then_retry_in_the_same_root() -> None:
    """A partition whose recovery failed is recovered again by the same root's next call."""
    st = MemStorage()
    acked_root(st, 30)
    disk = st.kill()
    root = Root(disk)
    disk.fail(errno.ENOSPC)
    with pytest.raises(StorageError, match=rf"t-0/{SEG0}\.(index|timeindex|log)"):
        root.append("t", [b"x"], partition=0)
    disk.clear_faults()
    lg = root.writable_log("t", 0)
    assert lg.log_end_offset == 30
    root.append("t", [b"x"], partition=0)
    root.close()
    assert values(disk) == [*(b"acked-%d" % i for i in range(30)), b"x"]


def test_short_write_when_the_disk_fills_is_an_error_naming_the_file() -> None:
    """A write(2) that stores only part of its bytes (the disk filled up) is an error, not an
    acknowledgement of bytes that are not there; the next writer recovers the acknowledged
    prefix."""
    st = MemStorage()
    root = acked_root(st, 5)
    st.fail(errno.ENOSPC)
    with pytest.raises(OSError, match=rf"t-0/{SEG0}\.(log|index)"):
        root.append("t", [b"y" * 300], partition=0)
    st.clear_faults()
    assert values(st.kill()) == [b"acked-%d" % i for i in range(5)]


# ============================================================================ row 3: damaged indexes


def _write_index(st: Any, path: str, data: bytes) -> None:
    if isinstance(st, MemStorage):
        st.delete(path)
        f = st.open_append(path)
        f.write(data)
        f.close()
    else:
        st.write_atomic(path, data)


def _damage_random_bytes(st: Any, path: str, rng: random.Random) -> None:
    _write_index(st, path, rng.randbytes(st.size(path)))


def _damage_entry_past_the_segment(st: Any, path: str, rng: random.Random) -> None:
    data = bytearray(st.read(path))
    i = len(data) // 8 // 2 * 8  # an entry in the middle
    rel, _ = struct.unpack_from(">ii", data, i)
    struct.pack_into(">ii", data, i, rel, st.size(path.replace(".index", ".log")) + 1000)
    _write_index(st, path, bytes(data))


def _damage_entries_shifted(st: Any, path: str, rng: random.Random) -> None:
    """Positions of the next entries: ascending and within the segment, but each one batch late."""
    data = bytearray(st.read(path))
    n = len(data) // 8
    entries = [struct.unpack_from(">ii", data, 8 * k) for k in range(n)]
    for k in range(n - 1):
        struct.pack_into(">ii", data, 8 * k, entries[k][0], entries[k + 1][1])
    _write_index(st, path, bytes(data[: 8 * (n - 1)]))


DAMAGE: dict[str, Callable[[Any, str, random.Random], None]] = {
    "random-bytes": _damage_random_bytes,
    "entry-past-the-segment": _damage_entry_past_the_segment,
    "entries-shifted": _damage_entries_shifted,
}


def _hundred_rows(st: Any) -> str:
    """100 rows in one segment, indexed every batch, closed cleanly; returns the index path."""
    root = Root(st)
    root.create_topic("u", 1, {"index.interval.bytes": "0"})
    for i in range(0, 100, 4):  # 25 batches of 4 records: an index with 24 entries
        root.append("u", [b"row-%03d" % (i + j) for j in range(4)], partition=0, timestamp=[T0 + i] * 4)
    root.close()
    return f"{partition_dir('u', 0)}/{SEG0}.index"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("seed", range(3))
def test_damaged_index_is_ignored_by_readers_and_rebuilt_by_the_writer(damage: str, seed: int) -> None:
    """A random-bytes ``.index`` or one entry pointing past the segment: ``read_table`` still
    returns all 100 rows and every range of 3 its 3 (the reader scans the ``.log``, changing
    nothing), and the writer rebuilds the index and reports it in its recovery."""
    st = MemStorage()
    path = _hundred_rows(st)
    expected = [b"row-%03d" % i for i in range(100)]
    DAMAGE[damage](st, path, random.Random(seed))

    reader = Root(st, read_only=True)  # a lock-free reader: changes nothing, scans instead
    assert reader.read_table("u")["value"].to_pylist() == expected
    for lo in (0, 27, 50, 52, 60, 96, 99):
        got = reader.read_table("u", start_offset=lo, end_offset=lo + 3)["offset"].to_pylist()
        assert got == list(range(lo, min(lo + 3, 100))), (lo, got)
    reader.close()
    assert st.read(path) != b"" and values(st, "u") == expected  # the reader changed nothing

    writer = Root(st)
    writer.writable_log("u", 0)
    (rec,) = [r for r in writer.recoveries if r.directory == partition_dir("u", 0)]
    assert rec.rebuilt_indexes == [f"{partition_dir('u', 0)}/{SEG0}.log"]
    assert any(path in p for p in rec.problems), rec.problems
    assert rec.lost_bytes == 0
    writer.append("u", [b"next"], partition=0)
    assert writer.read_table("u", start_offset=27, end_offset=30)["value"].to_pylist() == expected[27:30]
    writer.close()
    assert values(st, "u") == [*expected, b"next"]


def test_time_index_with_an_entry_beyond_the_segment_is_rebuilt() -> None:
    st = MemStorage()
    _hundred_rows(st)
    path = f"{partition_dir('u', 0)}/{SEG0}.timeindex"
    data = bytearray(st.read(path))
    ts, _ = struct.unpack_from(">qi", data, 0)
    struct.pack_into(">qi", data, 0, ts, 5000)  # offset 5000 in a segment ending at 100
    _write_index(st, path, bytes(data))
    writer = Root(st)
    writer.writable_log("u", 0)
    (rec,) = [r for r in writer.recoveries if r.directory == partition_dir("u", 0)]
    assert rec.rebuilt_indexes and any(path in p for p in rec.problems), rec.problems
    assert writer.log("u", 0).offset_for_timestamp(T0 + 50).offset == 52  # the batch of T0 + 52


# ============================================================================ row 5: damaged tail


def test_zero_bytes_after_a_clean_tail_are_truncated_and_reported(tmp_path: Path) -> None:
    """100 zero bytes after the tail of a cleanly closed log: the writer truncates them and
    reports it (``pylog recover --json`` too, below) before it appends, so its own reads and other
    readers see every record, old and new."""
    st = LocalStorage(tmp_path)
    root = acked_root(st, 0, {"index.interval.bytes": "4096"})
    root.append("t", [b"r%d" % i for i in range(100)], partition=0)
    root.close()
    log_path = f"{partition_dir('t', 0)}/{SEG0}.log"
    with open(tmp_path / log_path, "ab") as f:
        f.write(b"\x00" * 100)

    writer = Root(st)
    writer.append("t", [b"after"], partition=0)
    (rec,) = writer.recoveries
    assert rec.truncated_file == log_path and rec.truncated_bytes == 100
    expected = [*(b"r%d" % i for i in range(100)), b"after"]
    assert writer.read_table("t")["value"].to_pylist() == expected  # its own reads
    assert values(st) == expected  # another reader's
    writer.close()
    assert values(st) == expected


def test_recover_json_reports_the_damaged_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pylog.cli import main

    st = LocalStorage(tmp_path)
    root = acked_root(st, 0)
    root.append("t", [b"r%d" % i for i in range(100)], partition=0)
    root.close()
    log_path = f"{partition_dir('t', 0)}/{SEG0}.log"
    with open(tmp_path / log_path, "ab") as f:
        f.write(b"\x00" * 100)
    capsys.readouterr()
    assert main(["recover", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (log_report,) = [r for r in report["logs"] if r["directory"] == partition_dir("t", 0)]
    assert log_report["truncated_file"] == log_path and log_report["truncated_bytes"] == 100
    assert log_report["recovered_segments"] == [log_path]
    assert any("byte" in p and log_path in p for p in log_report["problems"]), log_report
    assert (tmp_path / log_path).stat().st_size == len(st.read(log_path))  # truncated on disk
    assert values(st)[-1] == b"r99"


@pytest.mark.parametrize("tail", ["zeros", "random", "half-batch", "bad-crc"])
def test_damaged_tail_of_a_cleanly_closed_log_before_the_next_append(tail: str) -> None:
    st = MemStorage()
    root = acked_root(st, 0, {"index.interval.bytes": "200"})
    for i in range(20):
        root.append("t", [b"v%02d" % i * 10], partition=0)
    root.close()
    path = f"{partition_dir('t', 0)}/{SEG0}.log"
    data = st.read(path)
    rng = random.Random(7)
    if tail == "zeros":
        damaged = data + bytes(100)
    elif tail == "random":
        damaged = data + rng.randbytes(100)
    elif tail == "half-batch":
        damaged = data + data[-40:]  # the end of a batch where a batch should start
    else:
        b = bytearray(data)
        b[-5] ^= 0xFF  # inside the last batch: its CRC no longer matches
        damaged = bytes(b)
    _write_index(st, path, damaged)
    writer = Root(st)
    if tail == "bad-crc":  # an acknowledged batch is lost: appending needs an explicit decision
        with pytest.raises(DamagedLogError, match="high watermark 20"):
            writer.append("t", [b"next"], partition=0)
        (repair,) = writer.recover(accept_data_loss=True)
        assert repair.high_watermark == (20, 19)
    writer.append("t", [b"next"], partition=0)
    rec = writer.recoveries[0]
    assert rec.truncated_file == path and rec.truncated_bytes > 0 and rec.problems
    served = writer.read_table("t")["value"].to_pylist()
    writer.close()
    expected = [b"v%02d" % i * 10 for i in range(20 if tail != "bad-crc" else 19)]
    assert served == [*expected, b"next"]
    assert values(st) == [*expected, b"next"]


def test_intact_logs_are_not_reported() -> None:
    st = MemStorage()
    root = acked_root(st, 30, {"segment.bytes": "600"})
    root.close()
    writer = open_writer(st)
    assert all(not r.problems and not r.rebuilt_indexes and not r.lost_bytes for r in writer.recoveries)
    assert all(not r.recovered_segments for r in writer.recoveries)


# ============================================================================ the campaign


def test_io_error_while_truncating_to_the_high_watermark_names_the_file() -> None:
    """The truncation of an unfinished publish (past the high watermark) is part of the load."""
    from pylog.storage.config import LogConfig
    from pylog.storage.partition.loader import load_log, open_log

    st = MemStorage()
    cfg = LogConfig.from_dict({"segment.bytes": "200"})
    lg = open_log(st, "t-0", cfg, had_clean_shutdown=True)
    for i in range(12):
        lg.append([b"v%02d" % i * 5], timestamp=T0)
    lg.close()
    assert len(lg.segments) > 2
    disk = st.kill()
    disk.fail(errno.EIO, ops=frozenset({"delete", "truncate"}))
    with pytest.raises(StorageError, match=r"t-0/\d{20}\.(log|index|timeindex)"):
        load_log(disk, "t-0", cfg, had_clean_shutdown=True, high_watermark=3)
    disk.clear_faults()
    res = load_log(disk.kill(), "t-0", cfg, had_clean_shutdown=True, high_watermark=3)
    assert res.log.log_end_offset == 3 and res.recovery.unpublished_bytes > 0
    assert res.log.read_table()["value"].to_pylist() == [b"v%02d" % i * 5 for i in range(3)]


def test_fault_at_every_step_of_recovery() -> None:
    """The default-run slice of the campaign's fault part (tests/reliability/faults.py): two
    histories, ENOSPC and EIO at every storage operation of their recovery."""
    from tests.reliability.faults import run_fault_campaign

    stats = run_fault_campaign(Stats(), histories=("killed-writer", "damaged-after-clean-close"))
    failures = stats.__dict__.get("failures", [])
    assert stats.lost == 0 and stats.phantom == 0, failures
    assert stats.extra.get("unnamed_errors", 0) == 0, failures
    assert stats.extra["faults_injected"] == stats.extra["opens_failed"] > 100
    assert stats.extra["retries"] == stats.extra["faults_injected"]
    # the root's own steps (metadata and state files, the clean-shutdown marker, the root
    # directory, the truncation past the high watermark) name their file too: no raw OSError
    assert stats.extra.get("root_level_raw_errors", 0) == 0, stats.__dict__.get("root_level")


# ============================================================================ the checks themselves


def _index(st: MemStorage, name: str, fmt: str, rows: list[tuple[int, ...]]) -> str:
    _write_index(st, name, b"".join(struct.pack(fmt, *r) for r in rows))
    return name


def test_index_entry_checks_name_the_entry() -> None:
    from pylog.storage.errors import CorruptIndexError
    from pylog.storage.partition.index import OffsetIndex, TimeIndex
    from pylog.storage.partition.txnindex import TxnIndex

    st = MemStorage()
    cases: list[tuple[Any, dict[str, int], str]] = [
        (
            OffsetIndex(st, _index(st, "a.index", ">ii", [(1, 10), (1, 20)]), 100),
            {},
            "entry 1 has offset 101, not above",
        ),
        (
            OffsetIndex(st, _index(st, "b.index", ">ii", [(1, 20), (2, 10)]), 100),
            {},
            "entry 1 has position 10",
        ),
        (
            OffsetIndex(st, _index(st, "c.index", ">ii", [(1, 10), (2, 500)]), 100),
            {"log_size": 400},
            "byte 500, beyond the 400",
        ),
        (
            OffsetIndex(st, _index(st, "d.index", ">ii", [(1, 10), (9, 20)]), 100),
            {"end_offset": 105},
            "109, at or beyond 105",
        ),
        (OffsetIndex(st, _index(st, "e.index", ">ii", [(-1, 10)]), 100), {}, "less than the base offset"),
        (
            TimeIndex(st, _index(st, "f.timeindex", ">qi", [(5, 1), (7, 0), (9, 2)]), 100),
            {},
            "entry 1 has offset 100, below",
        ),
        (
            TimeIndex(st, _index(st, "g.timeindex", ">qi", [(5, 1), (4, 2), (9, 3)]), 100),
            {},
            "timestamp 4, below",
        ),
        (
            TimeIndex(st, _index(st, "h.timeindex", ">qi", [(5, 1), (6, 50)]), 100),
            {"end_offset": 120},
            "150, at or beyond 120",
        ),
        (
            TxnIndex(st, _index(st, "i.txnindex", ">hqqqq", [(0, 1, 100, 105, 0), (0, 1, 101, 103, 0)]), 100),
            {},
            "lastOffset 103",
        ),
        (
            TxnIndex(st, _index(st, "j.txnindex", ">hqqqq", [(0, 1, 107, 105, 0)]), 100),
            {},
            "firstOffset 107 above",
        ),
    ]
    for idx, bounds, message in cases:
        with pytest.raises(CorruptIndexError, match=message) as e:
            idx.sanity_check(**bounds)
        assert idx.path in str(e.value)
    OffsetIndex(st, _index(st, "ok.index", ">ii", [(1, 10), (2, 20)]), 100).sanity_check(
        log_size=21, end_offset=103
    )


def test_index_checks_are_vectorized() -> None:
    """A full 10 MiB offset index (1.3 million entries) is checked in milliseconds."""
    import time

    import numpy as np

    from pylog.storage.partition.index import OffsetIndex

    n = (10 << 20) // 8
    raw = np.empty(n, dtype=[("rel", ">i4"), ("pos", ">i4")])
    raw["rel"] = np.arange(n) * 3
    raw["pos"] = np.arange(n) * 1000
    st = MemStorage()
    _write_index(st, "big.index", raw.tobytes())
    idx = OffsetIndex(st, "big.index", 0)
    len(idx)
    started = time.perf_counter()
    idx.sanity_check(log_size=n * 1000 + 100, end_offset=3 * n)
    assert time.perf_counter() - started < 0.5
