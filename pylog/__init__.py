"""pylog: a Kafka-format segmented log on plain storage.

>>> import pylog
>>> root = pylog.open("/tmp/pylog-doctest")          # doctest: +SKIP
>>> root.create_topic("events", partitions=4)        # doctest: +SKIP

Every error pylog raises on purpose is a :class:`PylogError`; the subclasses callers match on
are exported here (``except pylog.UnknownTopicError``), all defined in
:mod:`pylog.storage.errors`.
"""

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
    "UnknownTopicError",
    "UnsupportedFormatError",
    "open",
]
__version__ = "0.1.0"
