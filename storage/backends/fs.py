"""The storage seam: every file operation of the log engine goes through a ``Storage``.

Paths are always *relative to the root* of a pylog directory, with ``/`` separators
(``"events-0/00000000000000000000.log"``).  :meth:`Storage.resolve` refuses anything that
could leave the root (absolute paths, ``..``, empty or NUL components), so no option or file
name can make pylog read or write outside it.

``LocalStorage`` implements Kafka's local-disk mechanisms: appends to open files, fsync of
files and directories, and durable replacement (tmp file in the same directory → fsync →
``os.replace`` → fsync the directory).  An object-store implementation follows the same
interface: :class:`pylog.storage.backends.objectfs.ObjectStorage`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pylog.storage.errors import LogLockedError, StorageError, StorageIOError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


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
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists; True if this call created it."""

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
def _naming(path: object, doing: str) -> Iterator[None]:
    """An ``OSError`` (disk full, EIO, EACCES, a directory where a file belongs...) becomes a
    :class:`StorageIOError` naming ``path`` and what was being done (still an ``OSError``)."""
    try:
        yield
    except StorageIOError:
        raise
    except OSError as e:
        raise StorageIOError.wrap(e, path, doing) from e


class _LocalAppend(AppendFile):
    def __init__(self, path: Path):
        self._path = path
        # unbuffered: every write reaches the page cache at once, visible to readers
        with _naming(path, "open it for appending"):
            self._f: BinaryIO = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
            self._size = self._f.seek(0, os.SEEK_END)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with _naming(self._path, "append to it"):
            n = self._f.write(data)
        self._size += n
        return n

    def size(self) -> int:
        return self._size

    def fsync(self) -> None:
        with _naming(self._path, "fsync it"):
            self._f.flush()
            os.fsync(self._f.fileno())

    def truncate(self, size: int) -> None:
        with _naming(self._path, f"truncate it to {size} bytes"):
            self._f.flush()
            self._f.truncate(size)
            self._f.seek(0, os.SEEK_END)
        self._size = size

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


_DIRECT: int | None = getattr(os, "O_DIRECT", None)
_BLOCK = 4096  # O_DIRECT alignment of memory, file offsets and sizes (a page: enough for any disk)
_DIRECT_CHUNK = 4 << 20
_direct_buffers = threading.local()


def _aligned_buffer() -> memoryview:
    """This thread's page-aligned buffer for direct writes (one per thread, not per file: a
    task appending to many partitions' files at once holds one)."""
    view: memoryview | None = getattr(_direct_buffers, "view", None)
    if view is None:
        import mmap

        # private: a process forked after writing must not share it with its parent
        view = _direct_buffers.view = memoryview(mmap.mmap(-1, _DIRECT_CHUNK, flags=mmap.MAP_PRIVATE))
    return view


def _write_all(fd: int, data: memoryview, position: int, path: Path) -> None:
    """``data`` at ``position``, however many writes it takes (a short write is not an error
    until nothing at all can be written)."""
    done = 0
    while done < len(data):
        n = os.pwrite(fd, data[done:], position + done)
        if n <= 0:
            raise StorageIOError.wrap(OSError(errno.EIO, "no byte written"), str(path), "append to it")
        done += n


