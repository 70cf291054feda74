"""Options of the pylog source: Kafka's names, values and defaults; bad options (checklist D31)."""

from __future__ import annotations

import pytest

from pylog.connector.options import (
    DEFAULT_GROUP_ID_PREFIX,
    OPTIONS,
    OffsetSpec,
    SourceOptionError,
    parse_options,
)


def opts(**kw: str) -> dict[str, str]:
    base = {"path": "/data/root", "subscribe": "events"}
    base.update(kw)
    return {k.lower(): v for k, v in base.items() if v is not None}  # Spark lower-cases option keys


def test_defaults_are_kafkas() -> None:
    o = parse_options(opts())
    assert o.subscription.kind == "subscribe" and o.subscription.topics == ("events",)
    assert o.starting is None and o.ending is None  # latest streaming / earliest batch; latest
    assert o.fail_on_data_loss is True
    assert o.include_headers is False
    assert o.timestamp_strategy == "error"
    assert o.max_offsets_per_trigger is None and o.min_offsets_per_trigger is None
    assert o.max_trigger_delay_ms == 15 * 60_000
    assert o.min_partitions is None and o.max_records_per_partition is None
    assert o.isolation_level == "read_uncommitted"
    assert o.group_id.startswith(DEFAULT_GROUP_ID_PREFIX + "-")
    again = parse_options(opts()).group_id
    assert again != o.group_id  # each run of a query has a group of its own (Kafka's source)
    assert again.rsplit("-", 1)[1] == o.group_id.rsplit("-", 1)[1]  # the same path and subscription
    assert parse_options(opts(subscribe="other")).group_id.rsplit("-", 1)[1] != o.group_id.rsplit("-", 1)[1]


def test_every_option_parses() -> None:
    o = parse_options(
        opts(
            subscribe=" a, b ,a ",
            startingOffsets='{"a":{"0":23,"1":-2},"b":{"0":-1}}',
            endingOffsets='{"a":{"0":50,"1":-1},"b":{"0":-1}}',
            startingOffsetsByTimestampStrategy="LATEST",
            failOnDataLoss="False",
            maxOffsetsPerTrigger="1000",
            minOffsetsPerTrigger="10",
            maxTriggerDelay="30s",
            minPartitions="8",
            maxRecordsPerPartition="5000",
            includeHeaders="TRUE",
            isolationLevel="read_committed",
            groupId="my-query_1.a",
            **{"kafkaConsumer.pollTimeoutMs": "512", "fetchOffset.numRetries": "3"},
        )
    )
    assert o.subscription.topics == ("a", "b")
    assert o.starting == OffsetSpec(
        "offsets", ((("a", 0), 23), (("a", 1), -2), (("b", 0), -1)), option="startingOffsets"
    )
    assert o.ending is not None and o.ending.per_partition() == {("a", 0): 50, ("a", 1): -1, ("b", 0): -1}
    assert o.timestamp_strategy == "latest" and o.fail_on_data_loss is False
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (
        1000,
        10,
        30_000,
    )
    assert (o.min_partitions, o.max_records_per_partition) == (8, 5000)
    assert o.include_headers and o.isolation_level == "read_committed" and o.group_id == "my-query_1.a"


def test_subscriptions() -> None:
    assert parse_options(opts(subscribe=None, subscribePattern="ev.*")).subscription.matches("events")
    assert not parse_options(opts(subscribe=None, subscribePattern="ev")).subscription.matches("events")
    sub = parse_options(opts(subscribe=None, assign='{"b":[1,0],"a":[2]}')).subscription
    assert sub.kind == "assign" and sub.assignment == (("a", 2), ("b", 0), ("b", 1))


def test_timestamps_take_precedence_as_in_kafka() -> None:
    o = parse_options(
        opts(
            startingOffsets="earliest",
            startingOffsetsByTimestamp='{"events":{"0":5}}',
            startingTimestamp="1000",
            endingOffsetsByTimestamp='{"events":{"0":7}}',
        )
    )
    assert o.starting == OffsetSpec("timestamp", timestamp=1000, option="startingTimestamp")
    assert o.ending == OffsetSpec("timestamps", ((("events", 0), 7),), option="endingOffsetsByTimestamp")


