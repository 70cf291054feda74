"""The driver's half of the source without Spark: rate limiting, range splitting, resolving
starting offsets deterministically, the stream reader's offsets, and filter folding."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

import pylog
from pylog.connector.offsets import (
    DataLossError,
    OffsetRange,
    RootView,
    from_json,
    rate_limit,
    resolve,
    split_ranges,
    to_json,
)
from pylog.connector.options import parse_options
from pylog.connector.pushdown import Bounds, push_filters
from pylog.connector.source import plan_batch
from pylog.connector.stream import StreamReader
from pylog.storage.errors import SourceOptionError
from pylog.storage.root.consumers import consumer_lag, read_consumer_offsets
from tests.conftest import Backend
from tests.connector.source_helpers import T0, append, delete_topic

# ============================================================================ admission control


def test_rate_limit_is_proportional_to_backlog_as_in_kafka() -> None:
    start = {("a", 0): 0, ("b", 0): 0, ("c", 0): 0}
    until = {("a", 0): 100, ("b", 0): 10, ("c", 0): 1}
    # 10 * 100/111 = 9.0 -> 9; 10 * 10/111 = 0.9 -> ceil 1 (small partitions are not starved)
    assert rate_limit(10, start, until) == {("a", 0): 9, ("b", 0): 1, ("c", 0): 1}
    assert rate_limit(1000, start, until) == until
    # SPARK-26718: Long.MAX_VALUE must not overflow
    assert rate_limit(2**63 - 1, {("a", 0): 2**62}, {("a", 0): 2**62 + 5}) == {("a", 0): 2**62 + 5}
    # partitions with nothing new (or going backwards) keep their latest offset
    assert rate_limit(5, {("a", 0): 10, ("b", 0): 7}, {("a", 0): 10, ("b", 0): 3}) == {
        ("a", 0): 10,
        ("b", 0): 3,
    }


def r(t: str, s: int, e: int) -> OffsetRange:
    return OffsetRange(t, 1, s, e)


def spans(ranges: list[OffsetRange]) -> list[tuple[str, int, int]]:
    return [(x.topic, x.start, x.end) for x in ranges]


@pytest.mark.parametrize(
    ("min_partitions", "given", "expected"),
    [  # the cases of Spark's KafkaOffsetRangeCalculatorSuite
        (None, [r("t1", 1, 2), r("t2", 1, 1)], [("t1", 1, 2)]),
        (3, [r("t1", 1, 2), r("t2", 1, 2), r("t3", 1, 2)], [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)]),
        (4, [r("t1", 1, 5)], [("t1", 1, 2), ("t1", 2, 3), ("t1", 3, 4), ("t1", 4, 5)]),
        (4, [r("t1", 1, 5), r("t2", 1, 21)], [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
        (4, [r("t1", 1, 1), r("t2", 1, 21)], [("t2", 1, 6), ("t2", 6, 11), ("t2", 11, 16), ("t2", 16, 21)]),
        (
            4,
            [r("t1", 1, 2), r("t2", 1, 1001)],
            [("t1", 1, 2), ("t2", 1, 334), ("t2", 334, 667), ("t2", 667, 1001)],
        ),
        (1, [r("t1", 1, 5), r("t2", 1, 21)], [("t1", 1, 5), ("t2", 1, 21)]),
        (3, [r("t1", 1, 11)], [("t1", 1, 4), ("t1", 4, 7), ("t1", 7, 11)]),
        (
            6,
            [r("t1", 0, 10), r("t2", 0, 10), r("t3", 0, 1)],
            [
                ("t1", 0, 3),
                ("t1", 3, 6),
                ("t1", 6, 10),
                ("t2", 0, 3),
                ("t2", 3, 6),
                ("t2", 6, 10),
                ("t3", 0, 1),
            ],
        ),
        (
            6,
            [r("t1", 0, 500), r("t2", 0, 12000), r("t3", 0, 15001)],
            [
                ("t1", 0, 500),
                ("t2", 0, 6000),
                ("t2", 6000, 12000),
                ("t3", 0, 5000),
                ("t3", 5000, 10000),
                ("t3", 10000, 15001),
            ],
        ),
    ],
)
def test_min_partitions_splits_like_kafka(
    min_partitions: int | None, given: list[OffsetRange], expected: list[tuple[str, int, int]]
) -> None:
    assert spans(split_ranges(given, min_partitions, None)) == expected


def test_max_records_per_partition() -> None:
    assert spans(split_ranges([r("a", 0, 10), r("b", 0, 3)], None, 4)) == [
        ("a", 0, 3), ("a", 3, 6), ("a", 6, 10), ("b", 0, 3)
    ]  # fmt: skip
    # then minPartitions on top: every offset is still covered exactly once
    out = split_ranges([r("a", 0, 10), r("b", 0, 3)], 8, 4)
    assert len(out) >= 8 and sorted((x.topic, o) for x in out for o in range(x.start, x.end)) == sorted(
        [("a", o) for o in range(10)] + [("b", o) for o in range(3)]
    )


# ============================================================================ resolution


@pytest.fixture
def root(backend: Backend) -> Iterator[pylog.Root]:
    """A writer on the test's root (``backend``): topic t, partitions of 50 and 20 records."""
    rt = backend.open()
    rt.create_topic("t", partitions=2)
    append(rt, "t", 0, 50)
    append(rt, "t", 1, 20)
    yield rt
    rt.close()


