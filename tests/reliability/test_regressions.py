"""Regression tests (docs/reliability.md, "Regression tests"): each is the smallest
deterministic history in which a power cut, a crash or a replay could lose or mis-serve data,
replayed on the power-loss file system of :mod:`tests.reliability.memfs`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa

from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.maintenance import retention
from pylog.storage.partition.loader import load_log, open_log
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from tests.reliability.checker import open_writer, read_storage
from tests.reliability.memfs import MemStorage

T0 = 1_700_000_000_000
SMALL = {"segment.bytes": "400", "index.interval.bytes": "60"}


def values(st: MemStorage, topic: str = "t", partition: int = 0) -> list[bytes]:
    return [r[2] for r in read_storage(st, [topic]).get((topic, partition), [])]


def test_first_segment_of_a_new_partition_survives_a_power_cut() -> None:
    """``Log.flush`` (storage/partition/log.py) makes a segment created since the last flush
    durable with its name, fsyncing the directory as Kafka's ``LocalLog.flush`` does: a power
    cut keeps every acknowledged record of a new partition."""
    st = MemStorage()
    root = Root(st)
    root.create_topic("t", 1)
    root.append("t", [b"acked"])
    after = st.power_cut()
    assert values(after) == [b"acked"]
    assert values(open_writer(after).storage) == [b"acked"]


def test_segments_removed_by_truncation_stay_removed_after_a_power_cut() -> None:
    """``Log.truncate_to``: segments deleted when a writer truncates unacknowledged data stay
    deleted after a power cut, so they never shadow the offsets appended since (no acknowledged
    record lost, no offset served with two values)."""
    st = MemStorage()
    root = Root(st)
    root.create_topic("t", 1)
    for i in range(3):
        root.append("t", [b"acked-%d" % i], timestamp=T0)
    lg = root.writable_log("t", 0)
    lg.append([b"unacked-a"], timestamp=T0)  # a publish that never completed: offset 3, then
    lg.roll()  # a new segment at offset 4
    lg.append([b"unacked-b", b"unacked-c"], timestamp=T0)
    lg.flush()
    root.checkpoint()  # the recovery point moves past the truncation point
    st = st.kill()  # the writer dies; the next one truncates to the high watermark (3)
    writer = open_writer(st)
    assert len(writer.log("t", 0).segments) == 1
    for i in range(3, 6):
        writer.append("t", [b"acked-%d" % i], timestamp=T0)  # offsets 3..5, in the first segment
    after = st.power_cut()
    assert values(after) == [b"acked-%d" % i for i in range(6)]
    for root in (Root(after, read_only=True), open_writer(after)):
        for i in range(6):  # a fetch from each offset (a consumer resuming there)
            got = root.read_table("t", start_offset=i, end_offset=i + 1).column("value").to_pylist()
            assert got == [b"acked-%d" % i], (i, got)


def test_reader_ignores_an_index_entry_whose_log_bytes_were_lost() -> None:
    """``read_next_offset`` (storage/partition/segment.py): after a power cut that kept an index
    page but not the log bytes it points at, a reader does not compute the segment's end from
    the torn index entry: the segment's acknowledged records stay visible."""
    st = MemStorage()
    cfg = LogConfig.from_dict({"index.interval.bytes": "1"})
    lg = open_log(st, "t-0", cfg, had_clean_shutdown=True)
    for i in range(4):
        lg.append([b"v%d" % i], timestamp=T0 + i)
    lg.flush()
    n_index = st.size("t-0/00000000000000000000.index")
    lg.append([b"unflushed"], timestamp=T0 + 9)  # its index entry reaches the disk, its bytes do not
    st.truncate("t-0/00000000000000000000.log", st.size("t-0/00000000000000000000.log") - 30)
    assert st.size("t-0/00000000000000000000.index") > n_index
    reader = load_log(st, "t-0", cfg, read_only=True).log
    assert reader.log_end_offset == 4
    assert reader.read_table().column("value").to_pylist() == [b"v0", b"v1", b"v2", b"v3"]


