"""Topic and cleaner configuration: Kafka's names, synonyms, defaults, ranges, parsing of string
values, precedence, clear errors, and topic-name rules."""

from __future__ import annotations

import dataclasses
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.config import CleanerConfig, LogConfig, validate_topic_name
from pylog.storage.errors import ConfigError

I32 = 2**31 - 1
I64 = 2**63 - 1

# Kafka's table: topic config → default as Kafka's describe shows it.
KAFKA_TOPIC_DEFAULTS = {
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "segment.jitter.ms": "0",
    "segment.index.bytes": "10485760",
    "index.interval.bytes": "4096",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    "min.cleanable.dirty.ratio": "0.5",
    "delete.retention.ms": "86400000",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "9223372036854775807",
    "file.delete.delay.ms": "60000",
    "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "preallocate": "false",
    "compression.type": "producer",
}

KAFKA_CLEANER_DEFAULTS = {
    "log.cleaner.enable": "true",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": "134217728",
    "log.cleaner.io.buffer.load.factor": "0.9",
    "log.cleaner.io.buffer.size": "524288",
    "log.cleaner.io.max.bytes.per.second": repr(sys.float_info.max),
    "log.cleaner.backoff.ms": "15000",
    "log.retention.check.interval.ms": "300000",
}

# (key, given value, field, parsed value): every topic name and every broker synonym.
NAME_FORMS = [
    ("segment.bytes", "1048576", "segment_bytes", 1048576),
    ("log.segment.bytes", "1048576", "segment_bytes", 1048576),
    ("segment.ms", "1000", "segment_ms", 1000),
    ("log.roll.ms", "1000", "segment_ms", 1000),
    ("log.roll.hours", "2", "segment_ms", 7_200_000),
    ("segment.jitter.ms", "10", "segment_jitter_ms", 10),
    ("log.roll.jitter.ms", "10", "segment_jitter_ms", 10),
    ("log.roll.jitter.hours", "1", "segment_jitter_ms", 3_600_000),
    ("segment.index.bytes", "4096", "segment_index_bytes", 4096),
    ("log.index.size.max.bytes", "4096", "segment_index_bytes", 4096),
    ("index.interval.bytes", "1", "index_interval_bytes", 1),
    ("log.index.interval.bytes", "1", "index_interval_bytes", 1),
    ("retention.ms", "-1", "retention_ms", -1),
    ("log.retention.ms", "5000", "retention_ms", 5000),
    ("log.retention.minutes", "3", "retention_ms", 180_000),
    ("log.retention.hours", "24", "retention_ms", 86_400_000),
    ("retention.bytes", "1000000", "retention_bytes", 1_000_000),
    ("log.retention.bytes", "1000000", "retention_bytes", 1_000_000),
    ("cleanup.policy", "compact", "cleanup_policy", ("compact",)),
    ("log.cleanup.policy", "compact", "cleanup_policy", ("compact",)),
    ("min.cleanable.dirty.ratio", "0.1", "min_cleanable_dirty_ratio", 0.1),
    ("log.cleaner.min.cleanable.ratio", "0.1", "min_cleanable_dirty_ratio", 0.1),
    ("delete.retention.ms", "100", "delete_retention_ms", 100),
    ("log.cleaner.delete.retention.ms", "100", "delete_retention_ms", 100),
    ("min.compaction.lag.ms", "100", "min_compaction_lag_ms", 100),
    ("log.cleaner.min.compaction.lag.ms", "100", "min_compaction_lag_ms", 100),
    ("max.compaction.lag.ms", "100", "max_compaction_lag_ms", 100),
    ("log.cleaner.max.compaction.lag.ms", "100", "max_compaction_lag_ms", 100),
    ("file.delete.delay.ms", "0", "file_delete_delay_ms", 0),
    ("log.segment.delete.delay.ms", "0", "file_delete_delay_ms", 0),
    ("flush.messages", "1", "flush_messages", 1),
    ("log.flush.interval.messages", "1", "flush_messages", 1),
    ("flush.ms", "0", "flush_ms", 0),
    ("log.flush.interval.ms", "0", "flush_ms", 0),
    ("log.flush.scheduler.interval.ms", "0", "flush_ms", 0),
    ("max.message.bytes", "2000000", "max_message_bytes", 2_000_000),
    ("message.max.bytes", "2000000", "max_message_bytes", 2_000_000),
    ("message.timestamp.type", "LogAppendTime", "message_timestamp_type", "LogAppendTime"),
    ("log.message.timestamp.type", "LogAppendTime", "message_timestamp_type", "LogAppendTime"),
    ("preallocate", "true", "preallocate", True),
    ("log.preallocate", "true", "preallocate", True),
    ("compression.type", "zstd", "compression_type", "zstd"),
]

