"""spark.readStream.format("pylog") on a real local SparkSession: triggers, rate limits, restarts
and replays, gaps, retention, recreated logs and new partitions (TESTING.md §2, checklist E35-E41)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.connector.options import DEFAULT_GROUP_ID_PREFIX
from pylog.storage.root.consumers import read_consumer_offsets
from tests.conftest import Backend
from tests.connector.source_helpers import (
    T0,
    Collector,
    append,
    append_at,
    control_batch,
    delete_topic,
    forget_batch,
    publish,
    reader,
    remove_partition,
    run_available_now,
    start_stream,
    value,
)


def no_duplicates(c: Collector) -> list[tuple[Any, ...]]:
    rows = c.rows()
    dup = [k for k, n in Counter((r[0], r[1], r[2]) for r in rows).items() if n > 1]
    assert not dup, f"duplicated records: {dup[:5]}"
    return rows


def test_available_now_rate_limit_and_restart_with_data_added_while_stopped(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """E35: maxOffsetsPerTrigger split in proportion to backlog, respected after a restart; data
    added while stopped is read once, with no gap; consumed offsets are recorded for describe."""
    ck = tmp_path / "ck"
    with backend.open() as root:
        root.create_topic("t", 3)
        for p, n in enumerate((60, 20, 4)):
            append(root, "t", p, n)
    c = Collector()
    opts = {"subscribe": "t", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "30", "groupId": "q1"}
    q = run_available_now(spark, backend, ck, c, **opts)
    sizes = c.batch_sizes()
    assert max(sizes) <= 30 and sum(sizes) == 84
    first = Counter(r[1] for r in c.attempts[0][0])
    assert first == {0: 21, 1: 7, 2: 1}  # Kafka's rateLimit: 30*60/84 = 21.4, 30*20/84 = 7.1, 30*4/84 = 1.4
    progress = q.recentProgress[-1]["sources"][0]
    assert progress["latestOffset"] is not None and '"0": 60' in progress["latestOffset"]
    last = max(c.attempts)
    forget_batch(ck, last)  # crashed before the last batch was committed: it is replayed (E41)
    with backend.open() as root:  # while the query is stopped
        append(root, "t", 1, 50)
        append(root, "t", 2, 5)
    run_available_now(spark, backend, ck, c, **opts)
    assert len(c.attempts[last]) == 2 and sorted(c.attempts[last][0]) == sorted(c.attempts[last][1])
    assert max(c.batch_sizes()) <= 30
    rows = no_duplicates(c)
    want = {("t", p, o) for p, n in ((0, 60), (1, 70), (2, 9)) for o in range(n)}
    assert {(r[0], r[1], r[2]) for r in rows} == want
    assert all(bytes(r[3]) == value(r[0], r[1], r[2]) for r in rows)
    with backend.open(read_only=True) as root:  # commit(end) of every batch but the last of a run
        consumed = read_consumer_offsets(root.storage)["q1"]
    assert set(consumed) == {("t", 0), ("t", 1), ("t", 2)} and consumed[("t", 0)] == 60


def test_concurrent_queries_without_a_group_id_keep_records_of_their_own(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """As in Kafka, a query without a groupId gets a group of its own for each run: two queries
    reading the same subscription at once never overwrite each other's consumed offsets."""
    with backend.open() as root:
        root.create_topic("t", 2)
        append(root, "t", 0, 40)
        append(root, "t", 1, 40)
    opts = {"subscribe": "t", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "20"}
    queries = [
        reader(spark, backend, **opts)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / f"ck{i}"))
        .trigger(availableNow=True)
        .start()
        for i in range(2)
    ]
    for q in queries:
        q.awaitTermination(120)
        assert q.exception() is None
    with backend.open(read_only=True) as root:
        consumed = read_consumer_offsets(root.storage)
    groups = sorted(g for g in consumed if g.startswith(DEFAULT_GROUP_ID_PREFIX + "-"))
    assert len(groups) == 2, consumed  # one each, neither overwritten
    assert groups[0].rsplit("-", 1)[1] == groups[1].rsplit("-", 1)[1]  # same path and subscription
    for g in groups:  # batches 0..2 of 4 committed (Spark commits batch N when it plans N+1)
        assert set(consumed[g]) == {("t", 0), ("t", 1)} and sum(consumed[g].values()) >= 40


