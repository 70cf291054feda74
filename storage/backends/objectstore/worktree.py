"""The working copy of a pylog root on an object store: the file tree of one state plus the
changes of a transaction, held in memory until a commit publishes them.

A file of the tree is the state's :class:`~pylog.storage.backends.objectstore.snapshot.Ref` until the
transaction changes it, then an :class:`Entry`: bytes written since the last commit
(``local``), a committed object read with 8-byte values put over it (``patch``), or a staged
object adopted as the file.  Only the paths in :attr:`WorkingTree.touched` can differ from the
state, so a commit looks at those alone (:meth:`WorkingTree.changes`).  The state's file map is
shared, never copied (:class:`TreeFiles` lays the transaction's entries over it), and the names of
each directory are kept in a :class:`~pylog.storage.backends.objectstore.dirindex.DirIndex` that
outlives a commit: what a transaction and its commit cost does not grow with the root's files.

The tree does no locking and no I/O: its owner,
:class:`~pylog.storage.backends.objectstore.storage.ObjectStorage`, does both.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pylog.storage.backends.base import AppendFile
from pylog.storage.backends.objectstore.dirindex import DirIndex
from pylog.storage.backends.objectstore.keys import holds_inline, parent, upload_key
from pylog.storage.backends.objectstore.snapshot import Ref, Snapshot
from pylog.storage.errors import StorageError


@dataclass
class Entry:
    size: int
    key: str | None = None  # committed object
    data: bytes | bytearray | None = None  # inline (committed) or written in this transaction
    local: bool = False  # written since the last commit
    patch: bytes | None = None  # 8-byte values read over the object (see snapshot.Ref.patch)


class TreeFiles:
    """The files of a working tree: the state's map (``base``, shared with the state and never
    changed here) under the entries this transaction put (``over``; None: removed)."""

    __slots__ = ("base", "over")

    def __init__(self, base: dict[str, Ref] | None = None) -> None:
        self.base: dict[str, Ref] = {} if base is None else base
        self.over: dict[str, Entry | Ref | None] = {}

    def get(self, path: str) -> Entry | Ref | None:
        over = self.over
        return over[path] if path in over else self.base.get(path)

    def __contains__(self, path: object) -> bool:
        over = self.over
        return over[path] is not None if path in over else path in self.base

    def __iter__(self) -> Iterator[str]:
        over = self.over
        yield from (p for p in self.base if p not in over)
        yield from (p for p, e in over.items() if e is not None)

    def set(self, path: str, entry: Entry | Ref) -> None:
        self.over[path] = entry

    def pop(self, path: str) -> Entry | Ref | None:
        e = self.get(path)
        if e is not None:
            self.over[path] = None
        return e


class VirtualAppend(AppendFile):
    """A file of the working copy opened for appending.  It stays usable across commits (a
    writer keeps its logs open): the first write after the working copy was replaced copies the
    file, as the new state holds it, into the new working copy (``reopen``)."""

    def __init__(self, tree: WorkingTree, path: str, entry: Entry, reopen: Callable[[str], Entry]):
        self._tree = tree
        self._path = path
        self._entry = entry
        self._reopen = reopen
        self._generation = tree.generation
        self._closed = False

    def _current(self) -> Entry:
        if self._closed:
            raise StorageError(f"{self._tree.where}/{self._path}: write to a closed file")
        if self._generation != self._tree.generation:
            self._entry = self._reopen(self._path)
            self._generation = self._tree.generation
        return self._entry

    def write(self, data: bytes | bytearray | memoryview) -> int:
        entry = self._current()
        buf = entry.data
        assert isinstance(buf, bytearray)
        buf += data
        entry.size = len(buf)
        self._tree.dirty = True
        return len(data)

    def size(self) -> int:
        if self._generation != self._tree.generation:
            return self._tree.entry(self._path).size
        return self._entry.size

    def fsync(self) -> None:  # durability comes with the commit
        return None

    def truncate(self, size: int) -> None:
        entry = self._current()
        buf = entry.data
        assert isinstance(buf, bytearray)
        del buf[size:]
        entry.size = len(buf)
        self._tree.dirty = True

    def close(self) -> None:
        self._closed = True


class WorkingTree:
    """The files and directories of one state plus a transaction's changes (see the module doc)."""

    def __init__(self, where: str) -> None:
        self.where = where  # the root's URL, for messages
        self.files = TreeFiles()  # the working tree: Refs are the snapshot's
        self.touched: set[str] = set()  # paths added, changed or removed since the snapshot
        self.dirs: set[str] = set()
        self.dirty = False
        self.generation = 0  # counts resets: append handles of an older working copy reopen
        self._index: DirIndex | None = None  # the names per directory (lazy: names)
        self._renamed = False  # a file or directory came or went since the snapshot

    def reset(self, base: dict[str, Ref], dirs: set[str], same_names: bool = False) -> None:
        """The tree of a state (its ``base`` files and ``dirs``), without changes.
        ``same_names``: the state holds exactly the paths and directories of this tree (the
        state this tree's own commit published), so the names index is kept."""
        if not (same_names or (base is self.files.base and not self._renamed)):
            self._index = None  # (built again from the new tree when next needed)
        self.files = TreeFiles(base)
        self.touched = set()
        self.dirs = set(dirs)
        self.dirty = False
        self._renamed = False
        self.generation += 1

    def changed(self, base: dict[str, Ref], dirs: set[str]) -> bool:
        """Whether the working tree differs from the manifest's (``base``, ``dirs``): rewriting a
        checkpoint with the same bytes, or the clean-shutdown marker a writer removes and writes
        back, is no change."""
        if not self.dirty:
            return False
        if self.dirs != dirs:
            return True
        for path in self.touched:
            e, b = self.files.get(path), base.get(path)
            if e is b:
                continue
            if e is None or b is None or not e.local or b.data is None or bytes(e.data or b"") != b.data:
                return True
        return False

    def changes(self, snapshot: Snapshot, token: str) -> tuple[dict[str, Ref], list[tuple[str, bytes]]]:
        """The files among :attr:`touched` that the state a commit on ``snapshot`` holds (the
        others it holds are ``snapshot``'s; a touched path missing here is removed), and the
        objects it uploads for them (under keys of the writer ``token``)."""
        files: dict[str, Ref] = {}
        uploads: list[tuple[str, bytes]] = []
        for path in sorted(self.touched):
            e = self.files.get(path)
            if e is None:
                continue  # removed
            if isinstance(e, Ref):
                files[path] = e
            elif e.local:
                data = bytes(e.data or b"")
                if holds_inline(path, len(data)):
                    files[path] = Ref(len(data), data=data)
                else:
                    key = upload_key(path, token)
                    uploads.append((key, data))
                    files[path] = Ref(len(data), key=key)
            else:
                base = snapshot.files.get(path)
                files[path] = (
                    base
                    if base is not None and base.key == e.key and base.patch == e.patch
                    else Ref(e.size, e.key, None if e.data is None else bytes(e.data), e.patch)
                )
        return files, uploads

    def entry(self, path: str) -> Entry | Ref:
        e = self.files.get(path)
        if e is None:
            raise FileNotFoundError(f"{self.where}/{path}: no such file")
        return e

    def put(self, path: str, entry: Entry | Ref) -> None:
        """Put a file into the working tree (its directory too)."""
        if path not in self.files:
            self._index_add(path)
        self.files.set(path, entry)
        self.touched.add(path)
        d = parent(path)
        if d and d not in self.dirs:
            self.dirs.add(d)
            self._index_add(d)

    def rename(self, src: str, dst: str) -> None:
        self.put(dst, self.entry(src))
        self.files.pop(src)
        self.touched.add(src)
        self._index_remove(src)
        self.dirty = True

    def remove(self, path: str) -> None:
        if self.files.pop(path) is not None:
            self.touched.add(path)
            self._index_remove(path)
            self.dirty = True

    def makedirs(self, path: str) -> None:
        while path and path not in self.dirs:
            self.dirs.add(path)
            self._index_add(path)
            self.dirty = True
            path = parent(path)

    def rmdir(self, path: str) -> None:
        if any(p.startswith(path + "/") for p in self.files):  # (rare: a full scan)
            raise StorageError(f"{self.where}/{path}: directory not empty")
        self.dirs.discard(path)
        self._index_remove(path)
        self.dirty = True

    def names(self, directory: str) -> set[str]:
        """The names in ``directory`` (a copy), from an index built when a state with other
        names is loaded, then kept up to date as files come and go."""
        if self._index is None:
            self._index = DirIndex(itertools.chain(self.files, self.dirs))
        return self._index.names(directory)

    def _index_add(self, path: str) -> None:
        self._renamed = True
        if self._index is not None:  # (otherwise built from the tree when next needed)
            self._index.add(path)

    def _index_remove(self, path: str) -> None:
        self._renamed = True
        if self._index is not None:
            self._index.remove(path, lambda p: p in self.files or p in self.dirs)


__all__ = ["Entry", "TreeFiles", "VirtualAppend", "WorkingTree"]
