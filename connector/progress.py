"""Consumed offsets of streaming queries: see :mod:`pylog.storage.root.consumers` (re-exported)."""

from pylog.storage.root.consumers import (
    CONSUMER_OFFSETS_PREFIX,
    consumer_lag,
    consumer_offsets_file,
    expire_consumer_offsets,
    read_consumer_offsets,
    write_consumer_offsets,
)

__all__ = [
    "CONSUMER_OFFSETS_PREFIX",
    "consumer_lag",
    "consumer_offsets_file",
    "expire_consumer_offsets",
    "read_consumer_offsets",
    "write_consumer_offsets",
]
