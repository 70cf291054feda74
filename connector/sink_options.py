"""The pylog sink's options and column contract, checked on the driver before any task runs.

:func:`parse_sink_options` turns the string options of ``df.write`` / ``df.writeStream`` (keys
case-insensitive) into a :class:`SinkOptions`, raising :class:`ConfigError` that names the option
for anything invalid; :func:`check_schema` checks the DataFrame's columns against Spark's Kafka
sink contract.  The sink (:mod:`.sink`) documents both and uses them in ``make_writer``.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import overload

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pylog.storage.codec import records
from pylog.storage.codec.compression import codec_id
from pylog.storage.config import LogConfig, validate_topic_name
from pylog.storage.errors import ConfigError, SinkSchemaError
from pylog.storage.root import publish as pub
from pylog.storage.root.metadata import MAX_PARTITIONS

log = logging.getLogger("pylog.connector")

KAFKA_OPTIONS_REFUSED = {
    "kafka.compression.type": 'would change how batches are written: use the option "compression.type"',
    "kafka.partitioner.class": "would change which partition each record goes to: pylog partitions as "
    "Kafka's default partitioner (murmur2 of the key); give a partition column to choose",
    "kafka.key.serializer": "keys are written as binary (Spark's Kafka sink refuses it too)",
    "kafka.value.serializer": "values are written as binary (Spark's Kafka sink refuses it too)",
    "kafka.interceptor.classes": "pylog runs no producer interceptors: the records would be written "
    "unchanged",
}
"""Producer options (``kafka.*``) that would change what is written: refused, naming what to do
instead.  Every other ``kafka.*`` option (connection, security, batching, ``acks``, retries)
has nothing to act on in pylog, whose publish is durable and exactly once: a warning."""

SINK_OPTIONS = {
    "path",
    "topic",
    "partitions",
    "compression.type",
    "batch.size",
    "locktimeoutms",
    "maintenance",
    "maintenance.budgetms",
    "directwrites",
    "queryretentionms",
    "checkpointlocation",
    "queryname",
}
SPELLING = {
    name.lower(): name
    for name in (
        "lockTimeoutMs",
        "maintenance.budgetMs",
        "directWrites",
        "queryRetentionMs",
        "checkpointLocation",
        "queryName",
    )
}
"""The documented spelling of option names (Spark hands them over lower-cased), for messages."""
_BINARY_OR_STRING = (BinaryType, StringType)


def _named(key: str) -> str:
    return SPELLING.get(key, key)


@dataclass(frozen=True)
class SinkOptions:
    path: str
    topic: str | None
    partitions: int | None
    topic_config: dict[str, str]
    codec: str | None
    batch_bytes: int
    lock_timeout_s: float
    maintenance: bool
    maintenance_budget_ms: int
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    sink_id: str = ""  # a batch write's own id; a streaming query's pre-query-id (version 1) key
    query_retention_ms: int = pub.DEFAULT_QUERY_RETENTION_MS
    direct_writes: bool = True  # staged segments written around the page cache (local disk)


def parse_sink_options(raw: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    path = opts.get("path", "").strip()
    if not path:
        raise ConfigError('option path is required: .option("path", "/data/logs") or .save("/data/logs")')
    storage = {k[len("storage.") :]: v for k, v in opts.items() if k.startswith("storage.")}
    topic_config: dict[str, str] = {}
    valid = set(LogConfig.valid_keys())
    unknown = []
    for k, v in opts.items():
        if k in SINK_OPTIONS or k.startswith("storage."):
            continue
        if k == "kafka.bootstrap.servers":
            raise ConfigError(
                "option kafka.bootstrap.servers: pylog has no brokers; replace it with the option path "
                '(.option("path", "/data/logs"))'
            )
        if k in KAFKA_OPTIONS_REFUSED:
            raise ConfigError(f"option {k}: {KAFKA_OPTIONS_REFUSED[k]}")
        if k.startswith("kafka."):  # connection, security, batching, acks, retries: nothing to do
            log.warning("Kafka producer option %s has no effect on pylog", k)
            continue
        if k in valid:
            topic_config[k] = v
        else:
            unknown.append(k)
    if unknown:
        mine = ", ".join(sorted(_named(k) for k in SINK_OPTIONS - {"checkpointlocation", "queryname"}))
        hints = [
            f"{k} (did you mean {_named(close[0])}?)" if (close := _close(k, SINK_OPTIONS | valid)) else k
            for k in sorted(unknown)
        ]
        raise ConfigError(
            f"unknown pylog sink option(s) {', '.join(hints)}; valid: {mine}, storage.* and Kafka topic "
            f"configs ({', '.join(sorted(valid)[:6])}, ...)"
        )
    LogConfig.from_dict(topic_config)  # validate now, before any byte is written
    partitions = _int_option(opts, "partitions", 1, MAX_PARTITIONS)
    codec = opts.get("compression.type")
    if codec is not None:
        codec_id(codec.replace("uncompressed", "none"))
    if streaming and not opts.get("checkpointlocation"):
        sink_id = "q" + uuid.uuid4().hex[:20]
    else:
        basis = opts.get("checkpointlocation") or uuid.uuid4().hex
        sink_id = "q" + hashlib.sha256(basis.encode()).hexdigest()[:24]
    topic = opts.get("topic") or None
    if topic is not None:
        try:
            validate_topic_name(topic)
        except ConfigError as e:
            raise ConfigError(f"option topic: {e}") from None
    maintenance, direct_writes = (_bool_option(opts, name, True) for name in ("maintenance", "directwrites"))
    return SinkOptions(
        path=path,
        topic=topic,
        partitions=partitions,
        topic_config=topic_config,
        codec=codec,
        batch_bytes=_int_option(opts, "batch.size", 1 << 10, 1 << 30, records.DEFAULT_BATCH_BYTES),
        lock_timeout_s=_int_option(opts, "locktimeoutms", 0, 1 << 40, 60_000) / 1000.0,
        maintenance=maintenance,
        maintenance_budget_ms=_int_option(opts, "maintenance.budgetms", 0, 1 << 40, 2000),
        storage_options=storage,
        sink_id=sink_id,
        query_retention_ms=_int_option(opts, "queryretentionms", 0, 1 << 50, pub.DEFAULT_QUERY_RETENTION_MS),
        direct_writes=direct_writes,
    )


def _close(key: str, names: set[str]) -> list[str]:
    return difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.8)


def _bool_option(opts: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in opts:
        return default
    value = opts[name].strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {_named(name)}: {opts[name]!r} is not valid; valid values: true, false")
    return value == "true"


@overload
def _int_option(opts: Mapping[str, str], name: str, lo: int, hi: int) -> int | None: ...
@overload
def _int_option(opts: Mapping[str, str], name: str, lo: int, hi: int, default: int) -> int: ...
def _int_option(
    opts: Mapping[str, str], name: str, lo: int, hi: int, default: int | None = None
) -> int | None:
    if name not in opts:
        return default
    try:
        v = int(opts[name])
    except ValueError:
        raise ConfigError(
            f"option {_named(name)}: {opts[name]!r} is not an integer; expected {lo}..{hi}"
        ) from None
    if not lo <= v <= hi:
        raise ConfigError(f"option {_named(name)}: {v} is out of range; expected {lo}..{hi}")
    return v


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """Spark's Kafka sink column contract, checked on the driver before any task runs."""
    fields = {f.name: f.dataType for f in schema.fields}

    def need(name: str, ok: tuple[type[DataType], ...], what: str) -> None:
        if name in fields and not isinstance(fields[name], ok):
            raise SinkSchemaError(f"column {name!r} must be {what}, not {fields[name].simpleString()}")

    if "value" not in fields:
        raise SinkSchemaError(
            f"the DataFrame needs a 'value' column (binary or string); it has {sorted(fields)}"
        )
    need("value", _BINARY_OR_STRING, "binary or string")
    need("key", _BINARY_OR_STRING, "binary or string")
    need("topic", (StringType,), "string")
    need("partition", (IntegerType,), "int (cast it: col('partition').cast('int'))")
    need("timestamp", (TimestampType, TimestampNTZType, LongType), "timestamp")
    if "headers" in fields:
        h = fields["headers"]
        ok = (
            isinstance(h, ArrayType)
            and isinstance(h.elementType, StructType)
            and [f.name for f in h.elementType.fields] == ["key", "value"]
            and isinstance(h.elementType.fields[0].dataType, StringType)
            and isinstance(h.elementType.fields[1].dataType, BinaryType)
        )
        if not ok:
            raise SinkSchemaError(
                f"column 'headers' must be array<struct<key:string,value:binary>>, not {h.simpleString()}"
            )
    if opts.topic is None and "topic" not in fields:
        raise SinkSchemaError(
            "no topic: set .option(\"topic\", ...) or add a string column 'topic' to the DataFrame"
        )
