"""An object store's working tree lists a directory from a per-directory index (a listing costs
what the directory holds, not what the root holds): it must list exactly what a scan of every
file and directory would, whatever sequence of writes, renames, deletes, adoptions, makedirs,
rmdirs and commits built the tree."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.errors import StorageError

_ROOTS = itertools.count()

DIRS = ["", "t-0", "t-1", "a/b"]
NAMES = ["x.log", "y.index", "z", "pylog-state.json"]

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(DIRS), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("makedirs"), st.sampled_from(DIRS[1:])),
    st.tuples(st.just("rmdir"), st.sampled_from([*DIRS[1:], "a"])),
    st.tuples(st.just("commit")),
)


def _path(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


def _scan(storage: ObjectStorage, path: str) -> list[str]:
    """What the directory holds, by a scan of the whole tree (the definition)."""
    prefix = f"{path}/" if path else ""
    names = {
        p[len(prefix) :].split("/", 1)[0]
        for p in itertools.chain(storage._tree.files, storage._tree.dirs)
        if p.startswith(prefix) and p != path
    }
    return sorted(names)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=30))
def test_listing_a_directory_matches_a_scan_of_the_tree(ops: list[tuple[str, ...]]) -> None:
    storage = ObjectStorage(ObjectClient(f"memory://pylog-tree/{next(_ROOTS)}"))
    storage.in_transaction = True  # no consumer-offset listing of direct objects at the top
    for o in ops:
        try:
            if o[0] == "write":
                storage.write_atomic(_path(o[1], o[2]), b"data")
            elif o[0] == "delete":
                storage.delete(_path(o[1], o[2]))
            elif o[0] == "rename":
                if storage.exists(_path(o[1], o[2])):
                    storage.rename(_path(o[1], o[2]), _path(o[1], o[3]))
            elif o[0] == "makedirs":
                storage.makedirs(o[1])
            elif o[0] == "rmdir":
                holds = any(p.startswith(o[1] + "/") for p in storage._tree.files)
                try:
                    storage.rmdir(o[1])
                except StorageError:
                    assert holds, o  # refused only when a file lies under it, at any depth
                    raise
                assert not holds, o
            else:
                storage.commit()
                storage.in_transaction = True
        except StorageError:
            pass  # a directory that is not empty
        for d in ["", "t-0", "t-1", "a", "a/b", "missing"]:
            assert storage.listdir(d) == _scan(storage, d), (o, d)