# (key, bad value): wrong types, wrong syntax, and one step outside each end of Kafka's range.
BAD_VALUES = [
    ("segment.bytes", "13"),
    ("segment.bytes", 2**31),
    ("segment.bytes", "1 GB"),
    ("segment.bytes", 1.5),
    ("segment.bytes", "1e9"),
    ("segment.bytes", True),
    ("segment.bytes", None),
    ("segment.bytes", [1]),
    ("log.segment.bytes", "-1"),
    ("segment.ms", 0),
    ("segment.ms", 2**63),
    ("segment.ms", "9" * 5000),
    ("segment.ms", "١٢٣"),  # non-ASCII digits: int() would accept them, Long.parseLong does not
    ("segment.ms", "1_000"),
    ("log.roll.ms", 0),
    ("log.roll.hours", 0),
    ("log.roll.hours", 2**31),
    ("log.roll.hours", "1.5"),
    ("segment.jitter.ms", -1),
    ("log.roll.jitter.ms", -1),
    ("log.roll.jitter.hours", -1),
    ("segment.index.bytes", 3),
    ("log.index.size.max.bytes", 2**31),
    ("index.interval.bytes", -1),
    ("log.index.interval.bytes", "x"),
    ("retention.ms", -2),
    ("retention.ms", 2**63),
    ("log.retention.ms", 2**63),
    ("log.retention.minutes", 2**31),
    ("log.retention.hours", -(2**31) - 1),
    ("log.retention.hours", "forever"),
    ("retention.bytes", 2**63),
    ("retention.bytes", -(2**63) - 1),
    ("log.retention.bytes", 1.25),
    ("cleanup.policy", "Compact"),
    ("cleanup.policy", "delete,"),
    ("cleanup.policy", "delete;compact"),
    ("cleanup.policy", "none"),
    ("cleanup.policy", 1),
    ("cleanup.policy", ["delete", 1]),
    ("log.cleanup.policy", "purge"),
    ("min.cleanable.dirty.ratio", 1.01),
    ("min.cleanable.dirty.ratio", -0.01),
    ("min.cleanable.dirty.ratio", "nan"),
    ("min.cleanable.dirty.ratio", float("nan")),
    ("min.cleanable.dirty.ratio", "half"),
    ("min.cleanable.dirty.ratio", True),
    ("log.cleaner.min.cleanable.ratio", "2"),
    ("delete.retention.ms", -1),
    ("log.cleaner.delete.retention.ms", -1),
    ("min.compaction.lag.ms", -1),
    ("log.cleaner.min.compaction.lag.ms", -1),
    ("max.compaction.lag.ms", 0),
    ("log.cleaner.max.compaction.lag.ms", 0),
    ("file.delete.delay.ms", -1),
    ("log.segment.delete.delay.ms", -1),
    ("flush.messages", 0),
    ("log.flush.interval.messages", 0),
    ("flush.ms", -1),
    ("log.flush.interval.ms", -1),
    ("log.flush.scheduler.interval.ms", -1),
    ("max.message.bytes", -1),
    ("message.max.bytes", 2**31),
    ("message.timestamp.type", "createtime"),
    ("message.timestamp.type", "NoTimestamp"),
    ("log.message.timestamp.type", 0),
    ("preallocate", 1),
    ("preallocate", "yes"),
    ("preallocate", None),
    ("log.preallocate", "1"),
    ("compression.type", "brotli"),
    ("compression.type", "none"),  # a producer codec name, not a topic compression.type
    ("compression.type", "GZIP"),
]


# --- defaults ----------------------------------------------------------------------------------------


