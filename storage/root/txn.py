"""Transactions of a root on an object store (the ``Root`` side of
:mod:`~pylog.storage.backends.objectstore.storage`).

On local disk a change of a root is made durable step by step with Kafka's mechanisms, and
:meth:`Transactions.transaction` just runs the function.  On an object store every public
operation that changes the root (``create_topic``, ``append``, ``publish``, maintenance...) runs
as one transaction: its file changes collect in
:class:`~pylog.storage.backends.objectstore.storage.ObjectStorage`'s
working tree, the logs it wrote are sealed once larger than ``INLINE_MAX`` (an object is never
appended to; a small active segment stays inline in the state), and one commit publishes
everything.  A commit that loses the race to another writer of the same partitions loads the
newest state and runs the operation again; an operation that raises publishes nothing.

A writer keeps its logs open across its own commits: a commit settles them as closing them
would (flushed, the active segment's last time-index entry written, segments waiting for
deletion deleted) but leaves their files open (an append handle of an object store outlives a
commit), and the state it publishes is the one those logs already describe, so the next
operation opens nothing and a commit costs the same however many segments the logs hold.
Whenever the root takes a state it did not write itself - a commit re-based on another
writer's, a lost race, a failed operation, :meth:`Transactions.refresh`, or a snapshot its
storage moved to meanwhile - the logs are dropped and reopened from that state when next needed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pylog.storage.backends.objectstore.keys import INLINE_MAX
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.errors import CommitConflictError, PylogError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root import publish as pub
from pylog.storage.root.metadata import TopicMetadata
from pylog.storage.root.writer import mark_clean_shutdown, read_root

if TYPE_CHECKING:
    from pylog.storage.backends.base import Storage
    from pylog.storage.partition.log import Log

log = logging.getLogger("pylog.storage")

COMMIT_ATTEMPTS = 50
"""How often an operation on an object store is re-run after losing a commit race."""

T = TypeVar("T")


def _settle(lg: Log) -> None:
    """What closing a writer's log writes, its files left open: before a commit."""
    lg.flush()
    active = lg.active
    active.time_index.maybe_append(
        active.max_timestamp_so_far, active.offset_of_max_timestamp, skip_full_check=True
    )
    lg.delete_pending(force=True)


def mutation(fn: Callable[..., T]) -> Callable[..., T]:
    """A public operation that changes the root: one atomic transaction on an object store."""

    @functools.wraps(fn)
    def run(self: Transactions, *args: Any, **kwargs: Any) -> T:
        return self.transaction(lambda: fn(self, *args, **kwargs))

    return run


