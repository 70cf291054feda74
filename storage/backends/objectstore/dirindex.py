"""The names in each directory of a tree of paths, kept up to date as paths come and go.

An object store has no directories: a root's tree is a mapping of paths to objects (the state of
its commit log plus a transaction's changes, see :mod:`pylog.storage.backends.objectstore.worktree`).
Listing one directory by scanning every path would cost what the whole root holds, on every log
open; this index makes it cost what the directory holds.  A directory appears in its parent's
names while it holds anything, or while it is a directory of its own (``is_entry``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable


class DirIndex:
    """Names per directory of the paths added (``""`` is the top)."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._names: dict[str, set[str]] = {}
        for p in paths:
            self.add(p)

    def add(self, path: str) -> None:
        """``path`` (a file or a directory) is in the tree; so are its ancestors."""
        while path:
            d, _, name = path.rpartition("/")
            names = self._names.setdefault(d, set())
            if name in names:
                return  # its ancestors are there already
            names.add(name)
            path = d

    def remove(self, path: str, is_entry: Callable[[str], bool]) -> None:
        """``path`` left the tree: its name leaves its directory's, and so on up while a
        directory is left holding nothing and ``is_entry`` (a file or directory of its own)
        does not hold it."""
        while path and not (is_entry(path) or self._names.get(path)):
            self._names.pop(path, None)
            d, _, name = path.rpartition("/")
            names = self._names.get(d)
            if names is not None:
                names.discard(name)
            path = d

    def names(self, directory: str) -> set[str]:
        """The names in ``directory`` (a copy)."""
        return set(self._names.get(directory, ()))


__all__ = ["DirIndex"]
