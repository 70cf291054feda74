"""pylog: a Kafka-format segmented log on plain storage.

>>> import pylog
>>> root = pylog.open("/tmp/pylog-doctest")          # doctest: +SKIP
>>> root.create_topic("events", partitions=4)        # doctest: +SKIP
"""

from pylog.storage.errors import (
    ConfigError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    PylogError,
)
from pylog.storage.root.manager import Root
from pylog.storage.root.manager import open_root as open

__all__ = ["ConfigError", "CorruptRecordError", "OffsetOutOfRangeError", "PylogError", "Root", "open"]
__version__ = "0.1.0"