def test_reader_sees_an_interrupted_swap_as_recovery_will_complete_it() -> None:
    """Read-only loading (storage/partition/loader.py): while (or after a crash while) old segments
    are already ``.deleted`` and the new ones still ``.swap``, a reader takes the ``.swap``
    files as recovery will, never serving a hole where the compacted records are."""
    st = MemStorage()
    cfg = LogConfig.from_dict({"cleanup.policy": "compact"})
    lg = open_log(st, "t-0", cfg, had_clean_shutdown=True)
    lg.append([b"a", b"b"], key=[b"k", b"j"], timestamp=T0)
    lg.roll()
    lg.append([b"c"], key=[b"k"], timestamp=T0)
    lg.flush()
    old = lg.segments[0]
    from pylog.storage.partition.segment import LogSegment

    new = LogSegment(st, "t-0", 0, cfg, suffix=".cleaned")
    enc = records.encode([b"b"], key=[b"j"], base_offset=1, timestamp=T0)
    new.append(enc.buffer, enc.batches)

    class Stop(BaseException):
        pass

    def hook(step: str) -> None:
        if step == "renamed-deleted":
            raise Stop

    lg.faults.hook = hook
    with contextlib.suppress(Stop):
        lg.replace_segments([new], [old])
    names = st.listdir("t-0")
    assert "00000000000000000000.log.swap" in names and "00000000000000000000.log.deleted" in names
    reader = load_log(st, "t-0", cfg, read_only=True).log
    t = reader.read_table()
    assert list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True)) == [
        (1, b"b"),
        (2, b"c"),
    ]


def test_creating_the_first_topic_is_all_or_nothing() -> None:
    """``create_topic`` (storage/root/manager.py) writes the metadata before the partition
    directories: a crash leaves a complete topic or none, never one *inferred* from the
    directories - with fewer partitions and default configs - that ``create_topic(...,
    exist_ok=True)`` would accept."""
    for k in range(1, 8):
        st = MemStorage()
        root = Root(st)
        st.crash_after(k)
        with contextlib.suppress(BaseException):
            root.create_topic("t", 3, {"cleanup.policy": "compact"})
        st.crash_after(None)
        st._dead = False
        for after in (st.kill(), st.power_cut()):
            r = Root(after)
            if "t" in r.topics():
                assert r.partitions("t") == 3 and r.config("t").compact, k


def test_append_to_a_partition_without_high_watermark_is_invisible_until_acknowledged() -> None:
    """``Root.append``/``Root.publish``: a partition without a high watermark (a topic whose
    creation a crash interrupted before ``pylog-state.json`` was written, or a Kafka log
    directory) serves appended data only once it is acknowledged, so a crash in the middle of a
    publish leaves no part of the batch visible."""
    st = MemStorage()
    root = Root(st)
    root.create_topic("t", 2)
    state = pub.read_state(st)
    state.high_watermarks.clear()  # as if the crash came before the state file was written
    pub.write_state(st, state)
    st = st.kill()
    root = Root(st)

    def die(step: str) -> None:
        if step == "appended":
            raise KeyboardInterrupt

    files = []
    for p in range(2):
        name = pub.stage_name("q", 0, p, 0)
        st.write_atomic(
            f"{partition_dir('t', p)}/{name}", records.encode([b"x%d" % p], timestamp=T0).tobytes()
        )
        files.append(pub.StagedFile("t", p, name))
    root.faults.hook = die
    with contextlib.suppress(KeyboardInterrupt):
        root.publish("q", 0, files)
    assert read_storage(st, ["t"]) == {("t", 0): [], ("t", 1): []}  # nothing visible mid-publish
    after = st.kill()
    assert read_storage(after, ["t"]) == {("t", 0): [], ("t", 1): []}
    assert Root(after).last_committed_batch("q") == -1


def test_reader_honours_the_log_start_checkpoint_written_before_retention_renames() -> None:
    """``Root`` readers: retention checkpoints the new log start offset before it renames
    segments to ``.deleted``; a reader honours that checkpoint, so after a crash in between it
    never serves records the writer removed (the log start never goes back)."""
    st = MemStorage()
    root = Root(st)
    root.create_topic("r", 1, {"segment.bytes": "300", "retention.bytes": "350"})
    for i in range(12):
        root.append("r", pa.table({"value": [b"r-%02d" % i]}), timestamp=T0)
    lg = root.writable_log("r", 0)
    lg.flush()

    def die(step: str) -> None:
        if step == "log-start-checkpointed":
            raise KeyboardInterrupt

    lg.faults.hook = die
    with contextlib.suppress(KeyboardInterrupt):
        retention.retain(lg, now=T0)
    reader = Root(st, read_only=True)
    start = reader.log("r", 0).log_start_offset
    assert start > 0
    assert next(r[0] for r in read_storage(st, ["r"])[("r", 0)]) == start
    assert open_writer(st.kill()).log("r", 0).log_start_offset == start


