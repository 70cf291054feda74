"""Every option of the ``pylog`` source and sink, declared once.

Each :class:`Option` says its documented name, which side takes it (``source``, ``sink`` or
``both``), how its string is parsed (``kind``), its default, its valid values and what the
README says of it.  From these declarations come:

- the reading of the options Spark hands a data source (:func:`read_options`): keys are matched
  case-insensitively (Spark lower-cases them) to their documented spelling; ``storage.*`` keys
  are split off as storage options, passed on as strings (pylog's own, ``storage.pylog.*``,
  checked against their declarations in :mod:`pylog.storage.backends.objectstore.options`,
  which reads all of them); Kafka's client options (``kafka.*``) are refused (those that would
  change what is read or written), taken as a synonym, or ignored with a warning; an
  unknown key is refused with the closest documented name;
- the typed values (:meth:`Option.parse`), whose errors name the option as documented, the value
  given and the valid values;
- the README's options tables (``docs/reference.py``).

The typed values themselves are parsed by :mod:`pylog.storage.config` (integers and booleans
as Kafka's ``ConfigDef`` parses them), as topic configs are.  This module does not import
pyspark.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pylog.storage.backends.objectstore.options import PREFIX as STORAGE_OWN_PREFIX
from pylog.storage.backends.objectstore.options import check_option, did_you_mean
from pylog.storage.codec import records
from pylog.storage.config import INT32_MAX, INT64_MAX, parse_bool, parse_integer, show
from pylog.storage.errors import ConfigError
from pylog.storage.root import publish as pub
from pylog.storage.root.metadata import MAX_PARTITIONS

log = logging.getLogger("pylog.connector")

Side = Literal["source", "sink", "both"]
Kind = Literal["bool", "int", "choice", "duration", "custom", "any"]
SPECIFIC = ("custom", "any")
"""Kinds without a typed value of their own: parsed by the side's own code, or taken as given."""

STORAGE_PREFIX = "storage."
"""Options starting with this prefix are passed (without it) to the storage as fsspec options."""