def test_offsets_json_is_sorted_and_round_trips() -> None:
    doc = to_json({("b", 10): 5, ("a", 2): 1, ("b", 9): "timestamp:7"})
    assert json.dumps(doc) == '{"a": {"2": 1}, "b": {"9": "timestamp:7", "10": 5}}'
    assert from_json(json.dumps(doc)) == {("a", 2): 1, ("b", 9): "timestamp:7", ("b", 10): 5}


def test_bounded_resolution_does_not_drift(root: pylog.Root, backend: Backend) -> None:
    view = RootView(backend.url, backend.options)
    ts = f"timestamp:{T0 + 45}"
    assert resolve(view, ("t", 0), -1) == 50 and resolve(view, ("t", 0), -2) == 0
    assert resolve(view, ("t", 0), ts) == 45
    # more data arrives (also with matching timestamps); against the batch end 50 nothing moves
    append(root, "t", 0, 30, ts=[T0] * 30)
    view.refresh()
    assert resolve(view, ("t", 0), -1) == 80 and resolve(view, ("t", 0), -1, bound=50) == 50
    assert resolve(view, ("t", 0), ts, bound=50) == 45
    # a timestamp after every record: strategy error fails, latest takes the log end; bounded: the end
    late = f"timestamp:{T0 + 10**6}"
    with pytest.raises(SourceOptionError, match=r"no offset matched .* t-0 and timestamp"):
        resolve(view, ("t", 0), late)
    assert resolve(view, ("t", 0), late, strategy="latest") == 80
    assert resolve(view, ("t", 0), late, bound=50) == 50


def test_timestamp_lookup_sees_the_unindexed_tail_of_a_live_log(root: pylog.Root, backend: Backend) -> None:
    """A reader beside a live writer: the newest records are not in the time index yet."""
    append(root, "t", 1, 3, ts=[T0 + 10**6] * 3)  # the writer keeps the root open
    view = RootView(backend.url, backend.options)
    assert resolve(view, ("t", 1), f"timestamp:{T0 + 10**6}") == 20


# ============================================================================ the stream reader


def stream(backend: Backend, **kw: str) -> StreamReader:
    o = {**backend.spark_options(), "subscribe": "t", **kw}
    return StreamReader(parse_options({k.lower(): v for k, v in o.items()}).for_stream())


def ranges_of(reader: StreamReader, start: dict, end: dict) -> list[tuple[str, int, int, int]]:
    return [
        (p.value.topic, p.value.partition, p.value.start, p.value.end) for p in reader.partitions(start, end)
    ]


def test_a_starting_offset_beyond_the_log_end_is_reported_naming_the_option(
    root: pylog.Root, backend: Backend
) -> None:
    with pytest.raises(
        DataLossError, match=r"option startingOffsets: t-0 was 999 but its log ends at offset 50"
    ):
        stream(backend, startingOffsets='{"t":{"0":999,"1":-2}}').initialOffset()
    assert stream(
        backend, startingOffsets='{"t":{"0":999,"1":-2}}', failOnDataLoss="false"
    ).initialOffset() == {"t": {"0": 999, "1": -2}}


