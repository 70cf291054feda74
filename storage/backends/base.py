"""The storage seam: every file operation of the log engine goes through a ``Storage``.

Paths are always *relative to the root* of a pylog directory, with ``/`` separators
(``"events-0/00000000000000000000.log"``).  :meth:`Storage.resolve` refuses anything that
could leave the root (absolute paths, ``..``, empty or NUL components), so no option or file
name can make pylog read or write outside it.

Two implementations: local disk, :class:`pylog.storage.backends.local.LocalStorage` (Kafka's
mechanisms: appends to open files, fsync of files and directories, durable replacement), and
object stores, :class:`pylog.storage.backends.objectstore.storage.ObjectStorage`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from pylog.storage.errors import StorageError, StorageIOError

STAGE_PREFIX = ".pylog-stage."
"""Names of staged sink data (``.pylog-stage.<query>.<batch>.<task>.<attempt>``)."""


class AppendFile(ABC):
    """A file opened for appending (the active segment and its indexes)."""

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> int: ...

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def fsync(self) -> None: ...

    @abstractmethod
    def truncate(self, size: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class Storage(ABC):
    """File operations the log engine needs, on paths relative to one root."""

    @abstractmethod
    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of a file (``end`` None: to the end of the file)."""

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def listdir(self, path: str = "") -> list[str]:
        """Names (not paths) in a directory, sorted; [] if it does not exist."""

    def listdir_staged(self, path: str) -> list[str]:
        """Names of the staged sink files (``.pylog-stage.*``) in a directory.  On an object
        store they live outside the published tree and are listed only when asked for here."""
        return [n for n in self.listdir(path) if n.startswith(STAGE_PREFIX)]

    @abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def open_append(self, path: str, *, direct: bool = False) -> AppendFile:
        """Open (creating if needed) a file for appending at its end."""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Durably replace ``path`` with ``data``: readers see the old or the new bytes."""

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Rename within the root (atomic on local disk; replaces ``dst``)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file; a missing file is not an error."""

    @abstractmethod
    def rmdir(self, path: str) -> None:
        """Delete an empty directory."""

    @abstractmethod
    def truncate(self, path: str, size: int) -> None: ...

    def modified_ms(self, path: str) -> int | None:
        """When ``path`` was last modified (ms since the epoch), or None when unknown."""
        return None

    def identity(self, path: str) -> str | None:
        """A token that changes whenever the file at ``path`` is replaced or modified (None if
        it does not exist), so that a change made while the file was read can be detected.
        By default its size; a local disk adds the inode and the modification time."""
        return str(self.size(path)) if self.exists(path) else None

    def open_reader(self, path: str) -> contextlib.AbstractContextManager[Callable[[int, int], bytes]]:
        """A ``read(start, end)`` of ``path`` for many small reads in a row (one open file on a
        local disk); by default :meth:`read` each time."""
        return contextlib.nullcontext(lambda start, end: self.read(path, start, end))

    external_changes = True
    """True where other programs can rename, copy or remove a root's files behind pylog's back
    (a directory: ``mv``, ``cp``, a restore), so that a writer checks the files it will recover
    against their names; False where every change is one of pylog's own commits (an object
    store's manifests)."""

    writes_in_place = False
    """True if :meth:`write_at` is supported: files are modified in place (a local disk), so a
    staged segment can be patched and renamed into a log instead of being copied."""

    def adopt(self, staged: str, path: str, size: int, patch: bytes | None = None) -> None:
        """Make the staged object ``staged`` (of ``size`` bytes) the file ``path`` without
        copying it, read with ``patch`` over it: object stores only."""
        raise StorageError(f"{self.describe()}/{path}: this storage cannot adopt staged objects")

    def write_at(self, path: str, edits: list[tuple[int, bytes]]) -> None:
        """Overwrite bytes of an existing file in place (``(position, bytes)`` each, inside the
        file) and fsync it.  Only where :attr:`writes_in_place`."""
        raise StorageError(f"{self.describe()}/{path}: this storage cannot modify files in place")

    @abstractmethod
    def fsync_dir(self, path: str = "") -> None:
        """Make renames, creations and deletions in a directory durable."""

    @abstractmethod
    def lock(self, path: str) -> contextlib.AbstractContextManager[None]:
        """An exclusive, non-blocking inter-process lock held for the context's duration."""

    def describe(self) -> str:
        return self.__class__.__name__

    def refresh_snapshot(self) -> bool:
        """For a storage that shows one snapshot of the root (an object store's manifest), move
        a reader to the newest one; True if it moved.  A local disk always shows the present."""
        return False

    @staticmethod
    def check_relative(path: str) -> str:
        """Normalise a root-relative path, refusing anything that could leave the root."""
        if not isinstance(path, str):
            raise StorageError(f"path must be a string, got {type(path).__name__}")
        if path in ("", "."):
            return ""
        if path.startswith("/") or "\\" in path or "\x00" in path:
            raise StorageError(f"path {path!r} must be relative to the root, with '/' separators")
        parts = path.split("/")
        if ".." in parts:
            raise StorageError(f"path {path!r} leaves the root ('..' is not allowed)")
        if "" not in parts and "." not in parts:
            return path  # already normal (the usual case)
        return "/".join(p for p in parts if p not in ("", "."))


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


@contextlib.contextmanager
def naming_errors(path: object, doing: str) -> Iterator[None]:
    """An ``OSError`` (disk full, EIO, EACCES, a directory where a file belongs...) becomes a
    :class:`StorageIOError` naming ``path`` and what was being done (still an ``OSError``)."""
    try:
        yield
    except StorageIOError:
        raise
    except OSError as e:
        raise StorageIOError.wrap(e, path, doing) from e


__all__ = ["STAGE_PREFIX", "AppendFile", "Storage", "StorageError", "join", "naming_errors"]