_DURATION_RE = re.compile(r"\s*(-?\d+)\s*(us|ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_DURATION_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True)
class Option:
    """One option of the source or the sink."""

    name: str
    """As documented (and in messages); matched case-insensitively."""
    side: Side
    values: str
    """The valid values, as messages and the source's README table list them."""
    kind: Kind = "custom"
    """How the string is parsed: ``bool`` (true/false, any case), ``int`` (an integer literal in
    [lo, hi]), ``choice`` (one of ``choices``, any case), ``duration`` (a number with a unit,
    in milliseconds), ``any`` (accepted, no effect) or ``custom`` (by the side's own code)."""
    default: Any = None
    """The parsed value when the option is not given."""
    lo: int = 1
    hi: int = INT64_MAX
    choices: tuple[str, ...] = ()
    synonyms: tuple[str, ...] = ()
    """Kafka client options (``kafka.*``) taken as this option."""
    shown_default: str = ""
    """The default as the README's table shows it."""
    about: str = ""
    """What the option does (the sink's README table; the source's shows ``values``)."""
    note: str = ""
    """Appended to ``values`` in the README's table."""

    def parse(self, given: Mapping[str, str], error: type[ConfigError] = ConfigError) -> Any:
        """The typed value of this option in ``given`` (keyed by documented names), or its
        default; raises ``error`` naming the option, the value and the valid values."""
        text = given.get(self.name)
        if text is None:
            return self.default
        try:
            if self.kind == "bool":
                return parse_bool(text)
            if self.kind == "int":
                number = parse_integer(text)
                if not self.lo <= number <= self.hi:
                    raise ValueError(f"{number} is out of range")
                return number
            if self.kind == "choice":
                low = text.strip().lower()
                if low not in self.choices:
                    raise ValueError(f"{low!r} is not a valid choice")
                return low
            if self.kind == "duration":
                m = _DURATION_RE.fullmatch(text)
                if not m or int(m.group(1)) < 0:
                    raise ValueError(f"{text!r} is not a duration")
                return int(int(m.group(1)) * _DURATION_MS[(m.group(2) or "ms").lower()])
        except ValueError:
            raise self.invalid(text, error) from None
        return text

    def invalid(self, text: str, error: type[ConfigError] = ConfigError) -> ConfigError:
        """The error for an invalid value ``text`` of this option."""
        what = "is not a duration" if self.kind == "duration" else "is not valid"
        return error(f"option {self.name}: {show(text)} {what}; valid values: {self.values}")


def _int(name: str, side: Side, lo: int, hi: int, default: int | None, values: str, **kw: Any) -> Option:
    return Option(name, side, values, "int", default, lo, hi, **kw)


_COMPAT = "accepted for compatibility, no effect"

SOURCE_OPTIONS: tuple[Option, ...] = (
    Option(
        "path", "source",
        "the pylog root: a local path, file:// URL or object-store URL (s3://bucket/prefix) (required)",
        shown_default="required (or `.load(path)`)", note=" with `storage.*` options for object stores",
    ),
    Option(
        "subscribe", "source", "comma-separated topic names",
        shown_default="one of `subscribe`, `subscribePattern`, `assign` is required",
    ),
    Option(
        "subscribePattern", "source",
        "a Java regular expression (as in Spark) matched against whole topic names",
    ),
    Option("assign", "source", 'JSON {"topicA":[0,1],"topicB":[2,4]}'),
    Option(
        "startingOffsets", "source",
        'earliest, latest (streaming only) or JSON {"topicA":{"0":23,"1":-1}} (-2 earliest, -1 latest)',
        shown_default="`latest` for streams, `earliest` for batch reads",
    ),
    Option(
        "endingOffsets", "source",
        'latest or JSON {"topicA":{"0":50,"1":-1}} (-1 latest); batch queries only',
        shown_default="`latest`",
    ),
    Option("startingTimestamp", "source", "milliseconds since the epoch", shown_default="none"),
    Option(
        "startingOffsetsByTimestamp", "source", 'JSON {"topicA":{"0":1700000000000}}', shown_default="none"
    ),
    Option(
        "startingOffsetsByTimestampStrategy", "source", "error, latest", "choice", "error",
        choices=("error", "latest"), shown_default="`error`",
    ),
    Option(
        "endingTimestamp", "source", "milliseconds since the epoch; batch queries only", shown_default="none"
    ),
    Option(
        "endingOffsetsByTimestamp", "source", 'JSON {"topicA":{"0":1700000000000}}; batch queries only',
        shown_default="none",
    ),
    Option("failOnDataLoss", "source", "true, false", "bool", True, shown_default="`true`"),
    _int(
        "maxOffsetsPerTrigger", "source", 1, INT64_MAX, None, "a positive integer",
        shown_default="none (everything available)",
    ),
    _int(
        "minOffsetsPerTrigger", "source", 1, INT64_MAX, None,
        "a positive integer, at most maxOffsetsPerTrigger", shown_default="none",
    ),
    Option(
        "maxTriggerDelay", "source",
        "a duration such as 15m, 30s, 500ms (used with minOffsetsPerTrigger); a number with a unit us, "
        "ms, s, m, min, h or d; a bare number is milliseconds",
        "duration", 15 * 60_000, shown_default="`15m`",
    ),
    _int(
        "minPartitions", "source", 1, INT32_MAX, None, f"a positive integer up to {INT32_MAX}",
        shown_default="none (one Spark partition per topic-partition)",
    ),
    _int("maxRecordsPerPartition", "source", 1, INT64_MAX, None, "a positive integer", shown_default="none"),
    Option("includeHeaders", "source", "true, false", "bool", False, shown_default="`false`"),
    Option(
        "isolationLevel", "source", "read_uncommitted, read_committed", "choice", "read_uncommitted",
        choices=("read_uncommitted", "read_committed"), synonyms=("kafka.isolation.level",),
        shown_default="`read_uncommitted`", note=" (also `kafka.isolation.level`)",
    ),
    Option(
        "groupId", "source", "the name this query's consumed offsets are recorded under ([a-zA-Z0-9._-]+)",
        synonyms=("kafka.group.id",), note=" (also `kafka.group.id`)",
    ),
    Option("groupIdPrefix", "source", "prefix of the generated groupId"),
    # Kafka source options that have no effect on pylog; accepted so Kafka jobs keep working.
    Option("kafkaConsumer.pollTimeoutMs", "source", _COMPAT, "any"),
    Option("fetchOffset.numRetries", "source", _COMPAT, "any"),
    Option("fetchOffset.retryIntervalMs", "source", _COMPAT, "any"),
)  # fmt: skip

SINK_OPTIONS: tuple[Option, ...] = (
    Option(
        "path", "sink", "a local path or an object-store URL", shown_default="required (or `.save(path)`)",
        about="the pylog root (created if missing): a local path, or an object-store URL "
        "(`s3://bucket/prefix`) with `storage.*` options",
    ),
    Option(
        "topic", "sink", "a topic name", shown_default="the `topic` column",
        about="the topic every row goes to; overrides the `topic` column (one of the two is required)",
    ),
    _int(
        "partitions", "sink", 1, MAX_PARTITIONS, None, f"an integer from 1 to {MAX_PARTITIONS}",
        shown_default="none (the topic must exist)",
        about="create the `topic` with this many partitions if it does not exist",
    ),
    Option(
        "compression.type", "sink", "none, gzip, snappy, lz4, zstd",
        shown_default="the topic's `compression.type` (`producer`: none)",
        about="`none`, `gzip`, `snappy`, `lz4` or `zstd`",
    ),
    _int(
        "batch.size", "sink", 1 << 10, 1 << 30, records.DEFAULT_BATCH_BYTES,
        "an integer from 1024 to 1073741824", shown_default=f"`{records.DEFAULT_BATCH_BYTES}` (1 MiB)",
        about="target bytes per record batch, 1024 to 2^30",
    ),
    _int(
        "lockTimeoutMs", "sink", 0, 1 << 40, 60_000, "an integer from 0 to 1099511627776",
        shown_default="`60000`", about="how long a commit waits for another writer of the root to finish",
    ),
    Option(
        "maintenance", "sink", "true, false", "bool", True, shown_default="`true`",
        about="run retention and compaction on the partitions written after each commit",
    ),
    _int(
        "maintenance.budgetMs", "sink", 0, 1 << 40, 2000, "an integer from 0 to 1099511627776",
        shown_default="`2000`", about="time budget of that maintenance per commit",
    ),
    Option(
        "directWrites", "sink", "true, false", "bool", True, shown_default="`true`",
        about="on local disk, write tasks' staged segments around the page cache (`O_DIRECT`); `false` "
        "writes them through it, so that consumers reading the topic right after each commit read "
        "from memory instead of the disk",
    ),
    _int(
        "queryRetentionMs", "sink", 0, 1 << 50, pub.DEFAULT_QUERY_RETENTION_MS,
        "an integer from 0 to 1125899906842624", shown_default=f"`{pub.DEFAULT_QUERY_RETENTION_MS}` (7 days)",
        about="how long the root remembers a streaming query that stopped committing (its last batch id, "
        "to skip replays); a query restarted later from its checkpoint writes a replayed batch again",
    ),
    Option(
        "checkpointLocation", "sink", "a directory", "any", shown_default="Spark's",
        about="Spark's option (or `spark.sql.streaming.checkpointLocation` with `queryName`): the "
        "checkpoint keeps the query id that is the exactly-once identity of a streaming write; a "
        "new or reset checkpoint is a new query",
    ),
    Option("queryName", "sink", "a name", "any", about="Spark's option, accepted"),
)  # fmt: skip

KAFKA_REFUSED: dict[tuple[str, str], str] = {
    ("kafka.bootstrap.servers", "both"): "pylog has no brokers, it reads and writes a log directory: replace "
    "kafka.bootstrap.servers (and the other connection options) with the option path, e.g. "
    '.option("path", "/data/logs")',
    ("kafka.interceptor.classes", "both"): "Kafka option 'interceptor.classes' is not supported: pylog runs "
    "no consumer or producer interceptors, records are read and written unchanged",
    ("kafka.auto.offset.reset", "source"): "Kafka option 'auto.offset.reset' is not supported; set the "
    "source option startingOffsets to 'earliest' or 'latest' to choose where a new query starts",
    ("kafka.key.deserializer", "source"): "Kafka option 'key.deserializer' is not supported: keys are "
    "binary; use DataFrame operations to deserialize them",
    ("kafka.value.deserializer", "source"): "Kafka option 'value.deserializer' is not supported: values are "
    "binary; use DataFrame operations to deserialize them",
    ("kafka.enable.auto.commit", "source"): "Kafka option 'enable.auto.commit' is not supported",
    ("kafka.compression.type", "sink"): "would change how batches are written: use the option "
    '"compression.type"',
    ("kafka.partitioner.class", "sink"): "would change which partition each record goes to: pylog partitions "
    "as Kafka's default partitioner (murmur2 of the key); give a partition column to choose",
    ("kafka.key.serializer", "sink"): "keys are written as binary (Spark's Kafka sink refuses it too)",
    ("kafka.value.serializer", "sink"): "values are written as binary (Spark's Kafka sink refuses it too)",
}  # fmt: skip
"""Kafka client options that would change what is read or written: refused, naming what to do
instead.  Every other ``kafka.*`` option (connection, security, batching, ``acks``, retries,
polling) has nothing to act on in pylog: a warning."""


def options_of(side: Literal["source", "sink"]) -> tuple[Option, ...]:
    return SOURCE_OPTIONS if side == "source" else SINK_OPTIONS


@dataclass
class Given:
    """The options of one read or write, by documented name (strings as given)."""

    options: dict[str, str] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials
    extra: dict[str, str] = field(default_factory=dict)  # keys of ``extra_names`` (the sink: topic configs)


def read_options(
    raw: Mapping[str, Any],
    side: Literal["source", "sink"],
    error: type[ConfigError] = ConfigError,
    *,
    extra_names: Collection[str] = (),
    extra_doc: str = "",
) -> Given:
    """Match the keys of ``raw`` to the options of ``side`` (see the module docstring); keys in
    ``extra_names`` (lower case) are kept in :attr:`Given.extra`.  Raises ``error`` for a
    refused Kafka option, an option given twice with different values, or unknown keys (all of
    them, each with the closest documented name)."""
    specs = options_of(side)
    by_key = {o.name.lower(): o for o in specs}
    by_key.update({s: o for o in specs for s in o.synonyms})
    given = Given()
    ignored: list[str] = []
    unknown: list[str] = []
    keys: dict[str, str] = {}  # documented name -> the key it was given as
    for key, value in raw.items():
        if value is None:
            continue
        key, value = str(key), str(value)
        lk = key.lower()
        if lk.startswith(STORAGE_PREFIX) and len(lk) > len(STORAGE_PREFIX):
            name = key[len(STORAGE_PREFIX) :]
            given.storage[name] = _storage_value(name, value, error)
        elif (refusal := _refusal(lk, side)) is not None:
            raise error(f"option {lk}: {refusal}")
        elif lk in by_key:
            name = by_key[lk].name
            before = given.options.get(name)
            if before is not None and before != value:
                both = sorted({keys[name], lk}, key=lambda k: k.startswith("kafka."))
                raise error(
                    f"option {name} is given twice with different values, as "
                    f"{' and '.join(name if k == name.lower() else k for k in both)}; give one of them"
                )
            given.options[name] = value
            keys[name] = lk
        elif lk.startswith("kafka."):
            ignored.append(lk)
        elif lk in extra_names:
            given.extra[lk] = value
        else:
            unknown.append(key)
    if ignored:
        log.warning("Kafka client options have no effect on the pylog %s and are ignored: %s", side, ignored)
    if unknown:
        names = [o.name for o in specs]
        hints = ", ".join(
            f"{k!r} (did you mean {close}?)"
            if (close := did_you_mean(k, [*names, *extra_names]))
            else repr(k)
            for k in sorted(unknown)
        )
        raise error(
            f"unknown option{'s' if len(unknown) > 1 else ''} {hints} for the pylog {side}; valid options: "
            f"{', '.join(names)}, {STORAGE_PREFIX}* for the storage{extra_doc}"
        )
    return given


def _refusal(key: str, side: str) -> str | None:
    return KAFKA_REFUSED.get((key, "both")) or KAFKA_REFUSED.get((key, side))


def _storage_value(name: str, value: str, error: type[ConfigError]) -> str:
    """A storage option, passed on as given (the storage reads it): pylog's own are checked now,
    by their declarations in the storage layer, so that a bad one fails the query's definition."""
    if name.startswith(STORAGE_OWN_PREFIX):
        try:
            check_option(name, value, STORAGE_PREFIX)
        except ConfigError as e:
            raise error(str(e)) from None
    return value
