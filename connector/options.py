"""Options of the ``pylog`` source: the names, values and defaults of Spark's Kafka source.

:func:`parse_options` turns the string options Spark hands a data source (keys case-insensitive)
into a :class:`SourceOptions`, raising :class:`SourceOptionError` (a ``ValueError``) that names
the option and its valid values for anything invalid or conflicting.  It runs in
``DataSource.schema()``, i.e. at ``load()``.  The checks that depend on the kind of query
(``endingOffsets`` is batch-only, ``startingOffsets=latest`` is streaming-only) run when Spark
creates the reader: a Python data source is not told at ``load()`` whether it is read as a
stream or a batch.

This module does not import pyspark.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pylog.connector.javaregex import JavaRegexError, compile_java
from pylog.connector.optionspec import SOURCE_OPTIONS, SPECIFIC, read_options
from pylog.storage.config import show, validate_topic_name
from pylog.storage.errors import ConfigError, SourceOptionError
from pylog.storage.partition.checkpoint import TopicPartition

log = logging.getLogger("pylog.connector")

EARLIEST = -2
"""Offset JSON value for the earliest offset (Kafka's ``-2``)."""
LATEST = -1
"""Offset JSON value for the latest offset (Kafka's ``-1``)."""
INT64_MAX = 2**63 - 1

OPTIONS: dict[str, str] = {o.name: o.values for o in SOURCE_OPTIONS}
"""Documented name -> valid values, of every source option (declared in :mod:`.optionspec`)."""
SUBSCRIPTIONS = ("assign", "subscribe", "subscribePattern")
DEFAULT_GROUP_ID_PREFIX = "spark-pylog-source"
_GROUP_RE = re.compile(r"[a-zA-Z0-9._-]{1,200}")


# ============================================================================ values


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: exactly one of Kafka's three strategies."""

    kind: str  # "assign" | "subscribe" | "subscribePattern"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assignment: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return compile_java(self.pattern).fullmatch(topic) is not None
        return any(t == topic for t, _ in self.assignment)

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return f"assign={assignment_json(self.assignment)}"


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends, before it is resolved against the log.

    kind: ``earliest`` | ``latest`` | ``offsets`` (``offsets`` per partition, -2/-1 allowed) |
    ``timestamp`` (one ``timestamp`` for every partition) | ``timestamps`` (per partition)."""

    kind: str
    offsets: tuple[tuple[TopicPartition, int], ...] = ()
    timestamp: int = 0
    option: str = ""  # the option it came from, for messages

    def per_partition(self) -> dict[TopicPartition, int]:
        return dict(self.offsets)


@dataclass(frozen=True)
class SourceOptions:
    path: str
    subscription: Subscription
    starting: OffsetSpec | None  # None: the default (latest streaming, earliest batch)
    ending: OffsetSpec | None  # None: latest
    timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    isolation_level: str = "read_uncommitted"
    group_id: str = ""
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials
    given: tuple[str, ...] = ()  # canonical names of the options given

    def for_stream(self) -> SourceOptions:
        """Check the options for a streaming query (Kafka's ``validateStreamOptions``)."""
        for name, what in (
            ("endingOffsets", "ending offset"),
            ("endingOffsetsByTimestamp", "ending timestamp"),
            ("endingTimestamp", "ending timestamp"),
        ):
            if name in self.given:
                raise SourceOptionError(
                    f"option {name}: {what} not valid in streaming queries; it applies to batch reads "
                    "(spark.read) only"
                )
        return self

    def for_batch(self) -> SourceOptions:
        """Check the options for a batch query (Kafka's ``validateBatchOptions``)."""
        code = {"earliest": EARLIEST, "latest": LATEST}
        for option, spec, word, bad, good in (
            ("startingOffsets", self.starting, "starting", "latest", "earliest"),
            ("endingOffsets", self.ending, "ending", "earliest", "latest"),
        ):
            if spec is not None and spec.kind == bad:
                raise SourceOptionError(
                    f"option {option}: {word} offset can't be {bad} for batch queries; valid values for "
                    f"batch queries: {good} or JSON offsets ({code[good]} {good})"
                )
            for (t, p), off in spec.offsets if spec is not None and spec.kind == "offsets" else ():
                if off == code[bad]:
                    raise SourceOptionError(
                        f"option {option}: {word} offset for {t}-{p} can't be {bad} ({code[bad]}) for batch "
                        f"queries; use {code[good]} ({good}) or an offset"
                    )
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if name in self.given:
                log.warning("option %s is ignored in batch queries", name)
        return self


# ============================================================================ parsing


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate the options of a ``pylog`` read; raises :class:`SourceOptionError`."""
    given = read_options(raw, "source", SourceOptionError)
    opts = given.options
    path = opts.get("path", "").strip()
    if not path:
        raise SourceOptionError(
            "option path is required: the pylog root directory (a local path or file:// URL), e.g. "
            ".option('path', '/data/events') or .load('/data/events')"
        )
    # the options of a simple type: one typed value each, by the declaration's parser
    typed = {o.name: o.parse(opts, SourceOptionError) for o in SOURCE_OPTIONS if o.kind not in SPECIFIC}
    subscription = _subscription(opts)
    starting = _offset_spec(opts, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets")
    ending = _offset_spec(opts, "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
    max_opt, min_opt = typed["maxOffsetsPerTrigger"], typed["minOffsetsPerTrigger"]
    if max_opt is not None and min_opt is not None and min_opt > max_opt:
        raise SourceOptionError(
            f"option minOffsetsPerTrigger: the value of minOffsetsPerTrigger ({min_opt}) is higher than "
            f"maxOffsetsPerTrigger ({max_opt}); it must be at most maxOffsetsPerTrigger"
        )
    return SourceOptions(
        path=path,
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy=typed["startingOffsetsByTimestampStrategy"],
        fail_on_data_loss=typed["failOnDataLoss"],
        max_offsets_per_trigger=max_opt,
        min_offsets_per_trigger=min_opt,
        max_trigger_delay_ms=typed["maxTriggerDelay"],
        min_partitions=typed["minPartitions"],
        max_records_per_partition=typed["maxRecordsPerPartition"],
        include_headers=typed["includeHeaders"],
        isolation_level=typed["isolationLevel"],
        group_id=_group_id(opts, path, subscription),
        storage_options=given.storage,
        given=tuple(sorted(opts)),
    )


def _group_id(opts: Mapping[str, str], path: str, subscription: Subscription) -> str:
    group_id = opts.get("groupId", "").strip()
    if group_id and not _GROUP_RE.fullmatch(group_id):
        raise SourceOptionError(
            f"option groupId: {show(group_id)} is not valid; valid values: 1 to 200 characters from "
            "[a-zA-Z0-9._-]"
        )
    if group_id:
        if "groupIdPrefix" in opts:
            log.warning("option groupIdPrefix is ignored as groupId (kafka.group.id) is set")
        return group_id
    prefix = opts.get("groupIdPrefix", DEFAULT_GROUP_ID_PREFIX).strip()
    if not _GROUP_RE.fullmatch(prefix) or len(prefix) > 180:
        raise SourceOptionError(
            f"option groupIdPrefix: {show(prefix)} is not valid; valid values: 1 to 180 characters "
            "from [a-zA-Z0-9._-]"
        )
    # as Kafka's source: a group of its own for each run of a query, so that concurrent
    # queries never overwrite each other's record (the hash says which path and subscription)
    return f"{prefix}-{uuid.uuid4().hex[:16]}-{_fingerprint(path, subscription)[:8]}"


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [k for k in SUBSCRIPTIONS if k in opts]
    if not given:
        raise SourceOptionError(
            f"one of the options {', '.join(SUBSCRIPTIONS)} must be given to say which topics to read"
        )
    if len(given) > 1:
        raise SourceOptionError(
            f"only one of the options {', '.join(SUBSCRIPTIONS)} can be given; got {', '.join(given)}"
        )
    kind = given[0]
    value = opts[kind]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise SourceOptionError(
                f"option subscribe: no topics to subscribe to, as the value is {show(value)}; valid "
                "values: comma-separated topic names"
            )
        for t in topics:
            _topic(t, "subscribe")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        pattern = value.strip()
        if not pattern:
            raise SourceOptionError(
                f"option subscribePattern: the pattern to subscribe to is empty ({show(value)}); valid "
                "values: a regular expression"
            )
        try:
            compile_java(pattern)
        except JavaRegexError as e:
            raise SourceOptionError(
                f"option subscribePattern: {show(pattern)} is a Java regular expression (as in Spark's "
                f"Kafka source) that Python cannot read the same way: {e}"
            ) from None
        except re.error as e:
            raise SourceOptionError(
                f"option subscribePattern: {show(pattern)} is not a valid regular expression: {e}"
            ) from None
        return Subscription("subscribePattern", pattern=pattern)
    text = value.strip()
    if not text.startswith("{"):
        raise SourceOptionError(
            f"option assign: no topic-partitions to assign, as the value is {show(value)}; valid values: "
            + OPTIONS["assign"]
        )
    doc = _json(text, "assign", OPTIONS["assign"])
    pairs: list[TopicPartition] = []
    for topic, parts in doc.items():
        _topic(topic, "assign")
        if not isinstance(parts, list) or not all(is_int(p) and p >= 0 for p in parts):
            raise SourceOptionError(
                f"option assign: partitions of topic {topic!r} must be a JSON list of non-negative "
                f"integers, got {show(json.dumps(parts))}; valid values: {OPTIONS['assign']}"
            )
        pairs.extend((topic, int(p)) for p in parts)
    if not pairs:
        raise SourceOptionError(f"option assign: no topic-partitions to assign in {show(value)}")
    return Subscription("assign", assignment=tuple(sorted(set(pairs))))


def _offset_spec(opts: dict[str, str], ts_name: str, by_ts_name: str, offsets_name: str) -> OffsetSpec | None:
    """Kafka's precedence: the global timestamp, then per-partition timestamps, then offsets."""
    if ts_name in opts:
        ts = _long(opts, ts_name)
        if ts < 0:
            raise SourceOptionError(
                f"option {ts_name}: {ts} is not valid; valid values: {OPTIONS[ts_name]} (not negative)"
            )
        return OffsetSpec("timestamp", timestamp=ts, option=ts_name)
    if by_ts_name in opts:
        table = _partition_map(opts[by_ts_name], by_ts_name)
        for (t, p), ts in table:
            if ts < 0:
                raise SourceOptionError(
                    f"option {by_ts_name}: timestamp {ts} of {t}-{p} is negative; valid values: "
                    f"{OPTIONS[by_ts_name]}"
                )
        return OffsetSpec("timestamps", offsets=table, option=by_ts_name)
    if offsets_name in opts:
        value = opts[offsets_name].strip()
        low = value.lower()
        if low in ("earliest", "latest"):
            return OffsetSpec(low, option=offsets_name)
        if not value.startswith("{"):
            raise SourceOptionError(
                f"option {offsets_name}: {show(value)} is not valid; valid values: {OPTIONS[offsets_name]}"
            )
        table = _partition_map(value, offsets_name)
        for (t, p), off in table:
            if off < EARLIEST:
                raise SourceOptionError(
                    f"option {offsets_name}: offset {off} of {t}-{p} is not valid; valid values: an "
                    "offset >= 0, -2 (earliest) or -1 (latest)"
                )
        return OffsetSpec("offsets", offsets=table, option=offsets_name)
    return None


def _partition_map(text: str, name: str) -> tuple[tuple[TopicPartition, int], ...]:
    doc = _json(text, name, OPTIONS[name])
    out: list[tuple[TopicPartition, int]] = []
    for topic, parts in doc.items():
        _topic(topic, name)
        if not isinstance(parts, dict):
            raise SourceOptionError(
                f"option {name}: the value for topic {topic!r} must be a JSON object "
                f'{{"<partition>": <number>}}; valid values: {OPTIONS[name]}'
            )
        for p, v in parts.items():
            try:
                part = int(p)
            except ValueError:
                part = -1
            if part < 0 or str(part) != str(p).strip():
                raise SourceOptionError(
                    f"option {name}: partition {p!r} of topic {topic!r} is not a non-negative integer"
                )
            if not is_int(v) or not -(2**63) <= v <= INT64_MAX:
                raise SourceOptionError(
                    f"option {name}: the value for {topic}-{part} must be a 64-bit integer, got "
                    f"{show(json.dumps(v))}"
                )
            out.append(((topic, part), int(v)))
    if not out:
        raise SourceOptionError(
            f"option {name}: no partitions in {show(text)}; valid values: {OPTIONS[name]}"
        )
    return tuple(sorted(out))


# ============================================================================ helpers


def _json(text: str, name: str, valid: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SourceOptionError(
            f"option {name}: {show(text)} is not valid JSON ({e}); valid values: {valid}"
        ) from None
    if not isinstance(doc, dict):
        raise SourceOptionError(f"option {name}: {show(text)} is not a JSON object; valid values: {valid}")
    return doc


def _topic(name: str, option: str) -> str:
    try:
        return validate_topic_name(name)
    except ConfigError as e:
        raise SourceOptionError(f"option {option}: {e}") from None


def is_int(v: object) -> bool:
    """An ``int`` (from JSON or a Spark filter), not a ``bool``."""
    return isinstance(v, int) and not isinstance(v, bool)


def _long(opts: dict[str, str], name: str) -> int:
    text = opts[name].strip()
    if not re.fullmatch(r"[+-]?\d{1,19}", text) or not -(2**63) <= int(text) <= INT64_MAX:
        raise SourceOptionError(
            f"option {name}: {show(opts[name])} is not a 64-bit integer; valid values: {OPTIONS[name]}"
        )
    return int(text)


def _fingerprint(path: str, subscription: Subscription) -> str:
    """A digest of a query's path and subscription (part of the generated groupId)."""
    doc = json.dumps([path, subscription.describe()])
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def assignment_json(pairs: tuple[TopicPartition, ...]) -> str:
    out: dict[str, list[int]] = {}
    for t, p in pairs:
        out.setdefault(t, []).append(p)
    return json.dumps(out, separators=(",", ":"))