class _DirectAppend(AppendFile):
    """An append-only file written around the page cache (``O_DIRECT``): for data that is
    written once, fsynced before anyone reads it, and read rarely soon after (a sink's staged
    segments).  Buffered writes copy every byte into the page cache and write it back at
    fsync; here the disk takes the bytes from an aligned buffer, which saves that copy and
    the page cache's bookkeeping (inside Spark, the copy into new page-cache pages was half of
    a sink task's CPU on a VM).

    Each :meth:`write` writes the whole blocks it completes, from this thread's aligned buffer;
    the partial last block (under 4 KiB) stays in memory until the next write completes it,
    and is written through the page cache by :meth:`fsync` and :meth:`close`.  So the file
    holds every byte once either returns, and only then: a reader must not read the file while
    it is written (staged segments are read after the task fsynced them)."""

    def __init__(self, path: Path, fd: int, size: int):
        self._path = path
        self._fd = fd  # O_DIRECT
        self._size = size  # bytes written by the caller
        self._start = size - size % _BLOCK  # file position of the partial last block
        self._tail = b""  # the partial last block's bytes
        self._tail_fd: int | None = None  # buffered, for the partial last block
        self._direct = True  # False once the file system refused a direct write
        self._failed: BaseException | None = None
        if size % _BLOCK:  # reopened with a partial last block: continue it
            try:
                with _naming(path, "read its last block"):
                    self._tail = os.pread(self._buffered(), size % _BLOCK, self._start)
            except BaseException:
                if self._tail_fd is not None:
                    os.close(self._tail_fd)
                raise

    @classmethod
    def open(cls, path: Path) -> _DirectAppend | None:
        """The direct appender of ``path``, or None where the file system refuses O_DIRECT."""
        assert _DIRECT is not None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | _DIRECT, 0o644)
        except OSError as e:
            if e.errno == errno.EINVAL:  # tmpfs and others: write through the page cache
                return None
            raise StorageIOError.wrap(e, str(path), "open it for appending") from e
        appender = None
        try:
            appender = cls(path, fd, os.fstat(fd).st_size)
            return appender
        finally:
            if appender is None:
                os.close(fd)

    def _buffered(self) -> int:
        if self._tail_fd is None:
            self._tail_fd = os.open(self._path, os.O_RDWR)
        return self._tail_fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._check()
        src = memoryview(data).cast("B")
        n = src.nbytes
        buf = _aligned_buffer()
        try:
            with _naming(self._path, "append to it"):
                fill = len(self._tail)
                buf[:fill] = self._tail
                done = 0
                while True:
                    k = min(n - done, _DIRECT_CHUNK - fill)
                    buf[fill : fill + k] = src[done : done + k]
                    fill += k
                    done += k
                    whole = fill - fill % _BLOCK
                    if whole and (fill == _DIRECT_CHUNK or done == n):
                        self._write_blocks(buf[:whole])
                        buf[: fill - whole] = buf[whole:fill]
                        fill -= whole
                    if done == n:
                        break
                self._tail = bytes(buf[:fill])
        except BaseException as e:  # blocks may be written past what size() counts: unusable
            self._failed = e
            raise
        self._size += n
        return n

    def _write_blocks(self, blocks: memoryview) -> None:
        """Whole blocks at the end of the file: direct, or buffered on a file system that
        accepts O_DIRECT at open but refuses the writes (EINVAL)."""
        if self._direct:
            try:
                _write_all(self._fd, blocks, self._start, self._path)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._direct = False
        if not self._direct:
            _write_all(self._buffered(), blocks, self._start, self._path)
        self._start += len(blocks)

    def _check(self) -> None:
        if self._failed is not None:
            raise StorageError(
                f"{self._path}: cannot be appended to any more (an earlier write failed, or it was "
                f"closed: {self._failed})"
            ) from self._failed

    def _write_tail(self) -> None:
        """The partial last block into the file, through the page cache."""
        if self._tail:
            _write_all(self._buffered(), memoryview(self._tail), self._start, self._path)

    def size(self) -> int:
        return self._size

    def fsync(self) -> None:
        self._check()
        with _naming(self._path, "fsync it"):
            self._write_tail()
            os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        self._check()
        with _naming(self._path, f"truncate it to {size} bytes"):
            self._write_tail()
            os.ftruncate(self._fd, size)
            self._start = size - size % _BLOCK
            self._tail = os.pread(self._buffered(), size % _BLOCK, self._start) if size % _BLOCK else b""
        self._size = size

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            if self._failed is None:
                with _naming(self._path, "write its last bytes"):
                    self._write_tail()
        finally:
            fds = (self._fd, self._tail_fd)
            self._fd, self._tail_fd = -1, None
            self._failed = self._failed or StorageError("closed")
            for fd in fds:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)


