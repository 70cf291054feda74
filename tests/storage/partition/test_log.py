"""The log engine: appends, rolls, reads, lookups, truncation (Kafka's LogTest/LogSegmentTest)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.errors import InvalidOffsetError, OffsetOutOfRangeError, RecordTooLargeError
from pylog.storage.partition import loader
from pylog.storage.partition.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, Log
from pylog.storage.partition.segment import INT32_MAX

DIR = "t-0"


def open_log(tmp_path, **cfg) -> Log:  # type: ignore[no-untyped-def]
    return loader.open_log(LocalStorage(tmp_path), DIR, LogConfig.from_dict(cfg), had_clean_shutdown=True)


def values(n: int, start: int = 0, size: int = 20) -> list[bytes]:
    return [(b"v%08d" % i).ljust(size, b".") for i in range(start, start + n)]


def test_append_assigns_offsets_and_reads_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path)
    info = lg.append(values(10), timestamp=1000)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 9, 10)
    info = lg.append(values(5, 10), key=[b"k"] * 5, timestamp=2000)
    assert (info.first_offset, info.last_offset) == (10, 14)
    assert lg.log_end_offset == 15
    t = lg.read_table()
    assert t.column("offset").to_pylist() == list(range(15))
    assert t.column("value").to_pylist() == values(15)
    assert lg.read_table(3, 7).column("offset").to_pylist() == [3, 4, 5, 6]
    assert lg.read(15) == (0, b"")
    with pytest.raises(OffsetOutOfRangeError, match="out of range"):
        lg.read(16)


def test_roll_on_segment_bytes_with_trimmed_indexes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.bytes": 4096, "index.interval.bytes": 200})
    for i in range(60):
        lg.append(values(10, i * 10, size=30), timestamp=1000 + i)
    assert len(lg.segments) > 5
    assert all(s.size <= 4096 for s in lg.segments)
    bases = [s.base_offset for s in lg.segments]
    assert bases == sorted(bases) and bases[0] == 0
    for prev, nxt in zip(lg.segments, lg.segments[1:], strict=False):
        assert prev.read_next_offset() == nxt.base_offset
        # inactive segments: indexes hold exactly their entries, last time entry = max ts
        assert (tmp_path / prev.offset_index.path).stat().st_size == 8 * len(prev.offset_index)
        assert (tmp_path / prev.time_index.path).stat().st_size == 12 * len(prev.time_index)
        assert prev.time_index.last_entry[0] == prev.largest_timestamp
    assert lg.read_table().column("value").to_pylist() == values(600, size=30)


def test_roll_on_segment_ms_by_record_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.ms": 1000})
    lg.append(values(1), timestamp=10_000)
    lg.append(values(1), timestamp=10_500)
    assert len(lg.segments) == 1
    lg.append(values(1), timestamp=11_001)  # waited 1001 ms of record time > segment.ms
    assert [s.base_offset for s in lg.segments] == [0, 2]


def test_roll_when_index_is_full(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.index.bytes": 8 * 3, "index.interval.bytes": 1})
    for i in range(20):
        lg.append(values(1, i), timestamp=i)
    assert len(lg.segments) > 3
    assert all(len(s.offset_index) <= 3 for s in lg.segments)
    assert lg.read_table().column("offset").to_pylist() == list(range(20))


def _batches_at(offsets: list[int], ts: int = 0) -> bytes:
    return b"".join(records.encode([b"x"], timestamp=ts, base_offset=o).tobytes() for o in offsets)


def test_relative_offset_overflow_rolls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"cleanup.policy": "compact"})  # (offsets 6.. held by no segment: a gap)
    lg.append_batches(_batches_at([0, 5, INT32_MAX + 10]), assign_offsets=False)
    assert [s.base_offset for s in lg.segments] == [0, INT32_MAX + 10]
    assert lg.read_table().column("offset").to_pylist() == [0, 5, INT32_MAX + 10]


def test_read_at_gap_returns_next_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path)
    lg.append_batches(_batches_at([0, 10, 20]), assign_offsets=False)
    _, data = lg.read(5)
    assert records.decode(data).records.column("offset").to_pylist()[0] == 10
    assert lg.read_table(5, 20).column("offset").to_pylist() == [10]
    assert lg.log_end_offset == 21


def test_append_misuse_is_rejected_and_log_unchanged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"max.message.bytes": 2000})
    lg.append_batches(_batches_at([0, 1, 2]), assign_offsets=False)
    size = lg.size
    with pytest.raises(InvalidOffsetError, match="not above"):
        lg.append_batches(_batches_at([1]), assign_offsets=False)  # below the LEO
    with pytest.raises(InvalidOffsetError, match="not above"):
        lg.append_batches(_batches_at([7, 6]), assign_offsets=False)  # out of order
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
        lg.append([b"x" * 5000])
    corrupt = bytearray(_batches_at([3]))
    corrupt[-1] ^= 1
    with pytest.raises(InvalidOffsetError, match="CRC"):
        lg.append_batches(bytes(corrupt))
    assert lg.size == size and lg.log_end_offset == 3
    compacted = open_log(tmp_path / "c", **{"cleanup.policy": "compact"})
    with pytest.raises(InvalidOffsetError, match="key"):
        compacted.append([b"v"], key=[None])
    assert compacted.log_end_offset == 0


def test_append_batches_assigns_offsets_like_a_leader(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path)
    lg.append(values(3))
    raw = records.encode(values(4), base_offset=0, batch_bytes=80).tobytes()
    info = lg.append_batches(raw)
    assert (info.first_offset, info.last_offset) == (3, 6)
    assert lg.read_table().column("offset").to_pylist() == list(range(7))


def test_truncate_to(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.bytes": 1024})
    for i in range(30):
        lg.append(values(2, 2 * i, size=40), timestamp=i)
    n_segments = len(lg.segments)
    lg.truncate_to(31)  # whole batches go, as in Kafka: the batch holding 30-31 is removed
    assert lg.log_end_offset == 30
    assert len(lg.segments) < n_segments
    assert lg.read_table().column("value").to_pylist() == values(30, size=40)
    lg.append(values(1, 999))
    assert lg.read_table(30).column("value").to_pylist() == values(1, 999)


def test_segment_files_are_valid_kafka_format(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.bytes": 8192, "index.interval.bytes": 512})
    for i in range(40):
        lg.append(
            values(5, 5 * i, size=50),
            key=[b"k%d" % j for j in range(5)],
            timestamp=100 + i,
            headers=[[("h", b"%d" % i)]] * 5,
            codec=["none", "gzip", "lz4", "zstd"][i % 4],
        )
    lg.close()
    n = 0
    for seg in lg.segments:
        data = (tmp_path / seg.log_path).read_bytes()
        p = 0
        while p < len(data):
            size = int.from_bytes(data[p + 8 : p + 12], "big") + 12
            batch = DefaultRecordBatch(data[p : p + size])
            assert batch.validate_crc()
            n += sum(1 for _ in batch)
            p += size
    assert n == 200


# --------------------------------------------------------------------------- lookups


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=60),
    ts_steps=st.lists(st.integers(-3, 10), min_size=60, max_size=60),
    seg_bytes=st.integers(300, 2000),
    interval=st.integers(1, 400),
    probes=st.lists(st.integers(-2, 400), min_size=5, max_size=20),
)
def test_lookups_equal_brute_force(tmp_path_factory, gaps, ts_steps, seg_bytes, interval, probes) -> None:  # type: ignore[no-untyped-def]
    """Every offset and timestamp lookup in a random log with gaps (a compacted one: in a
    delete-policy log, offsets between segments that no segment holds are damage) equals a
    linear scan."""
    tmp = tmp_path_factory.mktemp("lk")
    cfg = {"segment.bytes": seg_bytes, "index.interval.bytes": interval, "cleanup.policy": "compact"}
    lg = open_log(tmp, **cfg)
    offsets = np.cumsum(gaps)
    ts = 1000 + np.cumsum(ts_steps[: len(offsets)])  # timestamps may go backwards
    data = b"".join(
        records.encode([b"r%d" % o], timestamp=int(t), base_offset=int(o)).tobytes()
        for o, t in zip(offsets, ts, strict=True)
    )
    lg.append_batches(data, assign_offsets=False)
    for target in probes:
        # read: first record with offset >= target
        if 0 <= target <= lg.log_end_offset:
            got = lg.read_table(target).column("offset").to_pylist()
            assert got == [int(o) for o in offsets if o >= target]
        # timestamp: earliest offset whose timestamp >= target timestamp
        want_ts = 1000 + target
        expect = next((int(o) for o, t in zip(offsets, ts, strict=True) if t >= want_ts), None)
        found = lg.offset_for_timestamp(want_ts)
        assert (found.offset if found else None) == expect
    assert lg.offset_for_timestamp(EARLIEST_TIMESTAMP).offset == 0
    assert lg.offset_for_timestamp(LATEST_TIMESTAMP).offset == int(offsets[-1]) + 1
    mx = lg.offset_for_timestamp(MAX_TIMESTAMP)
    assert mx.timestamp == int(ts.max())
    assert mx.offset == int(offsets[int(np.argmax(ts))])


def test_lookup_uses_index_not_full_scan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"index.interval.bytes": 100})
    for i in range(200):
        lg.append(values(5, 5 * i), timestamp=i)
    seg = lg.segments[0]
    assert len(seg.offset_index) > 50
    off, pos = seg.offset_index.lookup(777)
    assert off <= 777 and pos > 0
    got = lg.read(777, max_bytes=1)[1]
    assert records.decode(got).records.column("offset").to_pylist()[0] <= 777


def test_arrow_table_append_and_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path)
    v = pa.array([b"a", None, b"c"])
    k = pa.array(["x", "y", None])
    lg.append(v, k, pa.array([1, 2, 3], pa.timestamp("ms")), [[("h", b"1")], [], []])
    t = lg.read_table()
    assert t.column("value").to_pylist() == [b"a", None, b"c"]
    assert t.column("key").to_pylist() == [b"x", b"y", None]
    assert t.column("timestamp").to_pylist() == [1, 2, 3]


# --------------------------------------------------------------------------- segment replacement


def test_replace_segments_swaps_and_defers_deletion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pylog.storage.partition.segment import LogSegment

    cfg = {"segment.bytes": 600, "file.delete.delay.ms": 1000, "cleanup.policy": "compact"}
    lg = open_log(tmp_path, **cfg)
    for i in range(20):
        lg.append(values(3, 3 * i, size=30), key=[b"k"] * 3, timestamp=i)
    old = lg.segments[:3]
    steps: list[str] = []
    lg.faults.hook = steps.append
    # a "cleaned" replacement holding only the first batch of each old segment
    new = LogSegment(lg.storage, lg.directory, old[0].base_offset, lg.config, suffix=".cleaned")
    for seg in old:
        first = next(seg.iter_batches(0))
        h = first.headers.take(slice(0, 1))
        new.append(first.data[: int(h.size[0])], h)
    lg.replace_segments([new], old, now=0)
    assert steps[0] == "cleaned-written" and steps[-1] == "done" and "all-swap" in steps
    names = sorted(p.name for p in (tmp_path / DIR).iterdir())
    assert any(n.endswith(".log.deleted") for n in names)  # readers of old files get the delay
    assert not any(n.endswith((".cleaned", ".swap")) for n in names)
    kept = lg.read_table().column("offset").to_pylist()
    assert kept[:3] == [0, 1, 2] and len(kept) < 60
    assert lg.delete_pending(now=999) == 0 and lg.delete_pending(now=1000) == 3
    assert not any(p.name.endswith(".deleted") for p in (tmp_path / DIR).iterdir())


def test_delete_segments_advances_log_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path, **{"segment.bytes": 600, "file.delete.delay.ms": 0})
    for i in range(20):
        lg.append(values(3, 3 * i, size=30), timestamp=i)
    first_kept = lg.segments[2].base_offset
    lg.delete_segments(lg.segments[:2], now=0)
    assert lg.log_start_offset == first_kept
    assert lg.read_table().column("offset").to_pylist()[0] == first_kept
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(0)
    leo = lg.log_end_offset
    lg.delete_segments(list(lg.segments), now=0)  # everything: an empty active segment remains
    assert lg.log_start_offset == leo == lg.log_end_offset and len(lg.segments) == 1
    lg.append(values(1))
    assert lg.read_table().column("offset").to_pylist() == [leo]


def test_log_written_indexes_pass_kafka_dump_verification(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Indexes of every segment (rolled and active, after close) verify against their logs with
    the dump tool's --verify-index-only and --index-sanity-check, as kafka-dump-log.sh would."""
    import io

    from pylog.tools.dump import dump

    lg = open_log(tmp_path, **{"segment.bytes": 6000, "index.interval.bytes": 300})
    for i in range(120):
        lg.append(values(4, 4 * i, size=25), timestamp=1000 + (i * 7) % 50, codec=["none", "gzip"][i % 2])
    lg.close()
    assert len(lg.segments) > 3
    files = [str(tmp_path / p) for s in lg.segments for p in (s.offset_index.path, s.time_index.path)]
    for flag in ("verify_index_only", "index_sanity_check"):
        out, err = io.StringIO(), io.StringIO()
        assert dump(files, **{flag: True}, out=out, err=err) == 0, err.getvalue()
        assert "Mismatches" not in out.getvalue() + err.getvalue()
    assert sum(len(s.offset_index) for s in lg.segments) > 20