def test_defaults_match_kafka() -> None:
    assert LogConfig().to_dict() == KAFKA_TOPIC_DEFAULTS
    assert LogConfig.from_dict() == LogConfig()
    assert LogConfig.from_dict({}) == LogConfig()
    c = LogConfig()
    assert c.delete and not c.compact
    assert c.max_segment_ms == 604800000
    assert c.flush_ms == c.flush_messages == c.max_compaction_lag_ms == I64


def test_cleaner_defaults_match_kafka() -> None:
    c = CleanerConfig()
    assert c.to_dict() == KAFKA_CLEANER_DEFAULTS
    assert (c.enable, c.threads, c.dedupe_buffer_size, c.dedupe_buffer_load_factor) == (
        True,
        1,
        134217728,
        0.9,
    )
    assert (c.io_buffer_size, c.backoff_ms, c.retention_check_interval_ms) == (524288, 15000, 300000)
    assert c.io_max_bytes_per_second == sys.float_info.max


def test_dataclasses_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_bytes = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CleanerConfig().threads = 2  # type: ignore[misc]


def test_docstrings_have_a_table_of_every_key() -> None:
    for cls in (LogConfig, CleanerConfig):
        doc = cls.__doc__ or ""
        for key in cls().to_dict():
            assert key in doc, (cls.__name__, key)


# --- names, synonyms, precedence -------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "attr", "expected"), NAME_FORMS, ids=[f[0] for f in NAME_FORMS])
def test_every_name_form_is_accepted(key: str, value: str, attr: str, expected: object) -> None:
    c = LogConfig.from_dict({key: value})
    assert getattr(c, attr) == expected
    assert getattr(c, attr) != getattr(LogConfig(), attr)  # the test value is not the default


def test_every_valid_key_is_covered_by_name_forms() -> None:
    assert sorted({f[0] for f in NAME_FORMS}) == LogConfig.valid_keys()


def test_topic_name_wins_over_broker_synonym() -> None:
    for props in (
        {"segment.bytes": 2000, "log.segment.bytes": 3000},
        {"log.segment.bytes": 3000, "segment.bytes": 2000},
    ):
        assert LogConfig.from_dict(props).segment_bytes == 2000
    props = {"log.retention.hours": 1, "retention.ms": 5, "log.retention.minutes": 1, "log.retention.ms": 7}
    assert LogConfig.from_dict(props).retention_ms == 5
    assert LogConfig.from_dict(
        {"log.cleanup.policy": "delete", "cleanup.policy": "compact"}
    ).cleanup_policy == ("compact",)


def test_broker_synonym_precedence_ms_then_minutes_then_hours() -> None:
    assert LogConfig.from_dict({"log.retention.hours": 1, "log.retention.minutes": 2}).retention_ms == 120_000
    assert LogConfig.from_dict({"log.retention.minutes": 2, "log.retention.ms": 9}).retention_ms == 9
    assert LogConfig.from_dict({"log.roll.hours": 1, "log.roll.ms": 9}).segment_ms == 9
    assert LogConfig.from_dict({"log.roll.jitter.hours": 1, "log.roll.jitter.ms": 9}).segment_jitter_ms == 9
    assert (
        LogConfig.from_dict({"log.flush.scheduler.interval.ms": 1, "log.flush.interval.ms": 9}).flush_ms == 9
    )


def test_losing_names_are_still_validated() -> None:
    with pytest.raises(ConfigError, match=r"log\.segment\.bytes"):
        LogConfig.from_dict({"segment.bytes": 2000, "log.segment.bytes": "oops"})
    with pytest.raises(ConfigError, match=r"log\.retention\.hours"):
        LogConfig.from_dict({"log.retention.ms": 5, "log.retention.hours": "oops"})


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"log.roll.hours": 168}, 604_800_000),
        ({"log.roll.hours": I32}, I32 * 3_600_000),
        ({"log.retention.hours": 168}, 604_800_000),
        ({"log.retention.minutes": 1}, 60_000),
        ({"log.retention.minutes": I32}, I32 * 60_000),
        ({"log.retention.hours": -1}, -1),  # KafkaConfig: any negative retention is unlimited
        ({"log.retention.hours": -5}, -1),
        ({"log.retention.minutes": "-3"}, -1),
        ({"log.retention.ms": -42}, -1),
        ({"retention.ms": -1}, -1),
    ],
)
def test_hours_and_minutes_conversion(props: dict[str, object], expected: int) -> None:
    c = LogConfig.from_dict(props)
    assert (c.segment_ms if "log.roll.hours" in props else c.retention_ms) == expected