class LocalStorage(Storage):
    """A directory on local disk."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True):
        self.root = Path(root).resolve()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise StorageError(f"{self.root}: no such directory")
        self._abs: dict[str, str] = {}  # resolved paths of hot files (reads)

    def describe(self) -> str:
        return str(self.root)

    def resolve(self, path: str) -> Path:
        rel = self.check_relative(path)
        return self.root / rel if rel else self.root

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        p = self._abs.get(path) or self._cache_abs(path)
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError as e:  # (a reader racing a writer's rename: it lists again)
            raise StorageError(f"{p}: cannot read: {e.strerror}") from e
        except OSError as e:
            raise StorageIOError.wrap(e, p, "read it") from e
        try:
            with _naming(p, "read it"):  # EIO; a directory where a file belongs (EISDIR)
                if end is None:
                    end = os.fstat(fd).st_size
                return os.pread(fd, max(0, end - start), start)
        finally:
            os.close(fd)

    def _cache_abs(self, path: str) -> str:
        if len(self._abs) > 100_000:
            self._abs.clear()
        p = self._abs[path] = str(self.resolve(path))
        return p

    def size(self, path: str) -> int:
        try:
            return self.resolve(path).stat().st_size
        except OSError as e:
            raise StorageError(f"{self.resolve(path)}: {e.strerror}") from e

    def exists(self, path: str) -> bool:
        return self.resolve(path).exists()

    def isdir(self, path: str) -> bool:
        return self.resolve(path).is_dir()

    def listdir(self, path: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self.resolve(path)))
        except FileNotFoundError:
            return []

    def makedirs(self, path: str) -> None:
        target = self.resolve(path)
        with _naming(target, "create the directory"):
            target.mkdir(parents=True, exist_ok=True)

    def open_append(self, path: str, *, direct: bool = False) -> AppendFile:
        target = self.resolve(path)
        if direct and _DIRECT is not None:
            appender = _DirectAppend.open(target)
            if appender is not None:
                return appender
        return _LocalAppend(target)

    def write_atomic(self, path: str, data: bytes) -> None:
        target = self.resolve(path)
        tmp = target.with_name(target.name + ".tmp")
        with _naming(tmp, "write it"), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with _naming(target, f"replace it with {tmp.name}"):
            os.replace(tmp, target)
        self._fsync_path(target.parent)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        target = self.resolve(path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as e:
            raise StorageIOError.wrap(e, target, "create it") from e
        try:
            with _naming(target, "write it"):
                os.write(fd, data)
                os.fsync(fd)
        finally:
            os.close(fd)
        self._fsync_path(target.parent)
        return True

    def rename(self, src: str, dst: str) -> None:
        source, target = self.resolve(src), self.resolve(dst)
        with _naming(source, f"rename it to {target}"):
            os.replace(source, target)

    def delete(self, path: str) -> None:
        target = self.resolve(path)
        try:
            target.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageIOError.wrap(e, target, "delete it") from e

    def rmdir(self, path: str) -> None:
        target = self.resolve(path)
        with _naming(target, "remove the directory"):
            target.rmdir()

    def truncate(self, path: str, size: int) -> None:
        target = self.resolve(path)
        with _naming(target, f"truncate it to {size} bytes"), open(target, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    writes_in_place = True

    @contextlib.contextmanager
    def open_reader(self, path: str) -> Iterator[Callable[[int, int], bytes]]:
        target = self.resolve(path)
        with _naming(target, "read it"):
            fd = os.open(target, os.O_RDONLY)
        try:

            def read(start: int, end: int) -> bytes:
                with _naming(target, "read it"):
                    return os.pread(fd, max(0, end - start), start)

            yield read
        finally:
            os.close(fd)

    def modified_ms(self, path: str) -> int | None:
        try:
            return int(self.resolve(path).stat().st_mtime * 1000)
        except OSError:
            return None

    def identity(self, path: str) -> str | None:
        target = self.resolve(path)
        with _naming(target, "look it up"):
            try:
                st = target.stat()
            except FileNotFoundError:
                return None
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def write_at(self, path: str, edits: list[tuple[int, bytes]]) -> None:
        target = self.resolve(path)
        with _naming(target, "modify it in place"):
            fd = os.open(target, os.O_WRONLY)  # no O_APPEND: Linux would ignore the positions
            try:
                size = os.fstat(fd).st_size
                for pos, data in edits:
                    if pos < 0 or pos + len(data) > size:
                        raise StorageError(
                            f"{target}: an edit at byte {pos} lies outside the file ({size} bytes)"
                        )
                    if os.pwrite(fd, data, pos) != len(data):
                        raise OSError(errno.EIO, "short write")
                os.fsync(fd)
            finally:
                os.close(fd)

    def fsync_dir(self, path: str = "") -> None:
        self._fsync_path(self.resolve(path))

    @staticmethod
    def _fsync_path(directory: Path) -> None:
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:  # pragma: no cover - platforms without directory fds
            return
        try:
            os.fsync(fd)
        except OSError as e:  # pragma: no cover
            if e.errno not in (errno.EINVAL, errno.EBADF):
                raise StorageIOError.wrap(e, directory, "fsync the directory") from e
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lock(self, path: str):  # type: ignore[no-untyped-def, override]
        target = self.resolve(path)
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError as e:
                    raise LogLockedError(
                        f"{target}: another process holds the writer lock of this pylog root"
                    ) from e
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)  # closing releases the flock


__all__ = ["AppendFile", "LocalStorage", "Storage", "StorageError", "join"]
