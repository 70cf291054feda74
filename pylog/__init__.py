"""pylog: a Kafka-format segmented log on plain storage."""

from pylog.storage.errors import (
    ConfigError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    PylogError,
)

__all__ = ["ConfigError", "CorruptRecordError", "OffsetOutOfRangeError", "PylogError"]
__version__ = "0.1.0"
