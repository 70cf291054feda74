"""Consumed offsets of streaming queries, recorded in the root like Kafka's committed offsets.

Each query (identified by its ``groupId`` option, see :mod:`pylog.connector.options`; without
one, each run of a query has a group of its own, as in Kafka) has one file in the root, in
Kafka's checkpoint format (version 0, count, ``<topic> <partition> <offset>`` lines;
:mod:`pylog.storage.partition.checkpoint`)::

    <root>/pylog-consumer-offsets.<groupId>

It is a file, never a directory, so neither Kafka nor pylog takes it for a partition, and it is
replaced atomically.  The source writes it in ``commit(end)``, i.e. the offsets Spark has finished
processing.  Spark calls ``commit`` for batch N only after planning batch N+1 and never for the
last batch before a stop, so the file can lag the query by one batch: it is for observing lag
(``pylog describe``), not a position a query restarts from (that is Spark's checkpoint).  The
records of groups not updated for 7 days are removed by the next query that commits on the root
(:func:`expire_consumer_offsets`).

(Storage-level: the Spark source writes these files, `pylog describe` reads them.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from urllib.parse import quote, unquote

from pylog.storage.backends.base import Storage
from pylog.storage.errors import PylogError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.checkpoint import TopicPartition

log = logging.getLogger("pylog.connector")

CONSUMER_OFFSETS_PREFIX = "pylog-consumer-offsets."
CONSUMER_METADATA_PREFIX = "pylog-consumer-metadata."
"""The metadata strings a Kafka consumer committed with its offsets (``pylog serve``), as JSON
``{"<topic>": {"<partition>": "<metadata>"}}``, beside the group's offsets file."""


def _file_part(group_id: str) -> str:
    """A group id as part of a file name: Kafka's group ids may hold any character, so those
    outside ``[A-Za-z0-9._-]`` are percent-encoded (a group id never names a path)."""
    part = quote(group_id, safe="._-")
    return part if part not in (".", "..") else quote(part.replace(".", "%2E"), safe="%")


def consumer_offsets_file(group_id: str) -> str:
    return f"{CONSUMER_OFFSETS_PREFIX}{_file_part(group_id)}"


def consumer_metadata_file(group_id: str) -> str:
    return f"{CONSUMER_METADATA_PREFIX}{_file_part(group_id)}"


def write_consumer_metadata(storage: Storage, group_id: str, metadata: Mapping[TopicPartition, str]) -> None:
    """Atomically replace the committed metadata strings of ``group_id`` (empty ones are left out)."""
    doc: dict[str, dict[str, str]] = {}
    for (topic, p), text in sorted(metadata.items()):
        if text:
            doc.setdefault(topic, {})[str(p)] = text
    storage.write_atomic(consumer_metadata_file(group_id), json.dumps(doc, sort_keys=True).encode())


def read_consumer_metadata(storage: Storage, group_id: str) -> dict[TopicPartition, str]:
    """The committed metadata strings of ``group_id`` (none: an empty mapping)."""
    name = consumer_metadata_file(group_id)
    if not storage.exists(name):
        return {}
    try:
        doc = json.loads(storage.read(name))
        return {(t, int(p)): str(v) for t, parts in doc.items() for p, v in parts.items()}
    except (ValueError, AttributeError, TypeError) as e:
        log.warning("skipping %s: not a metadata file (%s)", name, e)
        return {}


def write_consumer_offsets(storage: Storage, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Atomically replace the consumed offsets of ``group_id``."""
    ckpt.write_offsets(storage, consumer_offsets_file(group_id), offsets)


def read_consumer_offsets(storage: Storage) -> dict[str, dict[TopicPartition, int]]:
    """Every query's consumed offsets in the root: {groupId: {(topic, partition): offset}}."""
    out: dict[str, dict[TopicPartition, int]] = {}
    for name in storage.listdir(""):
        if name.startswith(CONSUMER_OFFSETS_PREFIX) and not name.endswith(".tmp") and not storage.isdir(name):
            group = unquote(name[len(CONSUMER_OFFSETS_PREFIX) :])
            try:
                out[group] = ckpt.read_offsets(storage, name)
            except PylogError as e:
                log.warning("skipping %s: %s", name, e)
    return out


CONSUMER_OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000
"""A group's record not updated for this long is removed (Kafka's ``offsets.retention.minutes``)."""


def expire_consumer_offsets(
    storage: Storage, now_ms: int, keep: str, retention_ms: int = CONSUMER_OFFSETS_RETENTION_MS
) -> list[str]:
    """Remove the records of groups other than ``keep`` not updated for ``retention_ms`` (runs
    of queries that ended: without a groupId each run has a group of its own).  Returns the
    groups removed; a record whose age is unknown is kept."""
    removed = []
    for name in storage.listdir(""):
        if not name.startswith(CONSUMER_OFFSETS_PREFIX) or name == consumer_offsets_file(keep):
            continue
        modified = storage.modified_ms(name)
        if modified is not None and now_ms - modified > retention_ms and not storage.isdir(name):
            group = unquote(name[len(CONSUMER_OFFSETS_PREFIX) :])
            storage.delete(name)
            if storage.exists(consumer_metadata_file(group)):  # a Kafka group's metadata strings
                storage.delete(consumer_metadata_file(group))
            removed.append(group)
    return removed


def consumer_lag(
    consumed: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Records between a query's consumed offsets and the log ends, per partition (a partition
    the query has not consumed yet counts from 0)."""
    return {tp: max(0, end - consumed.get(tp, 0)) for tp, end in latest.items()}