def test_jitter_hours_conversion() -> None:
    assert LogConfig.from_dict({"log.roll.jitter.hours": 3}).segment_jitter_ms == 3 * 3_600_000


# --- value forms -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "attr", "expected"),
    [
        ("segment.bytes", 1048576, "segment_bytes", 1048576),
        ("segment.bytes", "  1048576 ", "segment_bytes", 1048576),
        ("segment.bytes", "+1048576", "segment_bytes", 1048576),
        ("segment.bytes", 1048576.0, "segment_bytes", 1048576),
        ("segment.bytes", np.int64(1048576), "segment_bytes", 1048576),
        ("segment.bytes", 14, "segment_bytes", 14),
        ("segment.bytes", I32, "segment_bytes", I32),
        ("segment.ms", str(I64), "segment_ms", I64),
        ("retention.bytes", str(-(2**63)), "retention_bytes", -(2**63)),
        ("cleanup.policy", " compact ", "cleanup_policy", ("compact",)),
        ("cleanup.policy", "delete,compact", "cleanup_policy", ("compact", "delete")),
        ("cleanup.policy", "compact , delete", "cleanup_policy", ("compact", "delete")),
        ("cleanup.policy", "compact,compact", "cleanup_policy", ("compact",)),
        ("cleanup.policy", ["delete", "compact"], "cleanup_policy", ("compact", "delete")),
        ("cleanup.policy", ("compact",), "cleanup_policy", ("compact",)),
        ("cleanup.policy", "", "cleanup_policy", ()),  # Kafka accepts an empty list
        ("min.cleanable.dirty.ratio", 0, "min_cleanable_dirty_ratio", 0.0),
        ("min.cleanable.dirty.ratio", 1, "min_cleanable_dirty_ratio", 1.0),
        ("min.cleanable.dirty.ratio", " .25 ", "min_cleanable_dirty_ratio", 0.25),
        ("min.cleanable.dirty.ratio", "1e-3", "min_cleanable_dirty_ratio", 0.001),
        ("min.cleanable.dirty.ratio", np.float32(0.5), "min_cleanable_dirty_ratio", 0.5),
        ("preallocate", True, "preallocate", True),
        ("preallocate", "TRUE", "preallocate", True),
        ("preallocate", " False ", "preallocate", False),
        ("message.timestamp.type", " LogAppendTime ", "message_timestamp_type", "LogAppendTime"),
        ("compression.type", "uncompressed", "compression_type", "uncompressed"),
        ("compression.type", "lz4", "compression_type", "lz4"),
    ],
)
def test_value_forms(key: str, value: object, attr: str, expected: object) -> None:
    c = LogConfig.from_dict({key: value})
    got = getattr(c, attr)
    assert got == expected
    assert type(got) is type(expected)


def test_policy_properties_and_max_segment_ms() -> None:
    compacted = LogConfig.from_dict(
        {"cleanup.policy": "compact", "segment.ms": 1000, "max.compaction.lag.ms": 10}
    )
    assert compacted.compact and not compacted.delete
    assert compacted.max_segment_ms == 10
    both = LogConfig.from_dict({"cleanup.policy": "compact,delete", "segment.ms": 5})
    assert both.compact and both.delete and both.max_segment_ms == 5
    deleted = LogConfig.from_dict({"segment.ms": 1000, "max.compaction.lag.ms": 10})
    assert deleted.max_segment_ms == 1000  # only compacted logs are capped
    neither = LogConfig.from_dict({"cleanup.policy": ""})
    assert not neither.compact and not neither.delete


# --- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=[f"{k}={v!r}"[:60] for k, v in BAD_VALUES])
def test_invalid_values_raise_config_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_dict({key: value})
    message = str(info.value)
    assert f" for {key}: expected " in message
    shown = repr(value)
    assert shown[:60] in message
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, ValueError)  # ConfigError is also a ValueError