class Transactions:
    """The transaction machinery of :class:`~pylog.storage.root.manager.Root`."""

    storage: Storage
    _txn_depth: int
    commits: int
    _logs: dict[tuple[str, int], Log]
    _writer: contextlib.ExitStack | None
    _failed: BaseException | None
    _had_clean_shutdown: bool
    _recovery_points: dict[tuple[str, int], int]
    _start_offsets: dict[tuple[str, int], int]
    _meta: TopicMetadata
    _state: pub.PublishState
    _kept_snapshot: object | None = None  # the state this root's open logs describe (object stores)

    def checkpoint(self) -> None:  # pragma: no cover - Root's
        raise NotImplementedError

    @property
    def transactional(self) -> bool:
        """True on an object store: every change is published by one manifest commit."""
        return bool(getattr(self.storage, "transactional", False))

    def transaction(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which changes this root through its methods or logs) as one atomic change.

        On local disk this is just ``fn()``: Kafka's mechanisms make each step durable.  On an
        object store the changes are published together by one manifest commit when ``fn``
        returns; if another writer committed first, the newest state is loaded and ``fn`` runs
        again (so it must decide from what it reads, as every Root method does); if ``fn``
        raises, nothing of it is published.  Nested calls join the outer transaction."""
        st = self.storage
        if not isinstance(st, ObjectStorage) or self._txn_depth:
            return fn()
        if (
            self._writer is not None
            and self._kept_snapshot is not None
            and st.snapshot is not self._kept_snapshot
        ):
            # the storage moved to another state since this root's last commit (a reader's
            # refresh of it): the logs kept open describe the old one
            self._end_transaction(st, refresh=False)
        for attempt in range(COMMIT_ATTEMPTS):
            self._txn_depth += 1
            st.begin()
            try:
                result = fn()
                self._commit_transaction(st)
                return result
            except CommitConflictError as e:
                log.info("%s; running the operation again on the newest state", e)
                self._end_transaction(st, refresh=True)
                time.sleep(min(0.5, 0.01 * 2**attempt) * (0.5 + (attempt % 7) / 7))
            except BaseException:
                self._end_transaction(st, refresh=False)
                raise
            finally:
                self._txn_depth -= 1
        raise PylogError(
            f"{st.describe()}: gave up after {COMMIT_ATTEMPTS} attempts: other writers kept committing "
            "first; nothing of this operation was published"
        )

    def _commit_transaction(self, st: ObjectStorage) -> None:
        writing = self._writer is not None
        if writing:
            for lg in self._logs.values():
                if not lg.read_only and lg._failed is None and lg.active.size > INLINE_MAX:
                    # objects are never appended to: seal what will be uploaded (a smaller
                    # active segment stays inline in the state; the next commit extends it)
                    lg.roll()
            for lg in self._logs.values():
                if not lg.read_only and lg._failed is None:
                    _settle(lg)
            self.checkpoint()
            mark_clean_shutdown(self.storage)
        base = st.number
        committed = st.commit()
        if committed:
            self.commits += 1
        own = not committed or st.number == base + 1  # else re-based on other writers' commits
        if writing and own and all(not lg.read_only and lg._failed is None for lg in self._logs.values()):
            self._keep_writing(st)
        else:
            for lg in self._logs.values():
                for seg in lg.segments:
                    seg.close_files()
            self._logs.clear()
            self._reload()

    def _keep_writing(self, st: ObjectStorage) -> None:
        """After this root's own commit: the published state is the one its logs describe.  The
        logs and the writer stay; what a new writer would read from that state is read here."""
        self._failed = None
        self._had_clean_shutdown = True  # the commit wrote the clean-shutdown marker
        self._recovery_points = ckpt.read_offsets(self.storage, ckpt.RECOVERY_POINT)
        self._read_root()
        self._kept_snapshot = st.snapshot

    def _end_transaction(self, st: ObjectStorage, *, refresh: bool) -> None:
        """Drop what the transaction changed (and maybe load the newest state)."""
        for lg in self._logs.values():
            lg._failed = lg._failed or PylogError("transaction discarded")
            with contextlib.suppress(Exception):
                lg.close()
        self._logs.clear()
        if refresh:
            st.refresh()
        else:
            st.rollback()
        self._reload()

    def _read_root(self) -> None:
        """The log start offsets, topics and state, as a reader reads them (writer.read_root)."""
        files = read_root(self.storage)
        self._start_offsets, self._meta, self._state = files.start_offsets, files.meta, files.state

    def _reload(self) -> None:
        """State from the storage's current tree (after a commit, a rollback or a refresh)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._kept_snapshot = None
        self._failed = None
        self._had_clean_shutdown = False
        self._recovery_points = {}
        self._read_root()

    def refresh(self) -> None:
        """See what other writers published since this root was opened (object stores; on
        local disk, reopen the root)."""
        if isinstance(self.storage, ObjectStorage) and not self._txn_depth:
            for lg in self._logs.values():
                lg.close()
            self._logs.clear()
            self.storage.refresh()
            self._reload()

    def sweep_orphans(self, now_ms: int | None = None) -> int:
        """Delete objects no manifest refers to, older than max(file.delete.delay.ms, 1 h) (object stores)."""
        if isinstance(self.storage, ObjectStorage):
            return self.storage.sweep_orphans(now_ms)
        return 0
