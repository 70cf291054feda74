"""Reading the immutable objects of a pylog root: small objects whole and cached, large ones by
ranged GETs with a read-ahead that grows while a scan is sequential.

Objects are never modified (a key is never reused), so a cached copy is never stale: objects up
to :data:`WHOLE_OBJECT_MAX` bytes are read whole once into the process-wide cache of
:class:`~pylog.storage.backends.objectstore.client.ObjectClient`, and a commit puts the ones it
uploaded there too (readers ask for them next).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from pylog.storage.backends.objectstore.client import ObjectClient

WHOLE_OBJECT_MAX = 1 << 20
"""Objects up to this size are read whole once and cached (immutable, so never stale)."""
FIRST_READ = 256 << 10
"""The first ranged GET of a scan of a larger object; doubles up to ``pylog.read_ahead_bytes``."""
_READ_AHEADS = 16
"""Read-ahead blocks kept (one per object being scanned) before they are all dropped."""


class ObjectReader:
    """Reads of one store's objects (thread-safe)."""

    def __init__(self, store: ObjectClient):
        self.store = store
        self._lock = threading.Lock()
        self._ra: dict[str, tuple[int, bytes, int]] = {}  # key -> (start, block, window)

    def read(self, key: str, size: int, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``key`` of ``size`` bytes (``start < end <= size``)."""
        if size <= WHOLE_OBJECT_MAX:
            return self.store.get_cached(key, size)[start:end]
        return self._ranged(key, size, start, end)

    def remember(self, uploads: Iterable[tuple[str, bytes]]) -> None:
        """Cache the small objects a commit just uploaded."""
        for key, data in uploads:
            if len(data) <= WHOLE_OBJECT_MAX:
                self.store.remember(key, data)

    def _ranged(self, key: str, size: int, start: int, end: int) -> bytes:
        """A ranged GET with a bounded read-ahead that doubles while a scan is sequential."""
        with self._lock:
            hit = self._ra.get(key)
        if hit is not None:
            bstart, block, window = hit
            if bstart <= start and end <= bstart + len(block):
                return block[start - bstart : end - bstart]
            window = (
                min(window * 2, self.store.read_ahead_bytes) if start == bstart + len(block) else FIRST_READ
            )
        else:
            window = FIRST_READ
        stop = min(size, max(end, start + window))
        block = self.store.get(key, start, stop)
        with self._lock:
            if len(self._ra) > _READ_AHEADS:
                self._ra.clear()
            self._ra[key] = (start, block, window)
        return block[: end - start]


__all__ = ["FIRST_READ", "WHOLE_OBJECT_MAX", "ObjectReader"]