def test_initial_offset_is_the_same_on_every_call_and_run(root: pylog.Root, backend: Backend) -> None:
    for kw, initial in [
        ({}, {"t": {"0": -1, "1": -1}}),
        ({"startingOffsets": "earliest"}, {"t": {"0": -2, "1": -2}}),
        (
            {"startingTimestamp": str(T0 + 10)},
            {"t": {"0": f"timestamp:{T0 + 10}", "1": f"timestamp:{T0 + 10}"}},
        ),
        ({"startingOffsets": '{"t":{"0":3,"1":-2}}'}, {"t": {"0": 3, "1": -2}}),
    ]:
        first = stream(backend, **kw)
        start = first.initialOffset()
        assert start == initial and first.initialOffset() == start
        end = first.latestOffset(start, ReadMaxRows(10))
        planned = ranges_of(first, start, end)
        append(root, "t", 0, 5, ts=[T0 + 11] * 5)  # data arrives before batch 0 is replayed
        replay = stream(backend, **kw)  # a new process: Spark asks initialOffset() again
        assert replay.initialOffset() == start
        assert ranges_of(replay, replay.initialOffset(), end) == planned


def test_latest_offset_rate_limits_and_plans_new_partitions_from_zero(
    root: pylog.Root, backend: Backend
) -> None:
    rd = stream(backend, startingOffsets="earliest", maxOffsetsPerTrigger="7", minPartitions="3")
    assert rd.getDefaultReadLimit() == ReadMaxRows(7)
    start = rd.initialOffset()
    end = rd.latestOffset(start, ReadMaxRows(7))
    assert end == {"t": {"0": 5, "1": 2}}  # 7 * 50/70 = 5, 7 * 20/70 = 2
    assert rd.reportLatestOffset() == {"t": {"0": 50, "1": 20}}
    assert sum(e - s for *_, s, e in ranges_of(rd, start, end)) == 7 and len(rd.partitions(start, end)) == 3
    assert rd.latestOffset(end, ReadAllAvailable()) == {"t": {"0": 50, "1": 20}}
    root.add_partitions("t", 1)
    append(root, "t", 2, 4)
    end2 = rd.latestOffset({"t": {"0": 50, "1": 20}}, ReadAllAvailable())
    assert end2 == {"t": {"0": 50, "1": 20, "2": 4}}
    assert ranges_of(rd, {"t": {"0": 50, "1": 20}}, end2) == [("t", 2, 0, 1), ("t", 2, 1, 2), ("t", 2, 2, 4)]


