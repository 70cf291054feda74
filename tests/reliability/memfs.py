"""An in-memory ``Storage`` that knows what is durable: the power-loss model of the campaign.

``MemStorage`` keeps inodes as a POSIX file system on a disk with a volatile page cache does
(the LazyFS model of Jepsen's "When Amnesia Strikes"):

* a file inode holds its current bytes and the bytes of its last ``fsync`` (``synced``);
* a directory inode holds its current entries and the entries of its last ``fsync_dir``:
  creating, renaming and deleting a name are durable only once that directory is fsynced;
* open append handles point at inodes, so they survive renames and unlinks, as descriptors do.

Two ways to stop the "machine":

* :meth:`MemStorage.kill` - a process kill (``kill -9``): the page cache survives, the copy
  keeps every current byte and name;
* :meth:`MemStorage.power_cut` - loss of power: the copy keeps only what was made durable
  (names as of each directory's last fsync, bytes as of each file's last fsync), and
  optionally a *torn* tail: a random part of a file's unsynced appended bytes, possibly
  zero-filled (ext4 ``data=writeback`` after a crash), as LazyFS's ``torn-seq`` fault does.

Crash points: every mutating operation (create, write, fsync, truncate, rename, delete, mkdir,
rmdir, fsync_dir) counts one *step*.  ``crash_after(k)`` makes the k-th step happen and then
raises :class:`Crash` (a ``BaseException``, so no ``except Exception`` in the code under test
swallows it); from then on every operation raises :class:`Crash` too - the process is gone.
``steps`` lists the operations done so far (for enumeration and reports).

I/O errors: :meth:`MemStorage.fail` makes operations raise ``OSError`` as a full disk
(``ENOSPC``: creating, writing, syncing) or a failing one (``EIO``: any operation, reads too)
does, from the k-th matching operation on, until :meth:`MemStorage.clear_faults`.  The failing
operation changes nothing, except that the first write refused for ``ENOSPC`` stores a prefix of
its bytes and returns the short count, as ``write(2)`` does on a disk that fills up; a
descriptor operation (read, write, fsync, truncate) raises without a file name, a path
operation (open/create, rename, unlink, mkdir, listdir, stat) with one, as the OS does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pylog.storage.backends.base import AppendFile, Storage
from pylog.storage.errors import LogLockedError, StorageError


class Crash(BaseException):
    """The process stopped here (a kill, or the machine lost power)."""


@dataclass
class _File:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""


@dataclass
class _Dir:
    entries: dict[str, int] = field(default_factory=dict)
    synced: dict[str, int] = field(default_factory=dict)


ENOSPC_OPS = frozenset({"create", "write", "fsync", "mkdir"})
"""The operations a full disk refuses (``fsync`` too: delayed allocation happens there)."""
EIO_OPS = frozenset(
    {
        "read",
        "size",
        "listdir",
        "create",
        "write",
        "fsync",
        "truncate",
        "rename",
        "delete",
        "mkdir",
        "fsync_dir",
    }
)
"""Every operation a failing disk can refuse."""
_FD_OPS = frozenset({"read", "write", "fsync", "truncate"})  # no file name in the OS's error


@dataclass
class Fault:
    """An injected I/O error: operations of ``ops`` on paths containing ``path`` fail with
    ``err`` once ``skip`` of them have passed (see :meth:`MemStorage.fail`)."""

    err: int
    ops: frozenset[str]
    path: str = ""
    skip: int = 0
    seen: int = 0  # matching operations so far
    failed: list[str] = field(default_factory=list)  # "op path" of each refused operation
    short_write: bool = True

    def matches(self, op: str, path: str) -> bool:
        return op in self.ops and self.path in path


class _MemAppend(AppendFile):
    def __init__(self, fs: MemStorage, ino: int, path: str):
        self._fs = fs
        self._ino = ino
        self._path = path
        self._closed = False

    def _file(self) -> _File:
        self._fs._alive()
        if self._closed:
            raise StorageError(f"{self._path}: file is closed")
        f = self._fs._inodes[self._ino]
        assert isinstance(f, _File)
        return f

    def write(self, data: bytes | bytearray | memoryview) -> int:
        f = self._file()
        b = bytes(data)
        short = self._fs._fault("write", self._path, partial=len(b))
        if short is not None:  # the disk filled up in the middle of this write
            b = b[:short]
        f.data += b
        self._fs._step("write", self._path)
        return len(b)

    def size(self) -> int:
        return len(self._file().data)

    def fsync(self) -> None:
        f = self._file()
        self._fs._fault("fsync", self._path)
        f.synced = bytes(f.data)
        self._fs._step("fsync", self._path)

    def truncate(self, size: int) -> None:
        f = self._file()
        self._fs._fault("truncate", self._path)
        del f.data[size:]
        self._fs._step("truncate", self._path)

    def close(self) -> None:
        self._closed = True


class MemStorage(Storage):
    """See the module docstring."""

    def __init__(self, name: str = "mem") -> None:
        self.name = name
        self._inodes: dict[int, _File | _Dir] = {0: _Dir()}
        self._next = 1
        self._locks: set[str] = set()
        self._crash_at: int | None = None
        self._dead = False
        self.step_count = 0
        self.steps: list[str] = []
        self.record_steps = False
        self.faults: list[Fault] = []

    def describe(self) -> str:
        return f"mem://{self.name}"

    # ------------------------------------------------------------------ crash control

    def crash_after(self, k: int | None) -> None:
        """Crash right after the k-th mutating step from now (None: never)."""
        self._crash_at = None if k is None else self.step_count + k

    @property
    def dead(self) -> bool:
        return self._dead

    def _alive(self) -> None:
        if self._dead:
            raise Crash("the process is gone")

    # ------------------------------------------------------------------ I/O errors

    def fail(self, err: int, *, ops: frozenset[str] | None = None, path: str = "", after: int = 0) -> Fault:
        """From the ``after``-th (0-based) operation of ``ops`` on a path containing ``path`` on,
        every such operation raises ``OSError(err)`` until :meth:`clear_faults`.  ``ops``
        defaults to :data:`ENOSPC_OPS` for ``ENOSPC`` and to :data:`EIO_OPS` otherwise.  A huge
        ``after`` never fails: the fault then only counts the matching operations (``seen``)."""
        if ops is None:
            ops = ENOSPC_OPS if err == errno.ENOSPC else EIO_OPS
        fault = Fault(err, frozenset(ops), path, skip=after, short_write=err == errno.ENOSPC)
        self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        """The disk has room again (or was replaced): operations succeed from now on."""
        self.faults = []

    def _fault(self, op: str, path: str, *, partial: int | None = None) -> int | None:
        """Raise the injected error for ``op`` on ``path``, if any.  For the first write refused
        for lack of space, return how many of its ``partial`` bytes fit instead (a short write)."""
        for fault in self.faults:
            if not fault.matches(op, path):
                continue
            fault.seen += 1
            if fault.seen <= fault.skip:
                continue
            first = not fault.failed
            fault.failed.append(f"{op} {path}")
            if partial is not None and first and fault.short_write and partial > 1:
                return partial // 2
            name = None if op in _FD_OPS else path
            raise OSError(fault.err, os.strerror(fault.err), name)
        return None

    def _step(self, op: str, path: str) -> None:
        self.step_count += 1
        if self.record_steps:
            self.steps.append(f"{op} {path}")
        if self._crash_at is not None and self.step_count >= self._crash_at:
            self._dead = True
            raise Crash(f"crash after step {self.step_count}: {op} {path}")

    # ------------------------------------------------------------------ namespace

    def _split(self, path: str) -> tuple[str, str]:
        rel = self.check_relative(path)
        if not rel:
            raise StorageError("the root has no parent")
        parent, _, name = rel.rpartition("/")
        return parent, name

    def _lookup(self, path: str) -> int | None:
        rel = self.check_relative(path)
        ino = 0
        for part in rel.split("/") if rel else []:
            d = self._inodes[ino]
            if not isinstance(d, _Dir) or part not in d.entries:
                return None
            ino = d.entries[part]
        return ino

    def _dir(self, path: str) -> _Dir:
        ino = self._lookup(path)
        d = None if ino is None else self._inodes[ino]
        if not isinstance(d, _Dir):
            raise StorageError(f"{self.describe()}/{path}: no such directory")
        return d

    def _file_at(self, path: str) -> _File:
        ino = self._lookup(path)
        f = None if ino is None else self._inodes[ino]
        if not isinstance(f, _File):
            raise StorageError(f"{self.describe()}/{path}: no such file")
        return f

    def _new(self, node: _File | _Dir) -> int:
        ino = self._next
        self._next += 1
        self._inodes[ino] = node
        return ino

    # ------------------------------------------------------------------ Storage API

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self._alive()
        data = self._file_at(path).data
        self._fault("read", path)
        return bytes(data[start : len(data) if end is None else end])

    def size(self, path: str) -> int:
        self._alive()
        f = self._file_at(path)
        self._fault("size", path)
        return len(f.data)

    def exists(self, path: str) -> bool:
        self._alive()
        return self._lookup(path) is not None

    def isdir(self, path: str) -> bool:
        self._alive()
        ino = self._lookup(path)
        return ino is not None and isinstance(self._inodes[ino], _Dir)

    def listdir(self, path: str = "") -> list[str]:
        self._alive()
        ino = self._lookup(path)
        d = None if ino is None else self._inodes[ino]
        if isinstance(d, _Dir):
            self._fault("listdir", path)
        return sorted(d.entries) if isinstance(d, _Dir) else []

    def makedirs(self, path: str) -> None:
        self._alive()
        rel = self.check_relative(path)
        ino = 0
        done = ""
        for part in rel.split("/") if rel else []:
            done = f"{done}/{part}" if done else part
            d = self._inodes[ino]
            if not isinstance(d, _Dir):
                raise StorageError(f"{self.describe()}/{done}: not a directory")
            if part not in d.entries:
                self._fault("mkdir", done)
                d.entries[part] = self._new(_Dir())
                self._step("mkdir", done)
            ino = d.entries[part]
        if not isinstance(self._inodes[ino], _Dir):
            raise StorageError(f"{self.describe()}/{rel}: exists and is not a directory")

    def _create(self, path: str) -> int:
        parent, name = self._split(path)
        d = self._dir(parent)
        if name in d.entries:
            if not isinstance(self._inodes[d.entries[name]], _File):
                raise StorageError(f"{self.describe()}/{path}: is a directory")
            return d.entries[name]
        self._fault("create", path)
        ino = d.entries[name] = self._new(_File())
        self._step("create", path)
        return ino

    def open_append(self, path: str, *, direct: bool = False) -> AppendFile:
        self._alive()
        return _MemAppend(self, self._create(path), path)

    def write_atomic(self, path: str, data: bytes) -> None:
        """LocalStorage's sequence: tmp created, written and fsynced, renamed, directory fsynced."""
        self._alive()
        parent, name = self._split(path)
        tmp = f"{parent}/{name}.tmp" if parent else f"{name}.tmp"
        d = self._dir(parent)
        if tmp.rpartition("/")[2] in d.entries:
            self._unlink(tmp)
        ino = self._create(tmp)
        f = self._inodes[ino]
        assert isinstance(f, _File)
        self._fault("write", tmp)  # Python's buffered writer retries a short write: it raises
        f.data = bytearray(data)
        self._step("write", tmp)
        self._fault("fsync", tmp)
        f.synced = bytes(data)
        self._step("fsync", tmp)
        self.rename(tmp, path)
        self.fsync_dir(parent)

    def rename(self, src: str, dst: str) -> None:
        self._alive()
        sp, sn = self._split(src)
        dp, dn = self._split(dst)
        sd, dd = self._dir(sp), self._dir(dp)
        if sn not in sd.entries:
            raise StorageError(f"{self.describe()}/{src}: cannot rename: no such file")
        self._fault("rename", src)
        dd.entries[dn] = sd.entries.pop(sn)
        self._step("rename", f"{src} -> {dst}")

    def _unlink(self, path: str) -> None:
        parent, name = self._split(path)
        self._fault("delete", path)
        del self._dir(parent).entries[name]
        self._step("delete", path)

    def delete(self, path: str) -> None:
        self._alive()
        ino = self._lookup(path)
        if ino is None:
            return
        if isinstance(self._inodes[ino], _Dir):
            raise StorageError(f"{self.describe()}/{path}: is a directory")
        self._unlink(path)

    def rmdir(self, path: str) -> None:
        self._alive()
        d = self._dir(path)
        if d.entries:
            raise StorageError(f"{self.describe()}/{path}: directory not empty")
        self._unlink(path)

    def truncate(self, path: str, size: int) -> None:
        """LocalStorage's: truncate and fsync."""
        self._alive()
        f = self._file_at(path)
        self._fault("truncate", path)
        del f.data[size:]
        self._step("truncate", path)
        f.synced = bytes(f.data)
        self._step("fsync", path)

    writes_in_place = True

    def write_at(self, path: str, edits: list[tuple[int, bytes]]) -> None:
        """LocalStorage's: overwrite in place (one step per edit), then fsync."""
        self._alive()
        f = self._file_at(path)
        for pos, data in edits:
            if pos < 0 or pos + len(data) > len(f.data):
                raise StorageError(f"{self.describe()}/{path}: an edit at byte {pos} lies outside the file")
            self._fault("write", path)
            f.data[pos : pos + len(data)] = data
            self._step("write", path)
        self._fault("fsync", path)
        f.synced = bytes(f.data)
        self._step("fsync", path)

    def fsync_dir(self, path: str = "") -> None:
        self._alive()
        d = self._dir(path)
        self._fault("fsync_dir", path)
        d.synced = dict(d.entries)
        self._step("fsync_dir", path or ".")

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        self._alive()
        rel = self.check_relative(path)
        if rel in self._locks:
            raise LogLockedError(f"{self.describe()}/{rel}: another writer holds the lock")
        self._locks.add(rel)
        try:
            yield
        finally:
            self._locks.discard(rel)

    # ------------------------------------------------------------------ stopping the machine

    def kill(self) -> MemStorage:
        """The files as a new process finds them after ``kill -9``: everything written is there."""
        return self._copy(durable=False, rng=None, tear=0.0)

    def power_cut(self, rng: random.Random | None = None, *, tear: float = 0.0) -> MemStorage:
        """The files after a power loss: only what was fsynced (names: as of each directory's last
        fsync).  With ``tear`` > 0, each file that has unsynced appended bytes keeps, with that
        probability, a random prefix of them (zero-filled half of the time)."""
        return self._copy(durable=True, rng=rng or random.Random(0), tear=tear)

    def _copy(self, *, durable: bool, rng: random.Random | None, tear: float) -> MemStorage:
        out = MemStorage(self.name)
        out._inodes = {}
        out._next = 0

        def copy_dir(ino: int) -> int:
            src = self._inodes[ino]
            assert isinstance(src, _Dir)
            new = _Dir()
            new_ino = out._new(new)
            entries = src.synced if durable else src.entries
            for name in sorted(entries):
                child = self._inodes[entries[name]]
                if isinstance(child, _Dir):
                    new.entries[name] = copy_dir(entries[name])
                else:
                    new.entries[name] = out._new(_File(*_file_state(child, durable, rng, tear)))
            new.synced = dict(new.entries)
            return new_ino

        root = copy_dir(0)
        assert root == 0
        return out

    # ------------------------------------------------------------------ inspection

    def files(self, path: str = "") -> dict[str, bytes]:
        """Every file under ``path`` with its current bytes (tests and reports)."""
        out: dict[str, bytes] = {}
        for name in self.listdir(path):
            p = f"{path}/{name}" if path else name
            if self.isdir(p):
                out.update(self.files(p))
            else:
                out[p] = self.read(p)
        return out


def _file_state(f: _File, durable: bool, rng: random.Random | None, tear: float) -> tuple[bytearray, bytes]:
    if not durable:
        return bytearray(f.data), bytes(f.data)
    data = bytes(f.synced)
    extra = len(f.data) - len(f.synced)
    appended_only = bytes(f.data[: len(f.synced)]) == f.synced
    if rng is not None and tear > 0 and extra > 0 and appended_only and rng.random() < tear:
        keep = rng.randint(1, extra)
        torn = bytes(f.data[len(f.synced) : len(f.synced) + keep])
        if rng.random() < 0.5:
            torn = bytes(len(torn))  # size grew, data blocks never written
        data += torn
    return bytearray(data), data


__all__ = ["EIO_OPS", "ENOSPC_OPS", "Crash", "Fault", "MemStorage"]