@pytest.mark.parametrize(
    ("props", "fragment"),
    [
        ({"segment.bytes": 1}, "[14, 2147483647]"),
        ({"segment.ms": 0}, "[1, 9223372036854775807]"),
        ({"retention.ms": -2}, "[-1, 9223372036854775807]"),
        ({"log.roll.hours": 0}, "[1, 2147483647] (hours)"),
        ({"log.retention.minutes": 2**31}, "[-2147483648, 2147483647] (minutes)"),
        ({"min.cleanable.dirty.ratio": 2}, "a number in [0.0, 1.0]"),
        ({"cleanup.policy": "x"}, "a comma-separated list of compact, delete"),
        ({"compression.type": "x"}, "one of producer, uncompressed, gzip, snappy, lz4, zstd"),
        ({"message.timestamp.type": "x"}, "one of CreateTime, LogAppendTime"),
        ({"preallocate": "x"}, "true or false"),
    ],
)
def test_errors_state_what_is_expected(props: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_dict(props)
    assert fragment in str(info.value)


def test_unknown_key_lists_every_valid_key_sorted() -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_dict({"segment.byte": 1, "retention.ms": 5})
    message = str(info.value)
    assert "unknown config key 'segment.byte'" in message
    listed = message.split("valid keys are: ")[1].split(", ")
    assert listed == sorted(listed) == LogConfig.valid_keys()
    assert "segment.bytes" in listed and "log.segment.bytes" in listed and "log.retention.hours" in listed
    assert len(listed) == 42


def test_several_unknown_keys_are_all_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown config keys 'a', 'b'"):
        LogConfig.from_dict({"b": 1, "a": 2})


def test_keys_are_exact() -> None:
    for key in ("Segment.Bytes", " segment.bytes", "segment_bytes"):
        with pytest.raises(ConfigError, match="unknown config key"):
            LogConfig.from_dict({key: 1})


def test_non_string_keys_and_non_mappings_are_rejected() -> None:
    with pytest.raises(ConfigError, match="keys must be strings"):
        LogConfig.from_dict({1: 2})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="must be a mapping"):
        LogConfig.from_dict([("segment.bytes", 1)])  # type: ignore[arg-type]


def test_min_compaction_lag_must_not_exceed_max() -> None:
    expected = r"min\.compaction\.lag\.ms \(10\) > max\.compaction\.lag\.ms \(5\)"
    with pytest.raises(ConfigError, match=expected):
        LogConfig.from_dict({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5})
    base = LogConfig.from_dict({"max.compaction.lag.ms": 5})
    with pytest.raises(ConfigError, match="conflicting"):
        base.with_overrides({"min.compaction.lag.ms": 6})
    assert (
        LogConfig.from_dict({"min.compaction.lag.ms": 5, "max.compaction.lag.ms": 5}).min_compaction_lag_ms
        == 5
    )


def test_direct_construction_is_validated_and_canonical() -> None:
    with pytest.raises(ConfigError, match=r"invalid value 5 for segment\.bytes"):
        LogConfig(segment_bytes=5)
    with pytest.raises(ConfigError, match=r"compression\.type"):
        LogConfig(compression_type="brotli")
    c = LogConfig(cleanup_policy=["delete", "compact"], min_cleanable_dirty_ratio=1)  # type: ignore[arg-type]
    assert c.cleanup_policy == ("compact", "delete")
    assert c.min_cleanable_dirty_ratio == 1.0 and isinstance(c.min_cleanable_dirty_ratio, float)
    assert c == LogConfig(cleanup_policy=("compact", "delete"), min_cleanable_dirty_ratio=1.0)
    assert hash(c) == hash(LogConfig(cleanup_policy=("compact", "delete"), min_cleanable_dirty_ratio=1.0))


# --- base / overrides ------------------------------------------------------------------------------------


def test_base_and_with_overrides() -> None:
    base = LogConfig.from_dict({"segment.bytes": 4096, "cleanup.policy": "compact"})
    c = LogConfig.from_dict({"retention.ms": 10}, base=base)
    assert (c.segment_bytes, c.cleanup_policy, c.retention_ms) == (4096, ("compact",), 10)
    assert base.with_overrides({"retention.ms": 10}) == c
    assert base.with_overrides({}) is base
    assert base.with_overrides(None) is base
    assert base.with_overrides({"log.segment.bytes": 8192}).segment_bytes == 8192
    assert base.segment_bytes == 4096  # unchanged