def test_processing_time_latest_new_partitions_and_new_topics(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """Default startingOffsets=latest; partitions added mid-stream and new topics matching the
    pattern are read from earliest (E38); Long.MAX_VALUE rate limit does not overflow (SPARK-26718)."""
    root = backend.open()
    root.create_topic("ev-a", 2)
    append(root, "ev-a", 0, 10)
    append(root, "ev-a", 1, 10)
    c = Collector()
    q = start_stream(
        spark, backend, tmp_path / "ck", c, subscribePattern="ev-.*", maxOffsetsPerTrigger=str(2**63 - 1)
    )
    try:
        q.processAllAvailable()
        assert c.rows() == []  # latest: what was there before the query started is not read
        append(root, "ev-a", 0, 3)
        q.processAllAvailable()
        assert sorted(r[2] for r in c.rows()) == [10, 11, 12]
        root.add_partitions("ev-a", 2)
        append(root, "ev-a", 3, 4)
        root.create_topic("ev-b", 1)
        append(root, "ev-b", 0, 2)
        root.create_topic("other", 1)  # does not match the pattern
        append(root, "other", 0, 2)
        q.processAllAvailable()
    finally:
        q.stop()
        root.close()
    got = {(r[0], r[1], r[2]) for r in no_duplicates(c)}
    assert got == {("ev-a", 0, 10), ("ev-a", 0, 11), ("ev-a", 0, 12)} | {("ev-a", 3, o) for o in range(4)} | {
        ("ev-b", 0, 0),
        ("ev-b", 0, 1),
    }
    assert q.exception() is None


@pytest.mark.parametrize("start", ["latest", "timestamp", "timestamp-no-match"])
def test_batch_0_replay_reads_the_same_rows(spark: Any, backend: Backend, tmp_path: Path, start: str) -> None:
    """initialOffset() is deterministic: a replay of batch 0 after a failure (new process, more
    data in the log) reads exactly the rows of the first attempt (E40, SPARK-24156)."""
    ck = tmp_path / "ck"
    with backend.open() as root:
        root.create_topic("t", 2)
        append(root, "t", 0, 30)
        append(root, "t", 1, 30)
    opts = {"subscribe": "t", "maxOffsetsPerTrigger": "10"}
    if start == "latest":
        opts["startingOffsets"] = "latest"
    elif start == "timestamp":
        opts["startingTimestamp"] = str(T0 + 12)
    else:  # no record that late: start at latest, and stay there when batch 0 is replayed
        opts.update(startingTimestamp=str(T0 + 10**6), startingOffsetsByTimestampStrategy="latest")
    c = Collector()
    run_available_now(spark, backend, ck, c, **opts)
    batch0 = c.attempts[0][0]
    forget_batch(ck, 0)  # crashed after running batch 0, before committing it
    with backend.open() as root:  # more records arrive, some with matching timestamps
        stamps = [T0 + 12] * 10 if start == "timestamp" else None
        append(root, "t", 0, 10, ts=stamps)
        append(root, "t", 1, 10, ts=stamps)
    run_available_now(spark, backend, ck, c, **opts)
    assert len(c.attempts[0]) == 2 and sorted(c.attempts[0][1]) == sorted(batch0)
    rows = no_duplicates(c)
    lo = 12 if start == "timestamp" else 30
    assert {(r[1], r[2]) for r in rows} == {(p, o) for p in (0, 1) for o in range(lo, 40)}


def test_gaps_control_records_and_batches_without_visible_records(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """E39: compaction gaps and transaction markers, including micro-batches whose whole range
    holds no visible record: empty batches, offsets advance, no hang, each record once."""
    with backend.open() as root:
        root.create_topic("t", 1)
        append_at(root, "t", 0, [0, 1, 2])
        control_batch(root, "t", 0, 3, producer_id=7, commit=True)
        append_at(root, "t", 0, [4, 20, 21, 38])
        control_batch(root, "t", 0, 39, producer_id=7, commit=False)
    c = Collector()
    run_available_now(
        spark,
        backend,
        tmp_path / "ck",
        c,
        subscribe="t",
        startingOffsets="earliest",
        maxOffsetsPerTrigger="5",
    )
    assert [r[2] for r in no_duplicates(c)] == [0, 1, 2, 4, 20, 21, 38]
    assert c.batch_sizes().count(0) >= 3  # [5,10), [10,15), [15,20), [25,30)... hold nothing visible


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_under_a_running_query(
    spark: Any, backend: Backend, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """E36: offsets removed by retention before the query read them: failOnDataLoss=true fails
    with a data-loss message; false goes on from the log start with no duplicated record."""
    root = backend.open()
    root.create_topic("t", 1, config={"segment.bytes": 500})
    append(root, "t", 0, 20, chunk=10)
    c = Collector()
    opts = {"subscribe": "t", "startingOffsets": "earliest", "failOnDataLoss": str(fail_on_data_loss).lower()}
    q = start_stream(spark, backend, tmp_path / "ck", c, **opts)
    try:
        q.processAllAvailable()
        assert len(c.rows()) == 20

        def append_and_retain() -> int:  # the query sees the new records and the retention at once
            append(root, "t", 0, 60, chunk=10, visible=False)
            lg = root.writable_log("t", 0)
            lg.delete_segments(lg.segments[:-2])  # retention passes the query's position (20)
            publish(root, "t", 0)
            return lg.log_start_offset

        first = root.transaction(append_and_retain)
        assert first > 20
        if fail_on_data_loss:
            with pytest.raises(Exception, match="are gone: the log starts at offset"):
                q.processAllAvailable()
            return
        q.processAllAvailable()
        append(root, "t", 0, 5)
        q.processAllAvailable()
    finally:
        q.stop()
        root.close()
    assert [r[2] for r in no_duplicates(c)] == list(range(20)) + list(range(first, 85))


def test_log_deleted_and_recreated_offsets_go_backwards(spark: Any, backend: Backend, tmp_path: Path) -> None:
    """E37: a log deleted and recreated so offsets go backwards is detected and fails the query."""
    with backend.open() as root:
        root.create_topic("t", 1)
        append(root, "t", 0, 30)
    c = Collector()
    q = start_stream(spark, backend, tmp_path / "ck", c, subscribe="t", startingOffsets="earliest")
    try:
        q.processAllAvailable()
        assert len(c.rows()) == 30
        with backend.open() as root:
            remove_partition(root, "t", 0)
        with backend.open() as root:  # acknowledged offsets are gone: writable only after recover
            root.recover(accept_data_loss=True)
            append(root, "t", 0, 5)
        with pytest.raises(Exception, match=r"t-0: offset was changed from 30 to [05] "):
            q.processAllAvailable()
    finally:
        q.stop()


def test_available_now_fails_when_partitions_disappear(spark: Any, backend: Backend, tmp_path: Path) -> None:
    """E38: topic-partitions that vanish during a Trigger.AvailableNow run fail it explicitly."""
    with backend.open() as root:
        root.create_topic("t", 1)
        root.create_topic("u", 1)
        append(root, "t", 0, 20)
        append(root, "u", 0, 20)
    c = Collector()

    def hook(batch_id: int, rows: Any) -> None:
        if batch_id == 0:
            with backend.open() as root:
                delete_topic(root, "u")

    c.hook = hook
    with pytest.raises(
        Exception,
        match=r"Trigger.AvailableNow: topic-partitions present when the query started are gone: u-0",
    ):
        run_available_now(
            spark,
            backend,
            tmp_path / "ck",
            c,
            subscribe="t,u",
            startingOffsets="earliest",
            maxOffsetsPerTrigger="10",
        )


def test_streaming_only_options_are_checked_when_the_query_starts(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    with backend.open() as root:
        root.create_topic("t", 1)
    with pytest.raises(
        Exception, match="option endingOffsets: ending offset not valid in streaming queries"
    ) as e:
        run_available_now(spark, backend, tmp_path / "ck", Collector(), subscribe="t", endingOffsets="latest")
    assert "UnboundLocalError" not in str(e.value)  # (PySpark's own, when streamReader() raises)


def test_a_topic_of_128_partitions_growing_to_130_is_read_exactly_once(spark: Any, tmp_path: Path) -> None:
    """A stream over a topic of 128 partitions (most of them idle), restarted after
    partitions were added and written: every record once, the new partitions from offset 0."""
    root_dir, ck = tmp_path / "root", tmp_path / "ck"
    with pylog.open(root_dir) as root:
        root.create_topic("t", 128)
        for p in (0, 5, 127):
            append(root, "t", p, 10)
    c = Collector()
    opts = {"subscribe": "t", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "7"}
    run_available_now(spark, root_dir, ck, c, **opts)
    assert sum(c.batch_sizes()) == 30
    with pylog.open(root_dir) as root:
        root.add_partitions("t", 2)
        append(root, "t", 128, 4)
        append(root, "t", 129, 3)
        append(root, "t", 5, 2)
    run_available_now(spark, root_dir, ck, c, **opts)
    rows = no_duplicates(c)
    want = {("t", p, o) for p, n in ((0, 10), (5, 12), (127, 10), (128, 4), (129, 3)) for o in range(n)}
    assert {(r[0], r[1], r[2]) for r in rows} == want
    assert all(bytes(r[3]) == value(r[0], r[1], r[2]) for r in rows)