def test_min_offsets_per_trigger_waits_for_enough_data(root: pylog.Root, backend: Backend) -> None:
    rd = stream(backend, minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    assert rd.getDefaultReadLimit() == ReadMinRows(10)
    start = rd.initialOffset()
    pinned = rd.latestOffset(start, ReadMinRows(10))  # batch 0 of a fresh query is never delayed
    assert pinned == {"t": {"0": 50, "1": 20}}
    append(root, "t", 0, 4)
    assert rd.latestOffset(pinned, ReadMinRows(10)) == pinned  # 4 < 10: skip this trigger
    append(root, "t", 1, 6)
    assert rd.latestOffset(pinned, ReadMinRows(10)) == {"t": {"0": 54, "1": 26}}
    append(root, "t", 0, 1)
    impatient = stream(backend, minOffsetsPerTrigger="10", maxTriggerDelay="0ms")
    impatient.latestOffset(impatient.initialOffset(), ReadMinRows(10))
    assert impatient.latestOffset(pinned, ReadMinRows(10)) == {"t": {"0": 55, "1": 26}}  # delay passed


def test_available_now_stops_at_the_target_and_fails_if_partitions_vanish(
    root: pylog.Root, backend: Backend
) -> None:
    rd = stream(backend, startingOffsets="earliest")
    rd.prepareForTriggerAvailableNow()
    append(root, "t", 0, 10)
    assert rd.latestOffset(rd.initialOffset(), ReadAllAvailable()) == {"t": {"0": 50, "1": 20}}
    root.close()
    with backend.open() as writer:
        delete_topic(writer, "t")
    with pytest.raises(Exception, match=r"Trigger.AvailableNow: .* gone: t-0, t-1"):
        rd.latestOffset({"t": {"0": 50, "1": 20}}, ReadAllAvailable())


def test_offsets_going_backwards_and_vanished_partitions_are_data_loss(
    root: pylog.Root, backend: Backend
) -> None:
    rd = stream(backend, startingOffsets="earliest")
    with pytest.raises(DataLossError, match="t-0: offset was changed from 60 to 50"):
        rd.partitions({"t": {"0": 60, "1": 0}}, {"t": {"0": 50, "1": 20}})
    with pytest.raises(DataLossError, match="topic-partitions t-1 are gone"):
        rd.partitions({"t": {"0": 0, "1": 0}}, {"t": {"0": 50}})
    lenient = stream(backend, startingOffsets="earliest", failOnDataLoss="false")
    assert ranges_of(lenient, {"t": {"0": 60, "1": 0}}, {"t": {"0": 50, "1": 20}}) == [("t", 1, 0, 20)]


def test_commit_records_consumed_offsets_for_describe(root: pylog.Root, backend: Backend) -> None:
    rd = stream(backend, groupId="dash")
    rd.initialOffset()
    rd.commit({"t": {"0": 30, "1": 20}})
    consumed = read_consumer_offsets(root.storage)
    assert consumed == {"dash": {("t", 0): 30, ("t", 1): 20}}
    assert consumer_lag(consumed["dash"], {("t", 0): 50, ("t", 1): 20, ("t", 2): 3}) == {
        ("t", 0): 20, ("t", 1): 0, ("t", 2): 3
    }  # fmt: skip
    with backend.open(read_only=True) as r:
        assert sorted(r.topics()) == ["t"]  # not a topic
    rd.stop()


# ============================================================================ batch planning and pushdown


def test_batch_ranges_and_starting_ending_options(root: pylog.Root, backend: Backend) -> None:
    def plan(**kw: str) -> list[tuple[int, int, int]]:
        o = parse_options({k.lower(): v for k, v in {**backend.spark_options(), **kw}.items()}).for_batch()
        return [(t.partition, t.start, t.end) for t in plan_batch(o)]

    assert plan(subscribe="t") == [(0, 0, 50), (1, 0, 20)]
    assert plan(assign='{"t":[1]}', startingOffsets='{"t":{"1":5}}', endingOffsets='{"t":{"1":-1}}') == [
        (1, 5, 20)
    ]
    assert plan(subscribePattern="t.*", startingTimestamp=str(T0 + 10), endingTimestamp=str(T0 + 40)) == [
        (0, 10, 40), (1, 10, 20)
    ]  # fmt: skip
    assert plan(subscribe="t", startingOffsetsByTimestamp=json.dumps({"t": {"0": T0 + 48, "1": T0}})) == [
        (0, 48, 50), (1, 0, 20)
    ]  # fmt: skip
    assert len(plan(subscribe="t", minPartitions="5")) == 5
    with pytest.raises(SourceOptionError, match="must give every topic-partition of subscribe=t"):
        plan(subscribe="t", startingOffsets='{"t":{"0":1}}')
    with pytest.raises(Exception, match=r"option assign: topic-partitions that do not exist .* t-7"):
        plan(assign='{"t":[7]}')
    with pytest.raises(Exception, match="beginning offset 30 is after the ending offset 10 for t-0"):
        plan(assign='{"t":[0]}', startingOffsets='{"t":{"0":30}}', endingOffsets='{"t":{"0":10}}')
    with pytest.raises(SourceOptionError, match=r"missing: t-1; not in the subscription .*: t-9"):
        plan(subscribe="t", startingOffsets='{"t":{"0":1,"9":0}}')
    # offsets the logs have not reached: reported on the driver, naming the option (Kafka's
    # fetchSpecificOffsets check), not as a truncated log inside a task
    with pytest.raises(
        DataLossError, match=r"option endingOffsets: t-0 was 999 but its log ends at offset 50"
    ):
        plan(assign='{"t":[0]}', endingOffsets='{"t":{"0":999}}')
    with pytest.raises(
        DataLossError, match=r"option startingOffsets: t-1 was 25 but its log ends at offset 20"
    ):
        plan(assign='{"t":[1]}', startingOffsets='{"t":{"1":25}}')
    # with failOnDataLoss=false the read goes on, to the end of the log (nothing from a start past it)
    assert plan(assign='{"t":[0]}', endingOffsets='{"t":{"0":999}}', failOnDataLoss="false") == [(0, 0, 50)]
    lenient = {
        "startingOffsets": '{"t":{"0":60}}',
        "endingOffsets": '{"t":{"0":70}}',
        "failOnDataLoss": "false",
    }
    assert [(p, s, e) for p, s, e in plan(assign='{"t":[0]}', **lenient) if e > s] == []
    # a partition a pushed-down filter leaves out is not checked
    o = parse_options(
        {
            k.lower(): v
            for k, v in {
                **backend.spark_options(),
                "subscribe": "t",
                "endingOffsets": '{"t":{"0":999,"1":-1}}',
            }.items()
        }
    ).for_batch()
    assert [(t.partition, t.start, t.end) for t in plan_batch(o, Bounds(partition_lo=1))] == [(1, 0, 20)]


def test_subscribing_to_a_topic_that_does_not_exist_reads_nothing_and_says_so(
    root: pylog.Root, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """As in Kafka, nothing is read from a topic that does not exist (it may be created later);
    the driver logs it once, with the closest existing name (a typo is the usual cause)."""
    o = parse_options({k.lower(): v for k, v in {**backend.spark_options(), "subscribe": "tt,t"}.items()})
    with caplog.at_level("WARNING", logger="pylog.connector"):
        assert {t.topic for t in plan_batch(o.for_batch())} == {"t"}
        plan_batch(o.for_batch())
    said = [r.getMessage() for r in caplog.records if "no topic tt" in r.getMessage()]
    assert len(said) == 1 and "did you mean t for tt?" in said[0], said


def test_filters_fold_into_bounds_exactly() -> None:
    utc = dt.timezone.utc
    ts = dt.datetime.fromtimestamp((T0 + 5) / 1000, utc)
    filters = [
        IsNotNull(("offset",)),
        EqualTo(("topic",), "t"),
        In(("partition",), (0, 1, 5)),
        GreaterThanOrEqual(("offset",), 10),
        LessThan(("offset",), 40),
        In(("offset",), (12, 30)),  # narrows the scan, but Spark must still pick the offsets
        GreaterThan(("timestamp",), ts),
        LessThanOrEqual(("timestamp",), ts + dt.timedelta(microseconds=10_500)),
        EqualTo(("key",), b"k"),  # not ours
        StringStartsWith(("topic",), "t"),
    ]
    bounds, rest = push_filters(Bounds(), filters)
    assert rest == [filters[5], filters[8]]
    assert bounds.allows("t", 1) and not bounds.allows("t", 2) and not bounds.allows("u", 0)
    assert (bounds.offset_lo, bounds.offset_hi) == (12, 31) and bounds.offsets(0, 100) == (12, 31)
    assert (bounds.timestamp_lo, bounds.timestamp_hi) == (T0 + 6, T0 + 16)  # > 5 ms, <= 15.5 ms
    # a naive datetime is UTC; an equality at sub-millisecond precision matches nothing
    b2, _ = push_filters(
        Bounds(), [EqualTo(("timestamp",), ts.replace(tzinfo=None) + dt.timedelta(microseconds=1))]
    )
    assert b2.timestamp_lo == b2.timestamp_hi


def test_pushed_timestamp_bounds_use_the_time_index(root: pylog.Root, backend: Backend) -> None:
    o = parse_options({**backend.spark_options(), "subscribe": "t"}).for_batch()
    tasks = plan_batch(o, Bounds(timestamp_lo=T0 + 15, partition_lo=1))
    assert [(t.partition, t.start, t.end, t.min_timestamp) for t in tasks] == [(1, 15, 20, T0 + 15)]


def test_min_offsets_timer_starts_at_zero_and_restarts_only_when_a_batch_runs(
    root: pylog.Root, backend: Backend
) -> None:
    """Kafka's ``delayBatch``: a restarted query's first trigger is not delayed (the timer
    starts at 0); afterwards the delay counts from the last batch that ran, and a trigger that
    finds nothing new does not restart it."""
    pinned = {"t": {"0": 50, "1": 20}}
    append(root, "t", 0, 4)
    restarted = stream(backend, minOffsetsPerTrigger="10", maxTriggerDelay="300ms")
    first = restarted.latestOffset(pinned, ReadMinRows(10))
    assert first == {"t": {"0": 54, "1": 20}}  # 4 < 10, but the first trigger fires
    append(root, "t", 1, 2)
    assert restarted.latestOffset(first, ReadMinRows(10)) == first  # 2 < 10 within the delay
    time.sleep(0.35)
    second = restarted.latestOffset(first, ReadMinRows(10))
    assert second == {"t": {"0": 54, "1": 22}}  # the delay passed: the 2 records run
    time.sleep(0.35)
    assert restarted.latestOffset(second, ReadMinRows(10)) == second  # nothing new: no batch
    append(root, "t", 0, 1)
    # the delay counts from the last batch (0.35 s ago), not from the empty trigger
    assert restarted.latestOffset(second, ReadMinRows(10)) == {"t": {"0": 55, "1": 22}}


def test_a_new_partition_whose_log_does_not_start_at_zero_is_data_loss_on_the_driver(
    root: pylog.Root, backend: Backend
) -> None:
    """Kafka reads an added partition from offset 0; when retention removed its first records
    before the query saw it, the driver says so (failOnDataLoss) and names the cause."""
    root.add_partitions("t", 1)
    append(root, "t", 2, 5)
    root.writable_log("t", 2).roll()
    append(root, "t", 2, 5)

    def retain() -> None:  # retention removes the first segment (one commit on an object store)
        lg = root.writable_log("t", 2)
        lg.delete_segments([lg.segments[0]])
        root.checkpoint()

    root.transaction(retain)
    pinned = {"t": {"0": 50, "1": 20}}
    rd = stream(backend)
    end = rd.latestOffset(pinned, ReadAllAvailable())
    assert end == {"t": {"0": 50, "1": 20, "2": 10}}
    with pytest.raises(DataLossError, match=r"Added partition t-2 starts from 5 instead of 0"):
        rd.partitions(pinned, end)
    lenient = stream(backend, failOnDataLoss="false")
    assert ranges_of(lenient, pinned, lenient.latestOffset(pinned, ReadAllAvailable())) == [("t", 2, 5, 10)]


def test_a_partition_deleted_before_the_first_batch_is_planned_is_data_loss(
    root: pylog.Root, backend: Backend
) -> None:
    rd = stream(backend, subscribe="t,u", startingOffsets="earliest")
    root.create_topic("u", partitions=1)
    append(root, "u", 0, 3)
    start = rd.initialOffset()
    assert start == {"t": {"0": -2, "1": -2}, "u": {"0": -2}}
    root.close()
    with backend.open() as writer:
        delete_topic(writer, "u")
    end = rd.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 50, "1": 20}}
    with pytest.raises(DataLossError, match=r"u-0 were deleted before the query's first batch was planned"):
        rd.partitions(start, end)


@pytest.mark.subprocess
def test_planning_a_read_imports_no_compiled_kernels(tmp_path: Path) -> None:
    """Spark starts a driver-side Python process for each query's planning: importing the
    connector and resolving a stream's earliest and latest offsets load no numba (about a
    second at each query start); nor does decoding a few records (the interpreted kernels)."""
    with pylog.open(tmp_path / "r") as root:
        root.create_topic("t", 2)
        root.append("t", pa.table({"key": [b"k"], "value": [b"v"]}), partition=1)
    code = textwrap.dedent(
        f"""
        import os
        import sys
        from pyspark.sql.datasource import ReadAllAvailable
        from pylog.connector.datasource import DefaultSource, spark_schema
        opts = {{"path": {str(tmp_path / "r")!r}, "subscribe": "t", "startingOffsets": "earliest"}}
        ds = DefaultSource(opts)
        reader = ds.streamReader(spark_schema(False))
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        parts = reader.partitions(start, end)
        assert "numba" not in sys.modules, "planning imported numba"
        rows = sum(b.num_rows for p in parts for b in reader.read(p))
        assert rows == 1, rows
        assert "numba" not in sys.modules, "decoding one record imported numba"
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
