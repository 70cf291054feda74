"""Local-disk storage: :class:`LocalStorage` and its append files.

``LocalStorage`` implements Kafka's local-disk mechanisms: appends to open files, fsync of
files and directories, and durable replacement (tmp file in the same directory → fsync →
``os.replace`` → fsync the directory).  Appends go through the page cache, except a sink's
staged segments, which are written around it (``O_DIRECT``, :class:`_DirectAppend`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pylog.storage.backends.base import AppendFile, Storage, naming_errors
from pylog.storage.errors import (
    LogLockedError,
    NoRootError,
    StorageError,
    StorageIOError,
    too_many_open_files,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


MAX_OPEN_APPEND_FILES = 256
"""How many append handles (``.log``, ``.index``, ``.timeindex`` of active segments) stay open
at once in a process, whatever the number of partitions: beyond it, the least recently used
one is closed and reopened at its next use (Kafka keeps one descriptor per segment; here the
handles held are bounded, so 5,000 partitions run under ``ulimit -n 1024``).  Set with
:func:`set_max_open_files` (or ``PYLOG_MAX_OPEN_FILES`` in the environment)."""

with contextlib.suppress(ValueError):
    MAX_OPEN_APPEND_FILES = max(1, int(os.environ.get("PYLOG_MAX_OPEN_FILES", MAX_OPEN_APPEND_FILES)))


class _OpenFiles:
    """The process's LRU of open append handles (closing one never loses a byte: writes are
    unbuffered, and an fsync through a reopened descriptor flushes the file's pages)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[_LocalAppend, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, f: _LocalAppend) -> None:
        """``f`` was used (its handle is open and its own lock held)."""
        with self._lock:
            if f in self._open:
                self._open.move_to_end(f)
                return
            self._open[f] = None
            if len(self._open) > MAX_OPEN_APPEND_FILES:
                self._evict(len(self._open) - MAX_OPEN_APPEND_FILES, keep=f)

    def forget(self, f: _LocalAppend) -> None:
        with self._lock:
            self._open.pop(f, None)

    def shrink(self, keep: _LocalAppend | None = None) -> None:
        """Close half of the handles (an open failed with EMFILE)."""
        with self._lock:
            self._evict(max(1, len(self._open) // 2), keep=keep)

    def _evict(self, count: int, keep: _LocalAppend | None) -> None:
        for victim in list(self._open):
            if count <= 0:
                break
            if victim is keep or not victim._lock.acquire(blocking=False):
                continue  # in use by another thread: the next one
            try:
                victim._close_handle()
                del self._open[victim]
                count -= 1
            finally:
                victim._lock.release()


OPEN_FILES = _OpenFiles()


def set_max_open_files(n: int) -> None:
    """Set :data:`MAX_OPEN_APPEND_FILES` (handles beyond it are closed at their owners' next use)."""
    global MAX_OPEN_APPEND_FILES
    MAX_OPEN_APPEND_FILES = max(1, int(n))


class _LocalAppend(AppendFile):
    """An append handle opened at creation (which creates the file), closed when
    :data:`OPEN_FILES` evicts it, reopened at its next use."""

    def __init__(self, path: Path):
        self._path = path
        self._lock = threading.Lock()
        self._closed = False
        self._f: BinaryIO | None = None
        with self._lock:
            self._handle()
            assert self._f is not None
            self._size: int = self._f.seek(0, os.SEEK_END)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def _handle(self) -> BinaryIO:
        """The open file (own lock held): reopened if it was evicted."""
        f = self._f
        if f is None:
            if self._closed:
                raise StorageError(f"{self._path}: cannot be appended to any more (it was closed)")
            with naming_errors(self._path, "open it for appending"):
                try:
                    f = open(self._path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
                except OSError as e:
                    if not too_many_open_files(e):
                        raise
                    OPEN_FILES.shrink(keep=self)  # close idle handles, and try once more
                    f = open(self._path, "ab", buffering=0)  # noqa: SIM115
            self._f = f
        OPEN_FILES.touch(self)
        return f

    def _close_handle(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with self._lock:
            f = self._handle()
            with naming_errors(self._path, "append to it"):
                n = f.write(data)
            self._size += n
        return n

    def size(self) -> int:
        return self._size

    def fsync(self) -> None:
        with self._lock:
            f = self._handle()
            with naming_errors(self._path, "fsync it"):
                f.flush()
                os.fsync(f.fileno())

    def truncate(self, size: int) -> None:
        with self._lock:
            f = self._handle()
            with naming_errors(self._path, f"truncate it to {size} bytes"):
                f.flush()
                f.truncate(size)
                f.seek(0, os.SEEK_END)
            self._size = size

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_handle()
        OPEN_FILES.forget(self)


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
                with naming_errors(path, "read its last block"):
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
            with naming_errors(self._path, "append to it"):
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
        with naming_errors(self._path, "fsync it"):
            self._write_tail()
            os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        self._check()
        with naming_errors(self._path, f"truncate it to {size} bytes"):
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
                with naming_errors(self._path, "write its last bytes"):
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
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(f"{self.root}: is a file, not a root directory (a directory of topics)")
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # (a file among its parents: ENOTDIR, EEXIST)
                file = next((p for p in self.root.parents if p.exists() and not p.is_dir()), None)
                if file is not None:
                    raise StorageError(
                        f"{self.root}: cannot create the root directory: {file} is a file, not a directory"
                    ) from e
                raise StorageIOError.wrap(e, self.root, "create the root directory") from e
        elif not self.root.is_dir():
            raise NoRootError(f"{self.root}: no such directory")
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
            with naming_errors(p, "read it"):  # EIO; a directory where a file belongs (EISDIR)
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
        p = self._abs.get(path) or self._cache_abs(path)
        try:
            return os.stat(p).st_size
        except OSError as e:
            raise StorageError(f"{p}: {e.strerror}") from e

    def exists(self, path: str) -> bool:
        # (as ``Path.exists``, with the resolved path cached: a log of 10,000 segments asks 30,000 times)
        p = self._abs.get(path) or self._cache_abs(path)
        try:
            os.stat(p)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
                return False
            raise
        except ValueError:
            return False
        return True

    def isdir(self, path: str) -> bool:
        return self.resolve(path).is_dir()

    def listdir(self, path: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self.resolve(path)))
        except FileNotFoundError:
            return []

    def makedirs(self, path: str) -> None:
        target = self.resolve(path)
        with naming_errors(target, "create the directory"):
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
        with naming_errors(tmp, "write it"), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with naming_errors(target, f"replace it with {tmp.name}"):
            os.replace(tmp, target)
        self._fsync_path(target.parent)

    def rename(self, src: str, dst: str) -> None:
        source, target = self.resolve(src), self.resolve(dst)
        with naming_errors(source, f"rename it to {target}"):
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
        with naming_errors(target, "remove the directory"):
            target.rmdir()

    def truncate(self, path: str, size: int) -> None:
        target = self.resolve(path)
        with naming_errors(target, f"truncate it to {size} bytes"), open(target, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    writes_in_place = True

    @contextlib.contextmanager
    def open_reader(self, path: str) -> Iterator[Callable[[int, int], bytes]]:
        target = self.resolve(path)
        with naming_errors(target, "read it"):
            fd = os.open(target, os.O_RDONLY)
        try:

            def read(start: int, end: int) -> bytes:
                with naming_errors(target, "read it"):
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
        with naming_errors(target, "look it up"):
            try:
                st = target.stat()
            except FileNotFoundError:
                return None
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def write_at(self, path: str, edits: list[tuple[int, bytes]]) -> None:
        target = self.resolve(path)
        with naming_errors(target, "modify it in place"):
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
    def lock(self, path: str) -> Iterator[None]:
        target = self.resolve(path)
        try:
            fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _lock_error(e, target) from e
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError as e:
                    raise LogLockedError(
                        f"{target}: another process holds the writer lock of this pylog root{_holder(fd)}"
                    ) from e
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {LOCK_HOLDER}".strip().encode() + b"\n")
            yield
        finally:
            os.close(fd)  # closing releases the flock


LOCK_HOLDER = ""
"""What this process is, written into the writer lock after its pid (``pylog serve`` sets it), so
that a writer refused the lock is told who holds it.  Never an argument list: command lines
may carry credentials."""


def _holder(fd: int) -> str:
    """`` (process PID: WHAT)`` from a lock file's content, or nothing if it cannot be read."""
    try:
        pid, _, what = os.pread(fd, 200, 0).decode("utf-8", "replace").strip().partition(" ")
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    return f" (process {pid}: {what})" if what else f" (process {pid})"


def _lock_error(e: OSError, target: Path) -> StorageIOError:
    """Why the writer lock file ``target`` cannot be opened, and what to do: a read-only file
    system (a read-only mount) or a directory the process may not write is read with
    ``read_only=True``, which takes no lock."""
    advice = "; to read the root, open it with read_only=True (no lock)"
    if e.errno == errno.EROFS:
        why = f"the root directory {target.parent} is read-only (a read-only file system)"
    elif e.errno in (errno.EACCES, errno.EPERM):
        why = f"the root directory {target.parent} is not writable by this process ({e.strerror})"
    else:
        return StorageIOError.wrap(e, target, "create the writer lock")
    return StorageIOError(e.errno, why + advice, str(target), "create the writer lock")


__all__ = ["LocalStorage"]