def test_string_values_from_describe_round_trip() -> None:
    """What an alter-config through str() produces (e.g. str(True) == 'True') parses back."""
    c = LogConfig(preallocate=True, min_cleanable_dirty_ratio=0.3)
    given = {"preallocate": True, "min.cleanable.dirty.ratio": 0.3}
    assert LogConfig.from_dict({k: str(v) for k, v in given.items()}) == c


# --- round trip ------------------------------------------------------------------------------------------


def _longs(lo: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(lo, I64), st.sampled_from([lo, I64]))


log_configs = st.builds(
    LogConfig,
    segment_bytes=st.integers(14, I32),
    segment_ms=_longs(1),
    segment_jitter_ms=_longs(0),
    segment_index_bytes=st.integers(4, I32),
    index_interval_bytes=st.integers(0, I32),
    retention_ms=_longs(-1),
    retention_bytes=st.integers(-(2**63), I64),
    cleanup_policy=st.lists(st.sampled_from(["delete", "compact"]), unique=True).map(tuple),
    min_cleanable_dirty_ratio=st.floats(0.0, 1.0),
    delete_retention_ms=_longs(0),
    min_compaction_lag_ms=st.just(0) | st.integers(0, 10**6),
    max_compaction_lag_ms=st.integers(10**6, I64),
    file_delete_delay_ms=_longs(0),
    flush_messages=_longs(1),
    flush_ms=_longs(0),
    max_message_bytes=st.integers(0, I32),
    message_timestamp_type=st.sampled_from(["CreateTime", "LogAppendTime"]),
    preallocate=st.booleans(),
    compression_type=st.sampled_from(["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]),
)

cleaner_configs = st.builds(
    CleanerConfig,
    enable=st.booleans(),
    threads=st.integers(0, I32),
    dedupe_buffer_size=_longs(0),
    dedupe_buffer_load_factor=st.floats(0.0, 1.0, exclude_min=True),
    io_buffer_size=st.integers(0, I32),
    io_max_bytes_per_second=st.floats(0.0, sys.float_info.max, exclude_min=True),
    backoff_ms=_longs(0),
    retention_check_interval_ms=_longs(1),
)


@settings(max_examples=200, deadline=None)
@given(log_configs)
def test_to_dict_from_dict_round_trip(c: LogConfig) -> None:
    d = c.to_dict()
    assert list(d) == list(KAFKA_TOPIC_DEFAULTS)
    assert all(isinstance(v, str) for v in d.values())
    assert LogConfig.from_dict(d) == c
    assert LogConfig.from_dict(d, base=LogConfig(segment_bytes=99)) == c
    assert LogConfig().with_overrides(d) == c


@settings(max_examples=100, deadline=None)
@given(cleaner_configs)
@pytest.mark.filterwarnings("ignore:log.*has no effect in pylog:UserWarning")
def test_cleaner_round_trip(c: CleanerConfig) -> None:
    d = c.to_dict()
    assert list(d) == list(KAFKA_CLEANER_DEFAULTS)
    assert CleanerConfig.from_dict(d) == c


# --- CleanerConfig ------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:log.*has no effect in pylog:UserWarning")
def test_cleaner_from_dict() -> None:
    c = CleanerConfig.from_dict(
        {
            "log.cleaner.enable": "false",
            "log.cleaner.threads": "4",
            "log.cleaner.dedupe.buffer.size": "1048576",
            "log.cleaner.io.buffer.load.factor": "0.75",
            "log.cleaner.io.buffer.size": 65536,
            "log.cleaner.io.max.bytes.per.second": "1e6",
            "log.cleaner.backoff.ms": 0,
            "log.retention.check.interval.ms": "1000",
        }
    )
    assert c == CleanerConfig(False, 4, 1048576, 0.75, 65536, 1e6, 0, 1000)
    assert c.with_overrides({"log.cleaner.threads": 2}).threads == 2
    assert c.throttled and not CleanerConfig().throttled


NO_EFFECT_KEYS = [
    "log.cleaner.threads",
    "log.cleaner.io.buffer.size",
    "log.cleaner.backoff.ms",
    "log.retention.check.interval.ms",
]


@pytest.mark.parametrize(
    ("key", "value", "shown", "why"),
    [
        ("log.cleaner.threads", "4", "4", "cleans one log at a time in the calling thread"),
        ("log.cleaner.threads", 0, "0", "to turn compaction off, set log.cleaner.enable=false"),
        ("log.cleaner.io.buffer.size", " 65536 ", "65536", "reads segments in 8 MiB chunks"),
        ("log.cleaner.backoff.ms", 0, "0", "no background cleaner thread"),
        ("log.retention.check.interval.ms", "1000", "1000", "no retention timer"),
    ],
)
def test_settings_without_effect_warn_naming_the_setting_and_why(
    key: str, value: object, shown: str, why: str
) -> None:
    with pytest.warns(UserWarning) as caught:
        c = CleanerConfig.from_dict({key: value})
    message = f"{key}={shown} has no effect in pylog: {CleanerConfig.NO_EFFECT[key]}"
    assert [str(w.message) for w in caught] == [message]
    assert why in message
    assert c.to_dict()[key] == shown  # accepted and kept: a broker's settings can be given as they are


def test_settings_with_an_effect_or_kafkas_default_do_not_warn() -> None:
    assert sorted(CleanerConfig.NO_EFFECT) == sorted(NO_EFFECT_KEYS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CleanerConfig()
        CleanerConfig.from_dict(KAFKA_CLEANER_DEFAULTS)  # a broker's defaults, given explicitly
        CleanerConfig.from_dict(
            {
                "log.cleaner.enable": "false",
                "log.cleaner.dedupe.buffer.size": 1 << 20,
                "log.cleaner.io.buffer.load.factor": 0.5,
                "log.cleaner.io.max.bytes.per.second": 1e6,
            }
        )


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("log.cleaner.enable", "maybe", "true or false"),
        ("log.cleaner.threads", -1, "[0, 2147483647]"),
        ("log.cleaner.dedupe.buffer.size", -1, "[0, 9223372036854775807]"),
        ("log.cleaner.io.buffer.load.factor", 0, "(0.0, 1.0]"),
        ("log.cleaner.io.buffer.load.factor", 1.5, "(0.0, 1.0]"),
        ("log.cleaner.io.buffer.size", 2**31, "[0, 2147483647]"),
        ("log.cleaner.io.max.bytes.per.second", 0, "(0.0, "),
        ("log.cleaner.io.max.bytes.per.second", "inf", "(0.0, "),
        ("log.cleaner.backoff.ms", -1, "[0, 9223372036854775807]"),
        ("log.retention.check.interval.ms", 0, "[1, 9223372036854775807]"),
    ],
)
def test_cleaner_invalid_values(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        CleanerConfig.from_dict({key: value})
    assert key in str(info.value) and fragment in str(info.value)
    assert info.value.__cause__ is not None


def test_cleaner_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        CleanerConfig.from_dict({"segment.bytes": 1})
    assert str(info.value).endswith("valid keys are: " + ", ".join(sorted(KAFKA_CLEANER_DEFAULTS)))


# --- topic names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "events", "A-b_c.d", "0", "...", "._-", "t" * 249, "__consumer_offsets"]
)
def test_legal_topic_names(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "can't be empty"),
        (".", "can't be '.' or '..'"),
        ("..", "can't be '.' or '..'"),
        ("t" * 250, "can't be longer than 249 characters (it has 250)"),
        ("a b", "contains ' '"),
        ("a/b", "contains '/'"),
        ("../x", "contains '/'"),
        ("a\\b", "contains '\\\\'"),
        ("a\x00b", "contains '\\x00'"),
        ("a:b", "contains ':'"),
        ("a\nb", "contains '\\n'"),
        ("événement", "contains 'é'"),
        ("a+b*c", "contains '*', '+'"),
    ],
)
def test_illegal_topic_names(name: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_topic_name(name)
    message = str(info.value)
    assert rule in message
    if name and len(name) <= 60:
        assert repr(name) in message


def test_topic_name_errors_are_bounded_for_huge_names() -> None:
    with pytest.raises(ConfigError) as info:
        validate_topic_name("x" * 100_000)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("name", [None, 1, b"events"])
def test_topic_name_must_be_a_string(name: object) -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        validate_topic_name(name)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=260))
def test_topic_name_rule_matches_kafka_regex(name: str) -> None:
    import re

    legal = bool(re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name)) and name not in (".", "..")
    try:
        validate_topic_name(name)
    except ConfigError:
        assert not legal
    else:
        assert legal
