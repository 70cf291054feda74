"""pylog: a Kafka-format segmented log on plain storage.

>>> import pylog
>>> root = pylog.open("/tmp/pylog-doctest")          # doctest: +SKIP
>>> root.create_topic("events", partitions=4)        # doctest: +SKIP

Every error pylog raises on purpose is a :class:`PylogError`; the subclasses callers match on
are exported here (``except pylog.UnknownTopicError``), all defined in
:mod:`pylog.storage.errors`.
"""

import importlib.metadata

from pylog.storage.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    ConditionalWritesUnsupportedError,
    ConfigError,
    CorruptCheckpointError,
    CorruptIndexError,
    CorruptMetadataError,
    CorruptRecordError,
    DamagedLogError,
    DataLossError,
    DumpError,
    DuplicateBatchError,
    IndexFullError,
    InvalidOffsetError,
    LogLockedError,
    NoRootError,
    ObjectStoreError,
    OffsetOutOfRangeError,
    ProtocolError,
    PylogError,
    ReadOnlyError,
    RecordSetError,
    RecordTooLargeError,
    SinkSchemaError,
    SourceOptionError,
    StorageError,
    StorageIOError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_root as open

__all__ = [
    "CommitConflictError",
    "CommitOutcomeUnknownError",
    "ConditionalWritesUnsupportedError",
    "ConfigError",
    "CorruptCheckpointError",
    "CorruptIndexError",
    "CorruptMetadataError",
    "CorruptRecordError",
    "DamagedLogError",
    "DataLossError",
    "DumpError",
    "DuplicateBatchError",
    "IndexFullError",
    "InvalidOffsetError",
    "LogLockedError",
    "NoRootError",
    "ObjectStoreError",
    "OffsetOutOfRangeError",
    "ProtocolError",
    "PylogError",
    "ReadOnlyError",
    "RecordSetError",
    "RecordTooLargeError",
    "Root",
    "SinkSchemaError",
    "SourceOptionError",
    "StorageError",
    "StorageIOError",
    "TopicExistsError",
    "UnknownGroupError",
    "UnknownTopicError",
    "UnsupportedFormatError",
    "open",
]

try:  # the version is pyproject.toml's, as installed
    __version__ = importlib.metadata.version("pylog")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree without an install
    __version__ = "unknown"
