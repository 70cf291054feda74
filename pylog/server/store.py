"""The root as the server's storage: one thread for every storage call, appends grouped into one
commit, wake-ups of waiting fetches, and maintenance between appends.

The root (:class:`~pylog.storage.root.manager.Root`) is not thread-safe, so every call on it runs
on one storage thread; the event loop never blocks on disk or object-store I/O.  Produce
requests queue their record sets; whenever the storage thread is free it takes *all* queued sets
and appends them with one :meth:`Root.append_batches` (one fsync per log and one state write on
local disk, one commit on an object store), so a hundred producers pay for one commit, not a
hundred.  After each commit the fetches waiting on the partitions written are woken, with what
they read right after the append, on the storage thread, before anything else runs there (a
woken fetch that read afterwards would wait for the next commit, which starts at once).

Maintenance runs as it does after a Spark sink's micro-batch: after a commit, retention and
cleaning of the partitions written since the last run (at most every ``maintenance_interval_s``,
within ``maintenance_budget_s``), and of every partition every
``log.retention.check.interval.ms``.  It runs on the storage thread, between commits, after the
commit before it was acknowledged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from pylog.server.records import offsets_spanned
from pylog.storage.errors import PylogError
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition.log import AppendInfo
from pylog.storage.root.manager import Root

log = logging.getLogger("pylog.server")

T = TypeVar("T")
Key = tuple[str, int]

RETENTION_CHECK_INTERVAL_MS = 300_000
"""Kafka's ``log.retention.check.interval.ms``: every partition is maintained this often."""


@dataclass
class PendingAppend:
    """One produce request's record sets, waiting for the next group commit."""

    sets: dict[Key, bytes | BaseException]
    future: asyncio.Future[dict[Key, AppendInfo | BaseException]]
    meta: dict[Key, Any] = field(default_factory=dict)
    """What the producer-state checks noted of each set (:mod:`~pylog.server.produce`)."""


@dataclass
class StoreStats:
    commits: int = 0
    appends: int = 0
    bytes_appended: int = 0
    maintenance_runs: int = 0
    commit_seconds: float = 0.0
    maintenance_seconds: float = 0.0


