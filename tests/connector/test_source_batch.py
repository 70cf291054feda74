"""spark.read.format("pylog") on a real local SparkSession: schema, options, filter pushdown,
bad options at load(), and the Kafka broker fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pylog.connector.datasource import DefaultSource
from tests.conftest import Backend
from tests.connector.source_helpers import T0, append, append_at, control_batch, reader, value
from tests.kafka_fixtures import b64, expected_records, manifest_logs, require_fixtures

KAFKA_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
    "timestampType:int>"
)
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


@pytest.fixture
def events(backend: Backend) -> Backend:
    """Topics ``events`` (3 partitions: 40, 25 and 10 records) and ``other`` (1 partition, 5)."""
    with backend.open() as root:
        root.create_topic("events", 3)
        root.create_topic("other", 1)
        for p, n in enumerate((40, 25, 10)):
            append(root, "events", p, n)
        root.append(
            "other",
            pa.table(
                {
                    "key": [b"a", None, b"c", b"d", b"e"],
                    "value": [b"1", b"2", None, b"4", b"5"],
                    "timestamp": pa.array([T0 + i for i in range(5)], pa.timestamp("ms")),
                    "headers": pa.array(
                        [[{"key": "h", "value": b"x"}, {"key": "g", "value": None}], [], [], [], []], HEADERS
                    ),
                }
            ),
        )
    return backend


def collect(df: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r.topic, r.partition, r.offset, bytes(r.value) if r.value is not None else None)
        for r in df.collect()
    )


def test_schema_and_rows_are_the_kafka_sources(spark: Any, events: Backend) -> None:
    df = reader(spark, events, stream=False, subscribe="other")  # registered automatically (pyspark_pylog)
    assert df.schema.simpleString() == KAFKA_SCHEMA
    got = df.orderBy("offset").selectExpr("*", "unix_millis(timestamp) ms").collect()
    assert [(r.key, r.value, r.topic, r.partition, r.offset, r.ms, r.timestampType) for r in got] == [
        (k, v, "other", 0, i, T0 + i, 0)
        for i, (k, v) in enumerate([(b"a", b"1"), (None, b"2"), (b"c", None), (b"d", b"4"), (b"e", b"5")])
    ]
    hdf = reader(spark, events, stream=False, subscribe="other", includeHeaders="true")
    assert hdf.schema.simpleString() == KAFKA_SCHEMA[:-1] + ",headers:array<struct<key:string,value:binary>>>"
    first = hdf.orderBy("offset").first()
    assert [(h.key, h.value) for h in first.headers] == [("h", b"x"), ("g", None)]


def test_explicit_registration_works_too(spark: Any, events: Backend) -> None:
    spark.dataSource.register(DefaultSource)
    assert reader(spark, events, stream=False, subscribe="other").count() == 5


def test_subscriptions_offsets_timestamps_and_partitioning(spark: Any, events: Backend) -> None:
    everything = collect(reader(spark, events, stream=False, subscribePattern=".*"))
    assert len(everything) == 80
    assert collect(reader(spark, events, stream=False, subscribe="events,other")) == everything
    sel = reader(
        spark,
        events,
        stream=False,
        assign='{"events":[0,2]}',
        startingOffsets='{"events":{"0":5,"2":-2}}',
        endingOffsets='{"events":{"0":8,"2":-1}}',
    )
    assert collect(sel) == [("events", 0, o, value("events", 0, o)) for o in (5, 6, 7)] + [
        ("events", 2, o, value("events", 2, o)) for o in range(10)
    ]
    by_time = reader(
        spark,
        events,
        stream=False,
        subscribe="events",
        startingTimestamp=str(T0 + 20),
        startingOffsetsByTimestampStrategy="latest",  # events-2 has no record that late
        endingTimestamp=str(T0 + 30),
    )
    # events-1 ends at 25 and has no record at T0 + 30: it ends at latest, as in Kafka
    assert collect(by_time) == [
        ("events", p, o, value("events", p, o)) for p, n in ((0, 30), (1, 25)) for o in range(20, n)
    ]
    per_partition = reader(
        spark,
        events,
        stream=False,
        subscribe="events",
        startingOffsetsByTimestamp=json.dumps({"events": {"0": T0 + 38, "1": T0 + 99, "2": T0 + 99}}),
        startingOffsetsByTimestampStrategy="latest",
        endingOffsetsByTimestamp=json.dumps({"events": {"0": T0 + 39, "1": T0 + 99, "2": T0 + 99}}),
    )
    assert collect(per_partition) == [("events", 0, 38, value("events", 0, 38))]
    split = reader(
        spark, events, stream=False, subscribe="events", minPartitions="6", maxRecordsPerPartition="10"
    )
    assert split.rdd.getNumPartitions() >= 8  # 40 -> 4 tasks, 25 -> 3, 10 -> 1
    assert collect(split) == collect(reader(spark, events, stream=False, subscribe="events"))


def test_filter_pushdown_is_exact_and_narrows_the_scan(spark: Any, events: Backend) -> None:
    query = (
        "topic = 'events' and partition in (0, 1) and offset >= 10 and offset < 30 "
        "and timestamp >= timestamp'2023-11-14 14:13:20.015' "
        "and timestamp < timestamp'2023-11-14 14:13:20.0255' "
        "and value is not null"
    )
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")  # 22:13:20 UTC is 14:13:20 there
    try:
        results = {}
        for on in ("false", "true"):
            spark.conf.set("spark.sql.python.filterPushdown.enabled", on)
            df = reader(spark, events, stream=False, subscribe="events,other").filter(query)
            results[on] = (collect(df), df.rdd.getNumPartitions())
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
        spark.conf.unset("spark.sql.session.timeZone")
    rows, tasks = results["true"]
    want = [("events", p, o, value("events", p, o)) for p, n in ((0, 26), (1, 25)) for o in range(15, n)]
    assert rows == results["false"][0] == want
    assert tasks == 2 and results["false"][1] == 4  # pushdown kept 2 of the 4 topic-partitions


def test_fail_on_data_loss_in_batch(spark: Any, backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", 1, config={"segment.bytes": 500})
        append(root, "t", 0, 60, chunk=10)

        def retain() -> int:
            lg = root.writable_log("t", 0)
            lg.delete_segments(lg.segments[:2])
            return lg.log_start_offset

        first = root.transaction(retain)
    df = reader(spark, backend, stream=False, subscribe="t", startingOffsets='{"t":{"0":0}}')
    with pytest.raises(Exception, match="are gone: the log starts at offset"):
        df.collect()
    lenient = reader(
        spark, backend, stream=False, subscribe="t", startingOffsets='{"t":{"0":0}}', failOnDataLoss="false"
    )
    assert [r.offset for r in lenient.orderBy("offset").collect()] == list(range(first, 60))
    assert reader(spark, backend, stream=False, subscribe="t").count() == 60 - first  # earliest = log start


def test_gaps_and_control_records_in_batch(spark: Any, backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", 1)
        append_at(root, "t", 0, [0, 1, 5, 9])
        control_batch(root, "t", 0, 10, producer_id=3, commit=True)
        append_at(root, "t", 0, [20])
    df = reader(spark, backend, stream=False, subscribe="t", minPartitions="4")
    assert [r.offset for r in df.orderBy("offset").collect()] == [0, 1, 5, 9, 20]


def test_read_committed_in_batch(spark: Any, backend: Backend) -> None:
    from pylog.storage.codec import records

    with backend.open() as root:
        root.create_topic("t", 1)
        append_at(root, "t", 0, [0])
        enc = records.encode(
            pa.array([b"aborted"]), base_offset=1, is_transactional=True, producer_id=4, producer_epoch=0
        )

        def aborted() -> None:  # the aborted batch and its marker (made visible by the marker)
            root.writable_log("t", 0).append_batches(enc.tobytes(), assign_offsets=False)
            control_batch(root, "t", 0, 2, producer_id=4, commit=False)

        root.transaction(aborted)
        append_at(root, "t", 0, [3])
    committed = reader(spark, backend, stream=False, subscribe="t", isolationLevel="read_committed")
    assert [r.offset for r in committed.collect()] == [0, 3]
    kafka_name = reader(
        spark, backend, stream=False, subscribe="t", **{"kafka.isolation.level": "read_committed"}
    )
    assert kafka_name.count() == 2
    assert reader(spark, backend, stream=False, subscribe="t").count() == 3


BAD_AT_LOAD = [
    ({"subscribe": None}, "one of the options assign, subscribe, subscribePattern must be given"),
    ({"assign": '{"t":[0]}'}, "only one of the options assign, subscribe, subscribePattern"),
    ({"minPartitions": "0"}, "option minPartitions: '0' is not valid; valid values: a positive integer"),
    ({"startingoffset": "earliest"}, "unknown option 'startingoffset'"),
    ({"minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "3"}, "minOffsetsPerTrigger .9. is higher than"),
]
# a missing root is no error at load(): a stream waits for it, a batch read fails when planned
# (test_source_missing_root.py)


def test_bad_options_fail_at_load(spark: Any, tmp_path: Path) -> None:
    """Checklist D31: the error surfaces at load(), for batch and streaming reads, naming the
    option and the valid values (every case is in test_source_options.py; these show the path
    through Spark)."""
    for i, (options, message) in enumerate(BAD_AT_LOAD):
        opts = {"path": str(tmp_path), "subscribe": "t", **options}
        r = spark.readStream if i % 2 else spark.read
        with pytest.raises(Exception, match=message):
            r.format("pylog").options(**{k: v for k, v in opts.items() if v is not None}).load()


def test_mode_specific_options_fail_when_the_query_is_planned(spark: Any, events: Backend) -> None:
    """A Python data source is not told at load() whether it is read as a batch or a stream."""
    with pytest.raises(Exception, match="starting offset can't be latest for batch queries"):
        reader(spark, events, stream=False, subscribe="events", startingOffsets="latest").collect()
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("pylog").schema("value binary").options(**events.spark_options()).option(
            "subscribe", "events"
        ).load().collect()


FIXTURES = [e for e in manifest_logs() if not e["expected_corrupt"]]
CORRUPT = [e for e in manifest_logs() if e["expected_corrupt"]]


def _broker_dir(root: Path, entry: dict[str, Any], topic: str | None = None) -> str:
    """Lay a fixture out in ``root`` as a Kafka log dir ``<topic>-<partition>/<base offset>.log``
    (copied at test time, never into the repository); returns the topic name used."""
    src = require_fixtures() / entry["log"]
    topic = topic or entry["topic"]
    part = root / f"{topic}-{entry['partition']}"
    part.mkdir(parents=True)
    shutil.copy(src, part / src.name)
    return topic


def test_kafka_broker_fixtures(spark: Any, tmp_path: Path) -> None:
    """Acceptance 2: every broker-written fixture (legacy and v2, compressed) gives exactly its
    expected records through spark.read.format("pylog"); a root without pylog metadata takes
    its topics from the directory names.  One root holds them all, each under its own topic."""
    require_fixtures()
    topics = {_broker_dir(tmp_path, e, f"f{i}-{e['topic']}"): e for i, e in enumerate(FIXTURES)}
    df = reader(spark, tmp_path, stream=False, subscribePattern="f[0-9]+-.*", includeHeaders="true")
    got: dict[str, list[Any]] = {t: [] for t in topics}
    for r in df.selectExpr(
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "unix_millis(timestamp) ts",
        "timestampType",
        "headers",
    ).collect():
        got[r.topic].append(r)
    for topic, entry in topics.items():
        rows = sorted(got[topic], key=lambda r: r.offset)
        exp = expected_records(entry)
        where = entry["log"]
        assert [r.offset for r in rows] == [e["offset"] for e in exp], where
        assert [r.key for r in rows] == [b64(e["key_b64"]) for e in exp], where
        assert [r.value for r in rows] == [b64(e["value_b64"]) for e in exp], where
        assert [r.ts for r in rows] == [e["timestamp"] for e in exp], where
        assert [r.timestampType for r in rows] == [e["timestamp_type"] for e in exp], where
        assert [[(h.key, h.value) for h in r.headers] for r in rows] == [
            [(k, b64(v)) for k, v in e["headers"]] for e in exp
        ], where
        assert {r.partition for r in rows} <= {entry["partition"]}, where


def test_kafka_fixture_with_a_bad_crc_fails_clearly(spark: Any, tmp_path: Path) -> None:
    require_fixtures()
    if not CORRUPT:
        pytest.skip("the fixture set has no corrupt log")
    for i, entry in enumerate(CORRUPT):
        topic = _broker_dir(tmp_path / str(i), entry)
        with pytest.raises(Exception, match="CRC"):
            reader(spark, tmp_path / str(i), stream=False, subscribe=topic).collect()
