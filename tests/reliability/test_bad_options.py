"""Bad options and schemas, table-driven (TESTING.md D31, D32; DESIGN.md §6.7): every source and
sink option with invalid values, and wrong sink schemas, give a clear error naming the option
or column - before any byte is written.  No Spark session: the parsers and the sink's
``make_writer`` (which Spark calls at ``start()``/``save()``) are called directly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from pylog.connector import sink
from pylog.connector.options import OPTIONS, parse_options
from pylog.connector.sink_options import SINK_OPTIONS
from pylog.storage.config import LogConfig
from pylog.storage.errors import ConfigError, SinkSchemaError, SourceOptionError

# ============================================================================ source

SOURCE_BAD: list[tuple[str, dict[str, str | None], str]] = [
    # (option, changes to a valid set, expected message fragment)
    ("path", {"path": None}, "option path is required"),
    ("path", {"path": "  "}, "option path is required"),
    ("subscribe", {"subscribe": ""}, "option subscribe: no topics"),
    ("subscribe", {"subscribe": ", ,"}, "option subscribe: no topics"),
    ("subscribe", {"subscribe": "a/b"}, "option subscribe: topic name 'a/b' is illegal"),
    ("subscribe", {"subscribe": "x" * 250}, "option subscribe"),
    (
        "subscribe",
        {"subscribe": None},
        "one of the options assign, subscribe, subscribePattern must be given",
    ),
    ("subscribe", {"subscribePattern": "e.*"}, "only one of the options"),
    ("subscribePattern", {"subscribe": None, "subscribePattern": " "}, "option subscribePattern"),
    ("subscribePattern", {"subscribe": None, "subscribePattern": "(("}, "not a valid regular expression"),
    ("assign", {"subscribe": None, "assign": "[1]"}, "option assign"),
    ("assign", {"subscribe": None, "assign": '{"a":[true]}'}, "option assign: partitions of topic 'a'"),
    ("assign", {"subscribe": None, "assign": '{"..":[0]}'}, "option assign: topic name '..'"),
    ("startingOffsets", {"startingOffsets": "middle"}, "option startingOffsets"),
    ("startingOffsets", {"startingOffsets": '{"e":{"0":1.5}}'}, "option startingOffsets"),
    ("startingOffsets", {"startingOffsets": '{"e":{"-1":0}}'}, "option startingOffsets: partition '-1'"),
    ("startingOffsets", {"startingOffsets": '{"e":{"0":9223372036854775808}}'}, "64-bit integer"),
    ("endingOffsets", {"endingOffsets": "earliest-ish"}, "option endingOffsets"),
    ("endingOffsets", {"endingOffsets": '{"e":{"0":-7}}'}, "option endingOffsets"),
    ("startingTimestamp", {"startingTimestamp": "1e12"}, "option startingTimestamp"),
    ("startingTimestamp", {"startingTimestamp": "99999999999999999999"}, "option startingTimestamp"),
    ("startingOffsetsByTimestamp", {"startingOffsetsByTimestamp": "{}"}, "option startingOffsetsByTimestamp"),
    (
        "startingOffsetsByTimestamp",
        {"startingOffsetsByTimestamp": "nope"},
        "option startingOffsetsByTimestamp",
    ),
    ("startingOffsetsByTimestampStrategy", {"startingOffsetsByTimestampStrategy": "x"}, "error, latest"),
    ("endingTimestamp", {"endingTimestamp": "-1"}, "option endingTimestamp"),
    (
        "endingOffsetsByTimestamp",
        {"endingOffsetsByTimestamp": '{"e":{"0":-2}}'},
        "option endingOffsetsByTimestamp",
    ),
    ("failOnDataLoss", {"failOnDataLoss": "1"}, "option failOnDataLoss"),
    ("maxOffsetsPerTrigger", {"maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger"),
    ("maxOffsetsPerTrigger", {"maxOffsetsPerTrigger": "1.5"}, "option maxOffsetsPerTrigger"),
    ("minOffsetsPerTrigger", {"minOffsetsPerTrigger": "-3"}, "option minOffsetsPerTrigger"),
    ("minOffsetsPerTrigger", {"minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "8"}, "is higher than"),
    ("maxTriggerDelay", {"maxTriggerDelay": "-5s"}, "option maxTriggerDelay"),
    ("maxTriggerDelay", {"maxTriggerDelay": "5 parsecs"}, "option maxTriggerDelay"),
    ("minPartitions", {"minPartitions": "a"}, "option minPartitions"),
    ("minPartitions", {"minPartitions": "0"}, "option minPartitions"),
    ("minPartitions", {"minPartitions": "-1"}, "option minPartitions"),
    ("minPartitions", {"minPartitions": "1.0"}, "option minPartitions"),
    ("maxRecordsPerPartition", {"maxRecordsPerPartition": "many"}, "option maxRecordsPerPartition"),
    ("includeHeaders", {"includeHeaders": "yes"}, "option includeHeaders"),
    ("isolationLevel", {"isolationLevel": "serializable"}, "option isolationLevel"),
    ("groupId", {"groupId": "a b"}, "option groupId"),
    ("groupIdPrefix", {"groupIdPrefix": "a/b"}, "option groupIdPrefix"),
    ("unknown", {"bootstrapServers": "x"}, "unknown option"),
    ("unknown", {"kafka.bootstrap.servers": "h:9092"}, "replace kafka.bootstrap.servers"),
    ("unknown", {"kafka.auto.offset.reset": "earliest"}, "auto.offset.reset' is not supported"),
    ("unknown", {"kafka.value.deserializer": "x"}, "value.deserializer' is not supported"),
    ("unknown", {"kafka.group.id": "g1", "groupId": "g2"}, "given twice with different values"),
]
# options that accept any value, by design: they have no effect on pylog (kept for Kafka jobs)
SOURCE_ANY_VALUE = {"kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs"}
# checks that depend on the kind of query: run when Spark creates the reader
SOURCE_MODE_BAD: list[tuple[dict[str, str], str, str]] = [
    ({"endingOffsets": "latest"}, "stream", "option endingOffsets: ending offset not valid in streaming"),
    ({"endingTimestamp": "5"}, "stream", "option endingTimestamp"),
    ({"endingOffsetsByTimestamp": '{"e":{"0":5}}'}, "stream", "option endingOffsetsByTimestamp"),
    ({"startingOffsets": "latest"}, "batch", "starting offset can't be latest for batch"),
    ({"startingOffsets": '{"e":{"0":-1}}'}, "batch", "can't be latest (-1)"),
    ({"endingOffsets": "earliest"}, "batch", "ending offset can't be earliest"),
    ({"endingOffsets": '{"e":{"0":-2}}'}, "batch", "can't be earliest (-2)"),
]


def source(changes: dict[str, str | None]) -> dict[str, str]:
    base: dict[str, str | None] = {"path": "/data/root", "subscribe": "e"}
    base.update(changes)
    return {k.lower(): v for k, v in base.items() if v is not None}  # Spark lower-cases option keys


@pytest.mark.parametrize(
    ("option", "changes", "message"), SOURCE_BAD, ids=[f"{r[0]}-{i}" for i, r in enumerate(SOURCE_BAD)]
)
def test_bad_source_option(option: str, changes: dict[str, str | None], message: str) -> None:
    with pytest.raises(SourceOptionError) as e:
        parse_options(source(changes))
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)  # Spark shows it as an IllegalArgumentException-like error


@pytest.mark.parametrize(("changes", "mode", "message"), SOURCE_MODE_BAD)
def test_bad_source_option_for_the_query_kind(changes: dict[str, str], mode: str, message: str) -> None:
    o = parse_options(source(changes))
    with pytest.raises(SourceOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        o.for_stream() if mode == "stream" else o.for_batch()


def test_every_source_option_has_a_bad_value_row() -> None:
    covered = {r[0] for r in SOURCE_BAD}
    assert set(OPTIONS) - covered - SOURCE_ANY_VALUE == set()


# ============================================================================ sink

SINK_BAD: list[tuple[str, dict[str, str | None], str]] = [
    ("path", {"path": None}, "option path is required"),
    ("path", {"path": " "}, "option path is required"),
    ("topic", {"topic": "../escape"}, "option topic: topic name '../escape' is illegal"),
    ("topic", {"topic": "a" * 250}, "option topic"),
    ("partitions", {"partitions": "0"}, "option partitions"),
    ("partitions", {"partitions": "two"}, "option partitions"),
    ("partitions", {"partitions": "-1"}, "option partitions"),
    ("partitions", {"partitions": str(1 << 21)}, "option partitions"),
    ("compression.type", {"compression.type": "brotli"}, "brotli"),
    ("batch.size", {"batch.size": "12"}, "option batch.size"),
    ("batch.size", {"batch.size": "1MB"}, "option batch.size"),
    ("lockTimeoutMs", {"lockTimeoutMs": "-1"}, "option lockTimeoutMs"),
    ("lockTimeoutMs", {"lockTimeoutMs": "soon"}, "option lockTimeoutMs"),
    ("maintenance", {"maintenance": "maybe"}, "option maintenance"),
    ("maintenance.budgetMs", {"maintenance.budgetMs": "-5"}, "option maintenance.budgetMs"),
    ("maintenance.budgetMs", {"maintenance.budgetMs": "2s"}, "option maintenance.budgetMs"),
    ("directWrites", {"directWrites": "yes"}, "option directWrites: 'yes' is not valid"),
    ("queryRetentionMs", {"queryRetentionMs": "-1"}, "option queryRetentionMs"),
    ("queryRetentionMs", {"queryRetentionMs": "7d"}, "option queryRetentionMs"),
    ("topic config", {"segment.bytes": "10"}, "segment.bytes"),
    ("topic config", {"cleanup.policy": "archive"}, "cleanup.policy"),
    ("topic config", {"retention.ms": "forever"}, "retention.ms"),
    ("topic config", {"min.cleanable.dirty.ratio": "2"}, "min.cleanable.dirty.ratio"),
    ("unknown", {"kafka.bootstrap.servers": "h:9092"}, "pylog has no brokers"),
    ("unknown", {"acks": "all"}, "unknown option 'acks' for the pylog sink"),
]
SINK_ANY_VALUE = {"checkpointlocation", "queryname"}  # Spark's own options: any string is valid

GOOD_SCHEMA = StructType([StructField("value", BinaryType())])
SCHEMA_BAD: list[tuple[list[tuple[str, object]], dict[str, str], str]] = [
    ([("key", BinaryType())], {}, "needs a 'value' column"),
    ([], {}, "needs a 'value' column"),
    ([("value", IntegerType())], {}, "'value' must be binary or string"),
    ([("value", ArrayType(BinaryType()))], {}, "'value' must be binary or string"),
    ([("value", BinaryType()), ("key", LongType())], {}, "'key' must be binary or string"),
    ([("value", BinaryType()), ("topic", BinaryType())], {}, "'topic' must be string"),
    ([("value", BinaryType()), ("partition", StringType())], {}, "'partition' must be int"),
    ([("value", BinaryType()), ("partition", DoubleType())], {}, "'partition' must be int"),
    ([("value", BinaryType()), ("timestamp", StringType())], {}, "'timestamp' must be timestamp"),
    (
        [("value", BinaryType()), ("headers", MapType(StringType(), BinaryType()))],
        {},
        "'headers' must be array",
    ),
    (
        [("value", BinaryType()), ("headers", ArrayType(StructType([StructField("k", StringType())])))],
        {},
        "'headers' must be array",
    ),
    ([("value", BinaryType())], {"topic": None}, "no topic"),
]


def sink_opts(tmp_path: Path, changes: dict[str, str | None]) -> dict[str, str]:
    base: dict[str, str | None] = {
        "path": str(tmp_path / "root"),
        "topic": "events",
        "partitions": "2",
        "checkpointLocation": str(tmp_path / "ckpt"),
    }
    base.update(changes)
    return {k.lower(): v for k, v in base.items() if v is not None}


def _nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "root").exists(), sorted(p.name for p in (tmp_path / "root").iterdir())


@pytest.mark.parametrize(
    ("option", "changes", "message"), SINK_BAD, ids=[f"{r[0]}-{i}" for i, r in enumerate(SINK_BAD)]
)
@pytest.mark.parametrize("streaming", [True, False], ids=["writeStream", "write"])
def test_bad_sink_option_fails_before_any_write(
    tmp_path: Path, option: str, changes: dict[str, str | None], message: str, streaming: bool
) -> None:
    with pytest.raises(ConfigError) as e:
        sink.make_writer(sink_opts(tmp_path, changes), GOOD_SCHEMA, False, streaming=streaming)
    assert message.lower() in str(e.value).lower()
    _nothing_written(tmp_path)


@pytest.mark.parametrize(("cols", "changes", "message"), SCHEMA_BAD)
def test_wrong_sink_schema_fails_before_any_write(
    tmp_path: Path, cols: list[tuple[str, object]], changes: dict[str, str], message: str
) -> None:
    schema = StructType([StructField(n, t) for n, t in cols])  # type: ignore[arg-type]
    with pytest.raises(SinkSchemaError, match=message):
        sink.make_writer(sink_opts(tmp_path, changes), schema, False, streaming=True)
    _nothing_written(tmp_path)


def test_missing_topic_without_partitions_fails_before_any_write(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        sink.make_writer(sink_opts(tmp_path, {"partitions": None}), GOOD_SCHEMA, False, streaming=True)
    assert not any((tmp_path / "root").glob("events-*"))


def test_every_sink_option_has_a_bad_value_row() -> None:
    covered = {r[0].lower() for r in SINK_BAD}
    assert SINK_OPTIONS - covered - SINK_ANY_VALUE == set()
    assert any(k in LogConfig.valid_keys() for r in SINK_BAD for k in r[1])  # topic configs too


def test_the_good_baseline_is_accepted(tmp_path: Path) -> None:
    w = sink.make_writer(sink_opts(tmp_path, {}), GOOD_SCHEMA, False, streaming=True)
    assert w.opts.topic == "events"
    assert (tmp_path / "root" / "events-1").is_dir()  # the baseline rows differ only in the bad value
