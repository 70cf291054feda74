"""The outside objects of a pylog root on an object store: objects under ``_pylog/direct/``,
outside every state - staged sink data and consumer offsets, each written whole by one PUT
(:class:`OutsideAppend` when it is closed).

Their paths are relative to ``_pylog/direct/``.  :class:`OutsideObjects` lists them once when
needed (sizes, and the server's modification times: staged data's age) and keeps the listing up
to date with its own writes until it is told to :meth:`~OutsideObjects.forget` it.  In a
transaction, deletions are deferred to the commit (:meth:`~OutsideObjects.take_deferred`), and
a staged object the state adopted as a file (see
:meth:`~pylog.storage.backends.objectstore.storage.ObjectStorage.adopt`) is never deleted as staged data:
the owner tells which keys are adopted.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pylog.storage.backends.base import AppendFile
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.keys import OUTSIDE
from pylog.storage.errors import StorageError


class OutsideAppend(AppendFile):
    """A outside object is written whole, by one PUT, when it is closed."""

    def __init__(self, direct: OutsideObjects, path: str):
        self._direct = direct
        self._path = path
        self._buf = bytearray()
        self._closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buf += data
        return len(data)

    def size(self) -> int:
        return len(self._buf)

    def fsync(self) -> None:
        return None

    def truncate(self, size: int) -> None:
        del self._buf[size:]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._direct.put(self._path, bytes(self._buf))

    def detach(self) -> bytes:
        """The bytes written, and close without writing the object (the caller keeps them)."""
        self._closed = True
        return bytes(self._buf)


class OutsideObjects:
    """The outside objects of one store as last listed, and the deletions deferred to a commit."""

    def __init__(self, store: ObjectClient) -> None:
        self.store = store
        self._sizes: dict[str, int] | None = None
        self._mtimes: dict[str, float] = {}  # of the last listing (staged data's age)
        self.deferred: list[str] = []

    def forget(self, *, deferred: bool = False) -> None:
        """List the objects again when next needed (other processes write them too); with
        ``deferred``, drop the deferred deletions too."""
        self._sizes = None
        if deferred:
            self.deferred = []

    def listing(self) -> dict[str, int]:
        if self._sizes is None:
            listed = self.store.list(OUTSIDE)
            self._sizes = {k[len(OUTSIDE) :]: size for k, (size, _, _) in listed.items()}
            self._mtimes = {k[len(OUTSIDE) :]: mtime for k, (_, mtime, _) in listed.items()}
        return self._sizes

    def modified_ms(self, path: str) -> int | None:
        """The server's modification time as last listed."""
        if path not in self.listing():
            return None
        mtime = self._mtimes.get(path)
        return None if not mtime else int(float(mtime) * 1000)

    def read(self, path: str, start: int, end: int | None) -> bytes:
        return self.store.get(OUTSIDE + path, start or None, end)

    def size(self, path: str) -> int:
        try:
            return self.listing()[path]
        except KeyError:
            raise StorageError(f"{self.store.url}/{path}: no such object") from None

    def tops(self) -> set[str]:
        """The top-level names of the objects, but those deleted in this transaction."""
        return {p.split("/", 1)[0] for p in self.listing() if p not in self.deferred}

    def staged(self, path: str, adopted: set[str]) -> list[str]:
        """The names of the objects right under ``path``, but those deleted in this transaction
        and those whose keys are ``adopted``."""
        prefix = f"{path}/"
        return sorted(
            p[len(prefix) :]
            for p in self.listing()
            if p.startswith(prefix)
            and "/" not in p[len(prefix) :]
            and p not in self.deferred
            and OUTSIDE + p not in adopted
        )

    def put(self, path: str, data: bytes) -> None:
        self.store.put(OUTSIDE + path, data)
        if self._sizes is not None:
            self._sizes[path] = len(data)

    def put_file(self, path: str, local_path: str) -> None:
        """Upload the local file ``local_path`` as the object ``path``, streamed."""
        self.store.put_file(OUTSIDE + path, local_path)
        if self._sizes is not None:
            self._sizes[path] = os.path.getsize(local_path)

    def delete(self, path: str, *, defer: bool, adopted: Callable[[], set[str]]) -> None:
        """Delete ``path`` now, or (``defer``) when the transaction commits; not if its key is
        one of the ``adopted``."""
        if defer:  # a commit that loses a race must still find its staged data
            self.deferred.append(path)
        elif OUTSIDE + path not in adopted():
            self.store.delete([OUTSIDE + path])
        if self._sizes is not None:
            self._sizes.pop(path, None)

    def take_deferred(self, adopted: Callable[[], set[str]]) -> list[str]:
        """The keys of the deferred deletions, but the ``adopted``; none are deferred after."""
        adopted_keys = adopted() if self.deferred else set()
        keys = [OUTSIDE + p for p in self.deferred if OUTSIDE + p not in adopted_keys]
        self.deferred = []
        return keys


__all__ = ["OutsideAppend", "OutsideObjects"]