def test_reader_of_an_interrupted_swap_that_emptied_a_segment() -> None:
    """Read-only loading (storage/partition/loader.py): a ``.swap`` segment that compaction
    emptied covers no offsets, yet it replaces the segment of the same name: a fetch from that
    segment's offsets serves what recovery would."""
    st = MemStorage()
    cfg = LogConfig.from_dict({"cleanup.policy": "compact"})
    lg = open_log(st, "t-0", cfg, had_clean_shutdown=True)
    lg.append([b"a"], key=[b"k"], timestamp=T0)
    lg.roll()
    lg.append([b"b"], key=[b"k"], timestamp=T0)
    lg.roll()
    lg.flush()
    from pylog.storage.partition.segment import LogSegment

    old = lg.segments[0]
    empty = LogSegment(st, "t-0", 0, cfg, suffix=".cleaned")  # every record of it superseded
    empty.open_for_append()
    lg.replace_segments([empty], [old])
    # the same state as a crash after the swap but before the old files were removed
    st.write_atomic("t-0/00000000000000000000.log.swap", b"")
    st.write_atomic("t-0/00000000000000000000.log", old_bytes := st.read("t-0/00000000000000000001.log"))
    assert old_bytes
    reader = load_log(st, "t-0", cfg, read_only=True).log
    assert [s.base_offset for s in reader.segments] == [0, 1, 2]
    assert reader.read_table(1, 2).column("value").to_pylist() == [b"b"]


def test_a_new_log_directory_survives_a_power_cut() -> None:
    """``load_log`` (storage/partition/loader.py) fsyncs the parent of a new log's directory:
    flushed records of a log opened with the low-level API survive a power cut with the whole
    directory."""
    st = MemStorage()
    lg = open_log(st, "t-0", LogConfig(), had_clean_shutdown=True)
    lg.append([b"v"], timestamp=T0)
    lg.flush()
    after = load_log(st.power_cut(), "t-0", LogConfig()).log
    assert after.read_table().column("value").to_pylist() == [b"v"]


def test_replayed_batch_restaged_with_the_same_task_attempt_lands_once(tmp_path: Path) -> None:
    """``stage_task`` (connector/sink_task.py) starts its staged file afresh: when the driver
    dies between the tasks' staging and the commit, the restarted query (whose task attempts are
    numbered from 0 again) never appends to the leftover file of the same name, and the
    replayed commit publishes each row once (the random-kill campaign's ground)."""
    import pylog
    from pylog.connector import sink
    from pylog.connector.sink_options import parse_sink_options

    opts = parse_sink_options(
        {"path": str(tmp_path / "root"), "topic": "t", "checkpointlocation": str(tmp_path / "ck")},
        streaming=True,
    )
    with pylog.open(tmp_path / "root") as r:
        r.create_topic("t", 1)
    rows = pa.record_batch({"value": pa.array([b"a", b"b"])})
    sink.stage_task(iter([rows]), opts, 0, 0, 0)  # the first run's task; then the driver dies
    again = sink.stage_task(iter([rows]), opts, 0, 0, 0)  # the restarted query replays batch 0
    sink.publish(opts, [again], 0)
    with pylog.open(tmp_path / "root", read_only=True) as r:
        assert r.read_table("t").column("value").to_pylist() == [b"a", b"b"]


def test_truncated_segment_keeps_the_timestamps_of_its_remaining_batches() -> None:
    """``truncate_to`` (storage/partition/segment.py) keeps the largest timestamp of the batches
    a segment keeps: the time index is sparse, so a segment truncated below its last entry (a
    writer rolling back an unacknowledged publish) scans the batches after the entry, as
    Kafka's ``readLargestTimestamp`` does, and ``offset_for_timestamp`` does not skip it (the
    stateful model test's ground)."""
    st = MemStorage()
    lg = open_log(st, "t-0", LogConfig.from_dict({"index.interval.bytes": "40"}), had_clean_shutdown=True)
    for i in range(3):
        lg.append([b"v%d" % i], timestamp=T0 + i)
    lg.truncate_to(1)
    assert lg.active.largest_timestamp == T0
    found = lg.offset_for_timestamp(T0)
    assert found is not None and (found.offset, found.timestamp) == (0, T0)
