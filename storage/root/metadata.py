"""The topics of a root: their partition counts and configs, and where their partitions live.

    <root>/pylog-topics.json   {"version": 1,
                                "topics": {"<topic>": {"partitions": <count>,
                                                       "config": {"<Kafka topic config>": "<value>"}}}}
    <root>/<topic>-<partition>/   one Kafka partition directory each

Topic metadata lives in a *file*, which Kafka never mistakes for a partition (it only loads
directories); it is replaced atomically, and holds only the configs that differ from Kafka's
defaults.  A Kafka log directory without ``pylog-topics.json`` (copied from a broker) has its
topics and partition counts inferred from the directory names, with default configs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pylog.storage.backends.fs import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import ConfigError, CorruptMetadataError, UnknownTopicError

TOPICS_FILE = "pylog-topics.json"
VERSION = 1
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def partition_dir(topic: str, partition: int) -> str:
    """The directory of one partition, relative to the root (Kafka's ``<topic>-<partition>``)."""
    return f"{topic}-{partition}"


def positive_count(value: Any, name: str) -> int:
    """``value`` if it is a positive integer (a partition count), else a :class:`ConfigError`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def explicit_configs(cfg: LogConfig) -> dict[str, str]:
    """The topic configs that differ from Kafka's defaults, by their topic names."""
    defaults = LogConfig().to_dict()
    return {k: v for k, v in cfg.to_dict().items() if defaults.get(k) != v}


class TopicMetadata:
    """The topics of the root in ``storage``, as read when loaded; changes are saved at once."""

    def __init__(self, storage: Storage, topics: dict[str, dict[str, Any]]) -> None:
        self.storage = storage
        self._topics = topics

    @classmethod
    def load(cls, storage: Storage) -> TopicMetadata:
        """``pylog-topics.json``, or the topics inferred from the partition directories without it."""
        if storage.exists(TOPICS_FILE):
            return cls(storage, _parse(storage.read(TOPICS_FILE), f"{storage.describe()}/{TOPICS_FILE}"))
        inferred: dict[str, int] = {}
        for name in storage.listdir(""):
            m = _PARTITION_DIR.match(name)
            if m and storage.isdir(name):
                inferred[m.group(1)] = max(inferred.get(m.group(1), 0), int(m.group(2)) + 1)
        return cls(storage, {t: {"partitions": n, "config": {}} for t, n in inferred.items()})

    def save(self) -> None:
        doc = {"version": VERSION, "topics": self._topics}
        self.storage.write_atomic(TOPICS_FILE, json.dumps(doc, indent=1, sort_keys=True).encode())

    def names(self) -> list[str]:
        return sorted(self._topics)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def entry(self, topic: str) -> dict[str, Any]:
        """The metadata of ``topic`` (``partitions``, ``config``: explicit configs)."""
        try:
            return self._topics[topic]
        except KeyError:
            raise UnknownTopicError(
                f"unknown topic {topic!r} in {self.storage.describe()}; "
                f"topics: {', '.join(self.names()) or 'none'}"
            ) from None

    def partitions(self, topic: str) -> int:
        return int(self.entry(topic)["partitions"])

    def config(self, topic: str) -> LogConfig:
        return LogConfig.from_dict(self.entry(topic).get("config") or {})

    def add_topic(self, name: str, partitions: int, config: LogConfig) -> None:
        self._topics[name] = {"partitions": partitions, "config": explicit_configs(config)}
        self.save()

    def set_partitions(self, topic: str, partitions: int) -> None:
        self.entry(topic)["partitions"] = partitions
        self.save()

    def merge_config(self, topic: str, config: Mapping[str, Any]) -> LogConfig:
        """Merge Kafka topic configs into ``topic``'s; returns its new (validated) config."""
        entry = self.entry(topic)
        merged = dict(entry.get("config") or {})
        merged.update({k: str(v) for k, v in config.items()})
        cfg = LogConfig.from_dict(merged)
        entry["config"] = explicit_configs(cfg)
        self.save()
        return cfg


def _parse(data: bytes, path: str) -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads(data)
        topics = doc["topics"]
        if doc.get("version") != VERSION or not isinstance(topics, dict):
            raise ValueError(f"unsupported version {doc.get('version')!r}")
        out = {str(k): dict(v) for k, v in topics.items()}
        for name, entry in out.items():
            n = entry.get("partitions")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"topic {name!r}: partitions must be a positive integer, got {n!r}")
            if not isinstance(entry.get("config") or {}, dict):
                raise ValueError(f"topic {name!r}: config must be an object, got {entry['config']!r}")
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{path}: not a pylog topic metadata file: {e}") from e
