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

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pylog.storage.backends.base import Storage
from pylog.storage.config import LogConfig
from pylog.storage.errors import ConfigError, CorruptMetadataError, StorageIOError, UnknownTopicError

TOPICS_FILE = "pylog-topics.json"
VERSION = 1
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


@contextlib.contextmanager
def root_step(storage: Storage, path: str, doing: str) -> Iterator[None]:
    """A step the root runs itself on ``path`` (relative to the root; "" for the root
    directory): an ``OSError`` becomes a :class:`StorageIOError` naming the file (one that
    already names its file, a backend's, passes unchanged)."""
    try:
        yield
    except StorageIOError:
        raise
    except OSError as e:
        where = f"{storage.describe()}/{path}" if path else storage.describe()
        raise StorageIOError.wrap(e, e.filename if e.filename is not None else where, doing) from e


def partition_dir(topic: str, partition: int) -> str:
    """The directory of one partition, relative to the root (Kafka's ``<topic>-<partition>``)."""
    return f"{topic}-{partition}"


MAX_PARTITIONS = 1 << 20
"""The most partitions a topic may have (1048576): far above what one root holds in practice
(each partition is a directory with at least one segment), low enough that a typo cannot
create millions of directories."""


def partition_count_problem(value: Any, name: str = "partitions") -> str | None:
    """Why ``value`` is not a valid partition count (an integer in 1..:data:`MAX_PARTITIONS`), or None."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PARTITIONS:
        return f"{name} must be an integer in [1, {MAX_PARTITIONS}], got {value!r}"
    return None


def partition_count(value: Any, name: str = "partitions") -> int:
    """``value`` if it is a valid partition count (see :func:`partition_count_problem`), else a
    :class:`ConfigError`; checked before anything is written."""
    problem = partition_count_problem(value, name)
    if problem is not None:
        raise ConfigError(problem)
    return int(value)


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
        with root_step(storage, TOPICS_FILE, "read it"):
            data = storage.read(TOPICS_FILE) if storage.exists(TOPICS_FILE) else None
        if data is not None:
            return cls(storage, _parse(data, f"{storage.describe()}/{TOPICS_FILE}"))
        inferred: dict[str, int] = {}
        with root_step(storage, "", "list the partition directories of"):
            names = [n for n in storage.listdir("") if _PARTITION_DIR.match(n) and storage.isdir(n)]
        for name in names:
            m = _PARTITION_DIR.match(name)
            if m:
                if int(m.group(2)) >= MAX_PARTITIONS:
                    raise CorruptMetadataError(
                        f"{storage.describe()}/{name}: a partition directory beyond the limit of "
                        f"{MAX_PARTITIONS} partitions per topic (no {TOPICS_FILE} says which topics "
                        "there are)"
                    )
                inferred[m.group(1)] = max(inferred.get(m.group(1), 0), int(m.group(2)) + 1)
        return cls(storage, {t: {"partitions": n, "config": {}} for t, n in inferred.items()})

    def save(self) -> None:
        doc = {"version": VERSION, "topics": self._topics}
        with root_step(self.storage, TOPICS_FILE, "write it"):
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

    def remove_topic(self, name: str) -> None:
        """Forget a topic whose creation failed (see :meth:`Root.create_topic`)."""
        if self._topics.pop(name, None) is not None:
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
            problem = partition_count_problem(entry.get("partitions"))
            if problem is not None:
                raise ValueError(f"topic {name!r}: {problem}")
            if not isinstance(entry.get("config") or {}, dict):
                raise ValueError(f"topic {name!r}: config must be an object, got {entry['config']!r}")
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{path}: not a pylog topic metadata file: {e}") from e