def test_kafka_synonyms_and_storage_options() -> None:
    o = parse_options(
        opts(
            **{
                "kafka.isolation.level": "read_committed",
                "kafka.group.id": "g1",
                "kafka.security.protocol": "SSL",  # a connection option: ignored
                "storage.key": "AKIA",
                "storage.anon": "false",
            }
        )
    )
    assert o.isolation_level == "read_committed" and o.group_id == "g1"
    assert dict(o.storage_options) == {"key": "AKIA", "anon": "false"}  # typed by the storage
    assert "AKIA" not in repr(o)  # credentials stay out of logs and messages
    ok = parse_options(opts(**{"storage.pylog.retry_timeout_s": "0.5"}))
    assert dict(ok.storage_options) == {"pylog.retry_timeout_s": "0.5"}
    # pylog's own storage options are checked when the read is defined, named as given
    with pytest.raises(
        SourceOptionError, match=r"'storage\.pylog\.retry_timeout' \(did you mean storage\.pylog\."
    ):
        parse_options(opts(**{"storage.pylog.retry_timeout": "5"}))
    with pytest.raises(SourceOptionError, match=r"storage\.pylog\.read_ahead_bytes: 'lots' is not valid"):
        parse_options(opts(**{"storage.pylog.read_ahead_bytes": "lots"}))
    with pytest.raises(SourceOptionError, match=r"isolationLevel and kafka\.isolation\.level"):
        parse_options(opts(isolationLevel="read_uncommitted", **{"kafka.isolation.level": "read_committed"}))