class Store:
    """The server's handle on its root (see the module docstring)."""

    def __init__(
        self,
        root: Root,
        *,
        maintenance_interval_s: float = 1.0,
        maintenance_budget_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pylog-storage")
        self._pending: list[PendingAppend] = []
        self._committing = False
        self._waiters: dict[Key, set[asyncio.Future[Any]]] = {}
        self._any_waiters: set[asyncio.Future[Any]] = set()
        self._reads: dict[asyncio.Future[Any], Callable[[], Any]] = {}
        self._dirty: set[Key] = set()
        self._last_maintenance = clock()
        self._last_full_maintenance = clock()
        self.maintenance_interval_s = maintenance_interval_s
        self.maintenance_budget_s = maintenance_budget_s
        self._clock = clock
        self.stats = StoreStats()
        self.before_append: Callable[[list[PendingAppend]], None] | None = None
        """Called on the storage thread with the appends about to be committed (the producer
        sequence checks of :mod:`~pylog.server.produce`)."""
        self.after_append: Callable[[list[PendingAppend], dict[Key, list[Any]]], None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ the storage thread

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the storage thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ appends

    async def append(self, sets: dict[Key, bytes]) -> dict[Key, AppendInfo | BaseException]:
        """Append each partition's record set with the next group commit; per partition, what was
        appended or the error that refused it."""
        loop = asyncio.get_running_loop()
        pending = PendingAppend(dict[Key, "bytes | BaseException"](sets), loop.create_future())
        self._pending.append(pending)
        self._kick()
        return await pending.future

    def _kick(self) -> None:
        if self._committing or not self._pending or self._closed:
            return
        group, self._pending = self._pending, []
        self._committing = True
        loop = asyncio.get_running_loop()
        # the reads of the fetches waiting on what this commit appends, done right after it
        keys = {key for p in group for key in p.sets}
        waiting = set(self._any_waiters).union(*(self._waiters.get(key, ()) for key in keys))
        reads = {fut: self._reads[fut] for fut in waiting if fut in self._reads}
        fut = loop.run_in_executor(self._pool, self._commit_and_read, group, reads)
        fut.add_done_callback(lambda f: self._committed(group, f))

    def _commit_and_read(
        self, group: list[PendingAppend], reads: dict[asyncio.Future[Any], Callable[[], Any]]
    ) -> tuple[dict[Key, list[AppendInfo | BaseException]], dict[asyncio.Future[Any], Any]]:
        out = self._commit(group)
        done = {}
        for fut, read in reads.items():
            with contextlib.suppress(Exception):  # (the fetch reads again itself, and answers it)
                done[fut] = read()
        return out, done

    def _committed(self, group: list[PendingAppend], fut: asyncio.Future[Any]) -> None:
        self._committing = False
        exc = fut.exception()
        results: dict[Key, Any] = {}
        read: dict[asyncio.Future[Any], Any] = {}
        if exc is None:
            results, read = fut.result()
        for p in group:
            if p.future.done():
                continue
            out: dict[Key, AppendInfo | BaseException] = {}
            for key in p.sets:
                got = results.get(key) if exc is None else exc
                if isinstance(got, list):  # the infos of several requests' sets, in order
                    got = got.pop(0)
                out[key] = got if got is not None else PylogError("not appended")
            p.future.set_result(out)
        if exc is None:
            self.wake([k for k in results], read)
        if self._maintenance_due():  # after this commit's acknowledgements, before the next commit
            asyncio.get_running_loop().run_in_executor(self._pool, self._maybe_maintain)
        self._kick()

    def _commit(self, group: list[PendingAppend]) -> dict[Key, list[AppendInfo | BaseException]]:
        """On the storage thread: append every set of ``group`` with one acknowledgement."""
        t0 = self._clock()
        if self.before_append is not None:
            self.before_append(group)  # may refuse sets: they are then exceptions
        per_key: dict[Key, list[bytes]] = {}
        for p in group:
            for key, data in p.sets.items():
                if not isinstance(data, BaseException):
                    per_key.setdefault(key, []).append(data)
        infos = self._append_or_reopen({k: _joined(v) for k, v in per_key.items()}) if per_key else {}
        # each key's AppendInfo split back into the requests' sets, in request order
        split = {key: iter(_split_info(infos[key], parts)) for key, parts in per_key.items()}
        out: dict[Key, list[AppendInfo | BaseException]] = {}
        for p in group:
            for key, data in p.sets.items():
                out.setdefault(key, []).append(data if isinstance(data, BaseException) else next(split[key]))
        if self.after_append is not None:
            try:
                self.after_append(group, out)
            except Exception:  # what was appended is acknowledged whatever a hook does
                log.exception("after an append")
        self.stats.commits += 1
        self.stats.appends += sum(len(parts) for parts in per_key.values())
        self.stats.bytes_appended += sum(len(d) for parts in per_key.values() for d in parts)
        self.stats.commit_seconds += self._clock() - t0
        self._dirty.update(per_key)
        return out

    def _append_or_reopen(self, joined: dict[Key, bytes | memoryview]) -> dict[Key, AppendInfo]:
        try:
            return self.root.append_batches(joined)
        except BaseException:
            # the root refuses writes after a failed append until reopened, whose recovery
            # removes what the failed call wrote: nothing of it was acknowledged
            self._reopen()
            raise

    def _reopen(self) -> None:
        if self.root._failed is None:
            return
        storage, read_only, timeout = self.root.storage, self.root.read_only, self.root.lock_timeout
        try:
            self.root.close()
        except Exception as e:  # the failed root's close may fail the same way
            log.warning("closing the root after a failed append: %s", e)
        self.root = Root(storage, read_only=read_only, lock_timeout=timeout)
        self.root.become_writer()

    # ------------------------------------------------------------------ wake-ups

    def waiter(self, keys: list[Key], read: Callable[[], Any] | None = None) -> asyncio.Future[Any]:
        """A future set at the next commit that appends to one of ``keys`` (or any, if empty):
        to what ``read()`` returned on the storage thread right after that commit, or None
        (``read`` failed, or was not given, or the wake-up is not a commit's)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if read is not None:
            self._reads[fut] = read
        if not keys:
            self._any_waiters.add(fut)
        for key in keys:
            self._waiters.setdefault(key, set()).add(fut)
        return fut

    def forget(self, fut: asyncio.Future[Any], keys: list[Key]) -> None:
        self._any_waiters.discard(fut)
        self._reads.pop(fut, None)
        for key in keys:
            s = self._waiters.get(key)
            if s is not None:
                s.discard(fut)
                if not s:
                    del self._waiters[key]

    def wake(
        self, keys: list[Key], read: dict[asyncio.Future[Any], Any] | None = None, *, every: bool = False
    ) -> None:
        """Wake the fetches waiting on ``keys`` (``every``: all of them, at a stop), each with
        what its read returned (``read``), if it was read."""
        woken: set[asyncio.Future[Any]] = set(self._any_waiters)
        self._any_waiters.clear()
        if every:
            keys = list(self._waiters)
        for key in keys:
            woken |= self._waiters.pop(key, set())
        for fut in woken:
            self._reads.pop(fut, None)
            if not fut.done():
                fut.set_result(read.get(fut) if read else None)

    # ------------------------------------------------------------------ maintenance

    def _full_maintenance_due(self) -> bool:
        return (self._clock() - self._last_full_maintenance) * 1000 >= RETENTION_CHECK_INTERVAL_MS

    def _maintenance_due(self) -> bool:
        return self._full_maintenance_due() or (
            bool(self._dirty) and self._clock() - self._last_maintenance >= self.maintenance_interval_s
        )

    def _maybe_maintain(self) -> None:
        if self._maintenance_due():
            self.maintain_now(full=self._full_maintenance_due())

    def maintain_now(self, *, full: bool = False) -> None:
        """On the storage thread: retention and cleaning of the partitions written since the last
        run (every partition when ``full``), within the budget."""
        partitions = None if full else sorted(self._dirty)
        self._dirty.clear()
        self._last_maintenance = self._clock()
        if full:
            self._last_full_maintenance = self._last_maintenance
        try:
            report = maintain(
                self.root,
                now=int(time.time() * 1000),
                budget_s=self.maintenance_budget_s,
                partitions=partitions,
            )
        except Exception as e:  # maintenance never fails a produce: the next run tries again
            log.warning("maintenance failed: %s", e)
            return
        if report.budget_exhausted:  # work left: the next run (a commit's or the timer's) resumes it
            if partitions is None:
                self._last_full_maintenance -= RETENTION_CHECK_INTERVAL_MS / 1000
            else:
                self._dirty.update(partitions)
        self.stats.maintenance_runs += 1
        self.stats.maintenance_seconds += self._clock() - self._last_maintenance
        if report.segments_deleted or report.cleaning:
            log.info("maintenance: %s", report.summary().replace("\n", "; "))

    async def periodic(self) -> None:
        """Maintenance when no commit comes to run it: of the partitions written since the last
        run once ``maintenance_interval_s`` passed (producers that went quiet right after a
        commit), and of every partition every ``log.retention.check.interval.ms`` (retention by
        time)."""
        while not self._closed:
            await asyncio.sleep(self.maintenance_interval_s)
            if not self._committing and self._maintenance_due():
                await self.call(self._maybe_maintain)

    # ------------------------------------------------------------------ shutdown

    async def drain(self) -> None:
        """Wait until every queued append is committed (or failed)."""
        while self._pending or self._committing:
            await asyncio.sleep(0.005)

    def close(self) -> None:
        """After :meth:`drain`: close the root (checkpoints, clean-shutdown marker) on the storage
        thread and stop it."""
        self._closed = True
        self._pool.submit(self.root.close).result()
        self._pool.shutdown(wait=True)


def _joined(parts: list[bytes]) -> bytes | memoryview:
    """One partition's record sets of several requests as one buffer (numpy's: not zeroed, and
    huge pages when large; ``bytes.join`` page-faults a fresh allocation every commit)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([np.frombuffer(p, np.uint8) for p in parts]).data


def _split_info(info: AppendInfo, parts: list[bytes]) -> list[AppendInfo]:
    """One partition's AppendInfo of several joined record sets, as each set's own."""
    if len(parts) == 1:
        return [info]
    out = []
    base = info.first_offset
    for data in parts:
        span = offsets_spanned(data)
        out.append(AppendInfo(base, base + span - 1, info.max_timestamp, 0, 0, len(data)))
        base += span
    return out
