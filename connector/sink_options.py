"""What the pylog sink's driver and its tasks agree on: the options, the column contract, the
topics' metadata and the commit message.

:func:`parse_sink_options` turns the string options of ``df.write`` / ``df.writeStream`` (keys
case-insensitive, declared in :mod:`.optionspec`) into a :class:`SinkOptions`, raising
:class:`ConfigError` that names the option for anything invalid; :func:`check_schema` checks the
DataFrame's columns against Spark's Kafka sink contract.  The sink (:mod:`.sink`) documents both
and uses them in ``make_writer``; the tasks (:mod:`.sink_task`) send a :class:`PylogCommitMessage`
each to the driver's commit (:mod:`.sink_commit`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
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

from pylog.connector.optionspec import SINK_OPTIONS as SPECS
from pylog.connector.optionspec import SPECIFIC, read_options
from pylog.storage.codec.compression import codec_id
from pylog.storage.config import LogConfig, validate_topic_name
from pylog.storage.errors import ConfigError, SinkSchemaError
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_root

SINK_OPTIONS = frozenset(o.name.lower() for o in SPECS)
"""The sink's options as Spark hands them over (lower-cased); declared in :mod:`.optionspec`."""
_BINARY_OR_STRING = (BinaryType, StringType)


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
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials
    sink_id: str = ""  # a batch write's own id; a streaming write's when its tasks send no query id
    query_retention_ms: int = pub.DEFAULT_QUERY_RETENTION_MS
    direct_writes: bool = True  # staged segments written around the page cache (local disk)


TopicMeta = dict[str, tuple[int, LogConfig]]
"""Partition count and config per topic, as the driver read them when it planned the write."""


@dataclass
class PylogCommitMessage(WriterCommitMessage):
    """What a task staged (sent to the driver's commit)."""

    staged: list[dict[str, object]]
    records: int
    query_id: str | None = None  # Spark's streaming query id (None: a batch write)


KNOWN_STATE_S = 30.0
"""On an object store, the planning of a micro-batch and its commit start from the root's state
this process confirmed newest at most this long ago (its previous commit, typically) instead of
asking the store: a Kafka producer's metadata is as old; a commit is conditional, and one that
meets a newer state re-bases or runs again there (whether the batch is already committed is
always decided on the newest state)."""


def open_sink_root(opts: SinkOptions, *, read_only: bool, trust_known: bool = False) -> Root:
    """The root the sink writes, for the driver (planning, commit) or a task (a topic's metadata)."""
    return open_root(
        opts.path,
        opts.storage_options or None,
        read_only=read_only,
        lock_timeout=opts.lock_timeout_s,
        trust_known_s=KNOWN_STATE_S if trust_known else 0.0,
    )


def parse_sink_options(raw: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """Validate the options of a ``pylog`` write; raises :class:`ConfigError` naming the option."""
    valid = LogConfig.valid_keys()
    given = read_options(
        raw,
        "sink",
        extra_names=valid,
        extra_doc=f" and Kafka topic configs ({', '.join(valid[:6])}, ...)",
    )
    opts = given.options
    path = opts.get("path", "").strip()
    if not path:
        raise ConfigError('option path is required: .option("path", "/data/logs") or .save("/data/logs")')
    LogConfig.from_dict(given.extra)  # validate now, before any byte is written
    # the options of a simple type: one typed value each, by the declaration's parser
    typed = {o.name: o.parse(opts) for o in SPECS if o.kind not in SPECIFIC}
    codec = opts.get("compression.type")
    if codec is not None:
        codec_id(codec.replace("uncompressed", "none"))
    checkpoint = opts.get("checkpointLocation")
    if streaming and not checkpoint:
        sink_id = "q" + uuid.uuid4().hex[:20]
    else:
        basis = checkpoint or uuid.uuid4().hex
        sink_id = "q" + hashlib.sha256(basis.encode()).hexdigest()[:24]
    topic = opts.get("topic") or None
    if topic is not None:
        try:
            validate_topic_name(topic)
        except ConfigError as e:
            raise ConfigError(f"option topic: {e}") from None
    return SinkOptions(
        path=path,
        topic=topic,
        partitions=typed["partitions"],
        topic_config=given.extra,
        codec=codec,
        batch_bytes=typed["batch.size"],
        lock_timeout_s=typed["lockTimeoutMs"] / 1000.0,
        maintenance=typed["maintenance"],
        maintenance_budget_ms=typed["maintenance.budgetMs"],
        storage_options=given.storage,
        sink_id=sink_id,
        query_retention_ms=typed["queryRetentionMs"],
        direct_writes=typed["directWrites"],
    )


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