BAD = [
    # subscription: missing, duplicate, empty (Kafka's "bad source options")
    ({"subscribe": None}, "one of the options assign, subscribe, subscribePattern must be given"),
    ({"assign": '{"a":[0]}'}, "only one of the options"),
    ({"subscribePattern": "a.*"}, "only one of the options"),
    ({"subscribe": ""}, "option subscribe: no topics"),
    ({"subscribe": " , "}, "option subscribe: no topics"),
    (
        {"subscribe": None, "subscribePattern": " "},
        "option subscribePattern: the pattern to subscribe to is empty",
    ),
    ({"subscribe": None, "subscribePattern": "a("}, "option subscribePattern: 'a\\(' is not a valid regular"),
    ({"subscribe": None, "assign": ""}, "option assign: no topic-partitions"),
    ({"subscribe": None, "assign": "a:0"}, "option assign: no topic-partitions"),
    ({"subscribe": None, "assign": '{"a":[-1]}'}, "option assign: partitions of topic 'a'"),
    ({"subscribe": None, "assign": "{}"}, "option assign: no topic-partitions"),
    ({"subscribe": None, "assign": '{"a":'}, "option assign: .* is not valid JSON"),
    ({"subscribe": "../etc"}, "option subscribe: topic name '../etc' is illegal"),
    ({"path": None}, "option path is required"),
    ({"path": " "}, "option path is required"),
    # offsets and timestamps
    (
        {"startingOffsets": "first"},
        "option startingOffsets: 'first' is not valid; valid values: earliest, latest",
    ),
    (
        {"startingOffsets": '{"events":{"0":-3}}'},
        "option startingOffsets: offset -3 of events-0 is not valid",
    ),
    ({"startingOffsets": '{"events":{"x":1}}'}, "option startingOffsets: partition 'x' of topic 'events'"),
    ({"startingOffsets": '{"events":{"0":"1"}}'}, "option startingOffsets: the value for events-0 must be"),
    (
        {"startingOffsets": '{"events":[0]}'},
        "option startingOffsets: the value for topic 'events' must be a JSON",
    ),
    ({"endingOffsets": "soon"}, "option endingOffsets: 'soon' is not valid"),
    ({"startingTimestamp": "yesterday"}, "option startingTimestamp: 'yesterday' is not a 64-bit integer"),
    ({"startingTimestamp": "-5"}, "option startingTimestamp: -5 is not valid"),
    ({"startingOffsetsByTimestamp": '{"events":{"0":-1}}'}, "timestamp -1 of events-0 is negative"),
    ({"startingOffsetsByTimestampStrategy": "earliest"}, "valid values: error, latest"),
    # numbers, booleans, durations
    ({"minPartitions": "a"}, "option minPartitions: 'a' is not valid; valid values: a positive integer"),
    ({"minPartitions": "1.0"}, "option minPartitions: '1.0' is not valid"),
    ({"minPartitions": "0"}, "option minPartitions: '0' is not valid"),
    ({"minPartitions": "-1"}, "option minPartitions: '-1' is not valid"),
    ({"minPartitions": "3000000000"}, "option minPartitions: '3000000000' is not valid"),
    ({"maxRecordsPerPartition": "0"}, "option maxRecordsPerPartition: '0' is not valid"),
    ({"maxOffsetsPerTrigger": "x"}, "option maxOffsetsPerTrigger: 'x' is not valid"),
    ({"maxOffsetsPerTrigger": "9223372036854775808"}, "option maxOffsetsPerTrigger"),
    (
        {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
        r"minOffsetsPerTrigger \(10\) is higher than",
    ),
    ({"maxTriggerDelay": "soon"}, "option maxTriggerDelay: 'soon' is not a duration"),
    ({"failOnDataLoss": "yes"}, "option failOnDataLoss: 'yes' is not valid; valid values: true, false"),
    ({"includeHeaders": "1"}, "option includeHeaders: '1' is not valid; valid values: true, false"),
    ({"isolationLevel": "serializable"}, "valid values: read_uncommitted, read_committed"),
    ({"groupId": "a b"}, "option groupId: 'a b' is not valid"),
    # unknown options and Kafka's unsupported configs
    (
        {"startingOffset": "earliest"},
        r"unknown option 'startingoffset' \(did you mean startingOffsets\?\) for the pylog source; "
        "valid options: path",
    ),
    ({"kafka.bootstrap.servers": "h:9092"}, "replace kafka.bootstrap.servers .* with the option path"),
    ({"kafka.auto.offset.reset": "earliest"}, "'auto.offset.reset' is not supported; set the source option"),
    ({"kafka.key.deserializer": "x"}, "'key.deserializer' is not supported"),
    ({"kafka.value.deserializer": "x"}, "'value.deserializer' is not supported"),
    ({"kafka.enable.auto.commit": "true"}, "'enable.auto.commit' is not supported"),
    ({"kafka.interceptor.classes": "x"}, "'interceptor.classes' is not supported"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_options_name_the_option_and_valid_values(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options(opts(**changes))


def test_mode_specific_checks() -> None:
    # streaming: ending offsets are batch-only (Kafka: "ending offset not valid in streaming queries")
    for name, v in (
        ("endingOffsets", "latest"),
        ("endingTimestamp", "5"),
        ("endingOffsetsByTimestamp", '{"e":{"0":1}}'),
    ):
        o = parse_options(opts(**{name: v}))
        o.for_batch()
        with pytest.raises(SourceOptionError, match=f"option {name}: .* not valid in streaming queries"):
            o.for_stream()
    # batch: a batch can't start at latest, nor end at earliest
    with pytest.raises(SourceOptionError, match="starting offset can't be latest for batch queries"):
        parse_options(opts(startingOffsets="latest")).for_batch()
    with pytest.raises(SourceOptionError, match="starting offset for events-1 can't be latest"):
        parse_options(opts(startingOffsets='{"events":{"0":-2,"1":-1}}')).for_batch()
    with pytest.raises(SourceOptionError, match="ending offset can't be earliest for batch queries"):
        parse_options(opts(endingOffsets="earliest")).for_batch()
    with pytest.raises(SourceOptionError, match="ending offset for events-0 can't be earliest"):
        parse_options(opts(endingOffsets='{"events":{"0":-2}}')).for_batch()
    parse_options(opts(startingOffsets="latest")).for_stream()


def test_options_table_documents_every_option() -> None:
    for name in ("path", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                 "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
                 "endingTimestamp", "endingOffsetsByTimestamp", "failOnDataLoss", "maxOffsetsPerTrigger",
                 "minOffsetsPerTrigger", "minPartitions", "maxRecordsPerPartition", "includeHeaders",
                 "isolationLevel"):  # fmt: skip
        assert name in OPTIONS