def test_reader_during_frequent_rolls_sees_only_complete_batches_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Kafka's LogConcurrencyTest with tiny segments: one thread appends while another reads
    up to the log end; every batch read is complete and offsets arrive in order."""
    import threading

    lg = open_log(tmp_path, **{"segment.bytes": 237 * 2})
    n = 400
    errors: list[BaseException] = []
    seen: list[int] = []

    def writer() -> None:
        try:
            for i in range(n):
                lg.append([b"r%04d" % i], timestamp=i)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    nxt = 0
    while t.is_alive() or nxt < lg.log_end_offset:
        end = lg.log_end_offset
        if nxt < end:
            got = lg.read_table(nxt, end).column("offset").to_pylist()
            assert got == list(range(nxt, end))
            seen.extend(got)
            nxt = end
    t.join()
    assert not errors and seen == list(range(n))
    assert len(lg.segments) > 20


def test_roll_rules_and_close_idempotent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lg = open_log(tmp_path)
    lg.append(values(5))
    seg = lg.roll()
    assert seg.base_offset == 5 and lg.roll() is seg  # rolling an empty active segment is a no-op
    assert lg.roll(base_offset=2).base_offset == 5  # never below the log end
    lg.close()
    lg.close()
    again = open_log(tmp_path)
    assert again.log_end_offset == 5


def test_reopened_log_keeps_indexing_every_interval(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A log reopened for each append (as the sink's commits do) still gets an index entry
    whenever more than index.interval.bytes were written since the last one, exactly as a
    log appended in one session (and as Kafka's recovery would rebuild it)."""
    cfg = {"index.interval.bytes": 300}
    one = open_log(tmp_path / "one", **cfg)
    for i in range(40):
        one.append(values(2, 2 * i, size=40), timestamp=i)
    one.close()
    for i in range(40):
        lg = open_log(tmp_path / "many", **cfg)
        lg.append(values(2, 2 * i, size=40), timestamp=i)
        lg.close()
    reopened = open_log(tmp_path / "many", **cfg)
    ref = open_log(tmp_path / "one", **cfg)
    got = reopened.segments[0].offset_index.entries()
    want = ref.segments[0].offset_index.entries()
    assert len(got[0]) > 5
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_a_segment_whose_file_was_removed_from_outside_is_not_renamed_as_if_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Renaming a segment (retention's ``.deleted``, a replacement's ``.swap``) whose ``.log``
    held records but is gone fails naming the file, instead of renaming its indexes alone and
    carrying on as if the segment had been empty."""
    import errno
    import os

    from pylog.storage.errors import StorageIOError

    lg = open_log(tmp_path)
    lg.append(values(10), timestamp=1000)
    lg.roll()
    seg = lg.segments[0]
    os.remove(tmp_path / seg.log_path)
    with pytest.raises(StorageIOError, match="gone") as e:
        lg.delete_segments([seg])
    assert e.value.errno == errno.ENOENT and e.value.filename == seg.log_path
    assert (tmp_path / DIR / "00000000000000000000.index").exists()  # nothing else renamed
    from pylog.storage.partition.segment import LogSegment

    empty = LogSegment(LocalStorage(tmp_path), DIR, 999, LogConfig())  # never written: no file
    assert empty.size == 0
    empty.change_suffix(".deleted")  # renamed without fuss
    assert empty.log_path.endswith("00000000000000000999.log.deleted")
