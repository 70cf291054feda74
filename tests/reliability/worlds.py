"""Where a crash test's root lives, and what survives its writer's death.

A *world* hands out :class:`Storage` objects for the roots of one process, counts the process's
mutating storage steps, crashes it after the k-th, and gives the next process what survived:

* :class:`MemWorld` - a local disk (:class:`MemStorage`): a kill keeps the page cache, a power
  cut keeps only what was fsynced.
* :class:`ObjectWorld` - an object store (fsspec's in-memory file system behind a real
  :class:`ObjectClient` and :class:`ObjectStorage`).  A step is one mutating request (a PUT, a
  conditional create, the deletion of one key).  A request either landed or did not, and a
  landed one is durable (S3 acknowledges a PUT only once it is stored), so a power cut of the
  writer's machine leaves what a kill leaves: the object store's second kind of crash is instead
  a *lost reply*, where the k-th request lands but the caller sees a network error and carries
  on (its retry, or the read-back of a conditional create, must take it for what it is).  The
  next process sees the surviving objects under a fresh URL, so no cache of the dead process
  (snapshots, immutable blocks, the probe) can leak into it.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Protocol

from pylog.storage.backends.base import Storage
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.root.rebase import MERGERS
from tests.reliability.memfs import Crash, MemStorage


class World(Protocol):
    label: str
    kinds: tuple[str, ...]  # the kinds of crash this world enumerates
    steps: list[str]

    @property
    def step_count(self) -> int: ...

    def open(self, *, read_only: bool = False) -> Storage: ...

    def crash_after(self, k: int | None, kind: str = "kill") -> None: ...

    def survivor(self, kind: str, rng: random.Random) -> World: ...


class MemWorld:
    label = "local"
    kinds = ("kill", "power")

    def __init__(self, st: MemStorage) -> None:
        self.st = st

    @classmethod
    def new(cls, name: str) -> MemWorld:
        return cls(MemStorage(name))

    @property
    def steps(self) -> list[str]:
        return self.st.steps

    @property
    def step_count(self) -> int:
        return self.st.step_count

    def open(self, *, read_only: bool = False) -> Storage:
        return self.st  # one file system: every root of the process shares it

    def crash_after(self, k: int | None, kind: str = "kill") -> None:
        self.st.record_steps = k is not None
        self.st.steps = []
        self.st.crash_after(k)

    def survivor(self, kind: str, rng: random.Random) -> MemWorld:
        self.st.crash_after(None)
        self.st._dead = False
        return MemWorld(self.st.kill() if kind == "kill" else self.st.power_cut(rng, tear=0.5))


class LostReply(ConnectionError):
    """The request landed, but its response never reached the caller (a transient error)."""


_URLS = itertools.count()


class CrashingStore(ObjectClient):
    """An :class:`ObjectClient` whose process dies (or loses one reply) after its k-th mutating
    request has landed."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        self.fs = _StepFS(self.fs, self)
        self.step_count = 0
        self.steps: list[str] = []
        self._at: int | None = None
        self._kind = "kill"
        self.dead = False

    def arm(self, k: int | None, kind: str) -> None:
        self._at = None if k is None else self.step_count + k
        self._kind = kind
        self.steps = []

    def alive(self) -> None:
        if self.dead:
            raise Crash("the writer process is gone")

    def landed(self, what: str, path: str) -> None:
        self.step_count += 1
        self.steps.append(f"{what} {path[len(self.base) + 1 :]}")
        if self._at is not None and self.step_count == self._at:
            if self._kind == "kill":
                self.dead = True
                raise Crash(f"killed after {self.steps[-1]}")
            raise LostReply(f"connection reset after {self.steps[-1]} landed")

    def _create_once(self, key: str, data: bytes) -> None:
        self.alive()
        super()._create_once(key, data)
        self.landed("create", self.path(key))


class _StepFS:
    """The file system under a :class:`CrashingStore`: each mutation is a step of the store."""

    def __init__(self, fs: Any, store: CrashingStore) -> None:
        self._fs = fs
        self._store = store

    def __getattr__(self, name: str) -> Any:
        self._store.alive()
        return getattr(self._fs, name)

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._store.alive()
        return self._fs.cat_file(path, *args, **kwargs)

    def pipe_file(self, path: str, data: bytes, **kwargs: Any) -> None:
        self._store.alive()
        self._fs.pipe_file(path, data, **kwargs)
        self._store.landed("put", path)

    def pipe(self, batch: dict[str, bytes]) -> None:
        for path, data in batch.items():  # concurrent uploads land in some order
            self.pipe_file(path, data)

    def put_file(self, local_path: str, path: str, **kwargs: Any) -> None:
        self._store.alive()
        with open(local_path, "rb") as f:
            self._fs.pipe_file(path, f.read())
        self._store.landed("put", path)

    def rm(self, paths: list[str]) -> None:
        for path in paths:  # DeleteObjects removes its keys one by one
            self.rm_file(path)

    def rm_file(self, path: str) -> None:
        self._store.alive()
        self._fs.rm_file(path)
        self._store.landed("delete", path)


class ObjectWorld:
    label = "object"
    kinds = ("kill", "lost-reply")

    def __init__(self, name: str, *, delete_delay_ms: int = 0) -> None:
        self.name = name
        self.delete_delay_ms = delete_delay_ms
        self.store = CrashingStore(
            f"memory://pylog-crash/{name}-{next(_URLS)}",
            {"pylog.file_delete_delay_ms": delete_delay_ms, "pylog.retry_timeout_s": 5},
        )

    @property
    def steps(self) -> list[str]:
        return self.store.steps

    @property
    def step_count(self) -> int:
        return self.store.step_count

    def open(self, *, read_only: bool = False) -> Storage:
        st = ObjectStorage(self.store, read_only=read_only)
        st.mergers = dict(MERGERS)  # as pylog.open sets them: a race on other partitions re-bases
        return st

    def crash_after(self, k: int | None, kind: str = "kill") -> None:
        self.store.arm(k, kind)

    def survivor(self, kind: str, rng: random.Random) -> ObjectWorld:
        """The objects as the next process finds them (under a new URL: nothing cached)."""
        fs = self.store.fs._fs
        base = self.store.base
        new = ObjectWorld(self.name, delete_delay_ms=self.delete_delay_ms)
        for path in fs.find(base):
            fs.pipe_file(f"{new.store.base}/{path[len(base) + 1 :]}", fs.cat_file(path))
        if fs.exists(base):
            fs.rm(base, recursive=True)  # the dead process's copy is gone (memory is bounded)
        return new


def new_world(label: str, name: str, *, delete_delay_ms: int = 0) -> World:
    return MemWorld.new(name) if label == "local" else ObjectWorld(name, delete_delay_ms=delete_delay_ms)


__all__ = ["CrashingStore", "LostReply", "MemWorld", "ObjectWorld", "World", "new_world"]
