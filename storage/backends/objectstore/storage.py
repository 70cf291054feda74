"""A pylog root on an object store: a copy-on-write file tree published by numbered commits.

The log engine (segments, indexes, checkpoints, compaction's ``.cleaned``/``.swap`` renames,
retention's ``.deleted`` files) runs unchanged on :class:`ObjectStorage`, a :class:`Storage`
whose files live in an in-memory working copy until :meth:`ObjectStorage.commit` publishes
them all at once::

    <base>/_pylog/log/00000000000000000042.json         commit 42: what it changed
    <base>/_pylog/checkpoints/<number>.<token>.json     the whole state at some commits
    <base>/<topic>-<p>/00000000000000000000.log.<token> an immutable segment object
    <base>/_pylog/direct/<topic>-<p>/.pylog-stage.*     staged sink data (not part of the state)
    <base>/_pylog/direct/pylog-consumer-offsets.<group> a consumer group's offsets

The state maps every file of the tree to an immutable object (or holds its bytes inline when
it is small and not segment data) and lists the directories.  A commit

1. uploads the files written since the last commit under fresh, never reused keys;
2. creates commit N+1 with put-if-absent (``If-None-Match: *``).  The commit holds a
   random writer token, so a create whose response was lost is recognised as ours;
3. only then deletes objects superseded longer than the storage option
   ``pylog.file_delete_delay_ms`` (60 s) ago (they are listed in the state's ``garbage``
   until then, so readers of an older state finish).

A writer that loses the race (N+1 exists and is not ours) removes its uploads and raises
:class:`CommitConflictError`; :class:`~pylog.storage.root.manager.Root` then re-reads the newest
state and runs the operation again.  Every crash leaves state N or N+1 complete; what a
crashed writer uploaded is unreferenced and removed by :meth:`ObjectStorage.sweep_orphans`.

The commit and checkpoint documents are in :mod:`~pylog.storage.backends.objectstore.snapshot`,
finding the newest state and committing in :mod:`~pylog.storage.backends.objectstore.commitlog`,
object keys and inline files in :mod:`~pylog.storage.backends.objectstore.keys`, the orphan
sweep in
:mod:`~pylog.storage.backends.objectstore.orphans`, the reading and caching of objects in
:mod:`~pylog.storage.backends.objectstore.reads`, the working copy in
:mod:`~pylog.storage.backends.objectstore.worktree`, the outside objects in
:mod:`~pylog.storage.backends.objectstore.outside`.

Renames and deletions are changes of the tree only (no object is copied), so Kafka's swap
protocol costs nothing here.  Objects are never appended to: the root seals (rolls) every
active segment that received data before it commits, so each commit writes whole segments
and the compactor merges small ones (:mod:`pylog.storage.maintenance.merge`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pylog.storage.backends.base import AppendFile, Storage
from pylog.storage.backends.objectstore import commitlog, orphans, overlay
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.keys import OUTSIDE, is_outside, parent
from pylog.storage.backends.objectstore.outside import OutsideAppend, OutsideObjects
from pylog.storage.backends.objectstore.reads import ObjectReader
from pylog.storage.backends.objectstore.snapshot import LOG, Ref, Snapshot
from pylog.storage.backends.objectstore.worktree import Entry, VirtualAppend, WorkingTree
from pylog.storage.errors import CommitConflictError, NoRootError, StorageError, StorageIOError
from pylog.storage.faults import Faults

log = logging.getLogger("pylog.storage")

_KAFKA_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+-\d+/\d{20}\.log$")


class ObjectStorage(Storage):
    """The file tree of one manifest plus this transaction's changes (see the module doc)."""

    transactional = True

    external_changes = False  # files change only through manifests, never renamed from outside

    def __init__(
        self, store: ObjectClient, *, read_only: bool = False, load: bool = True, trust_known_s: float = 0.0
    ):
        self.store = store
        self.read_only = read_only
        self.faults = Faults()  # the steps of a commit, for fault injection (pylog.storage.faults)
        self._lock = threading.RLock()
        self._reader = ObjectReader(store)
        self.snapshot = Snapshot()
        self.mergers: dict[str, commitlog.Merger] = {}  # root files merged key by key on a race
        self.rebases = 0  # commits re-based on other writers' (disjoint) commits
        self.conflicts = 0  # commits that lost to an overlapping one (the operation runs again)
        self._confirmed_at = float("-inf")  # when the snapshot was last known to be the newest
        self._base: dict[str, Ref] = {}  # the snapshot's files (never modified)
        self._adopted_base: set[str] | None = None  # keys of staged objects the snapshot holds
        self._adopting: set[str] = set()
        self._tree = WorkingTree(store.url)  # the snapshot's files plus this transaction's changes
        self._direct = OutsideObjects(store)  # staged data and consumer offsets (outside the state)
        self.in_transaction = False
        self.kafka_dir = False
        self.uploads_aborted = 0
        if load:  # without: an empty tree, for staging only (no request)
            self.refresh(trust_known_s)

    @classmethod
    def open(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool,
        load: bool = True,
        trust_known_s: float = 0.0,
    ) -> ObjectStorage:
        """``load=False``: the state is not read (no request); only for staging, which writes
        outside objects and reads nothing of the tree.  ``trust_known_s``: see :meth:`refresh`."""
        st = cls(
            ObjectClient(url, storage_options), read_only=read_only, load=load, trust_known_s=trust_known_s
        )
        if load and read_only and st.number < 0 and not st._load_kafka_dir():
            raise NoRootError(
                f"{url}: no pylog root here (no commit under {LOG}); "
                "create one with a writer "
                "(pylog create-topic, or a Spark write with the partitions option)"
            )
        return st

    def describe(self) -> str:
        return self.store.url

    @property
    def number(self) -> int:
        """The version of the state this root sees (-1: none yet)."""
        return self.snapshot.number

    # ------------------------------------------------------------------ manifests

    def refresh(self, trust_known_s: float = 0.0) -> None:
        """Load the newest state and drop uncommitted changes.  ``trust_known_s``: take the
        state this process confirmed newest at most that long ago without asking the store
        (a writer: its commit is conditional, and a race with a newer state re-bases or runs
        the operation again on it)."""
        with self._lock:
            cached = commitlog.known(self.store, trust_known_s) if trust_known_s > 0 else None
            if cached is not None:
                self._confirmed_at = cached[1]
                self._load(cached[0])
                return
            started = time.monotonic()  # the answer is at least this fresh
            snap = commitlog.resolve(self.store, self.snapshot, self._confirmed_at)
            self._confirmed_at = started
            self._load(snap or Snapshot())
            if snap is None and self.kafka_dir:
                self._load_kafka_dir()

    def refresh_snapshot(self) -> bool:
        """A reader whose manifest is older than ``pylog.file_delete_delay_ms`` may find objects
        of it deleted: move to the newest manifest (readers then continue there from the offset
        they need, see :mod:`pylog.storage.partition.log`).  Never while this root has changes
        it has not committed.  True if the manifest changed."""
        with self._lock:
            if self.in_transaction or self._tree.dirty:
                return False
            before = {p: (e.key, e.size) for p, e in self._base.items()}
            self.refresh()
            return {p: (e.key, e.size) for p, e in self._base.items()} != before

    def _load_kafka_dir(self) -> bool:
        """A Kafka log directory copied to the store (``<topic>-<p>/<base>.log`` objects, no
        manifest): its objects *are* its files, read-only.  False if there is none here."""
        listing = {k: v for k, v in self.store.list("").items() if not k.startswith("_pylog/")}
        if not any(_KAFKA_SEGMENT.match(k) for k in listing):
            return False
        files = {k: Ref(size, key=k) for k, (size, _, _) in listing.items()}
        self._load(Snapshot(files=files, dirs={d for k in listing if (d := parent(k))}))
        self.kafka_dir = True
        return True

    def _load(self, snap: Snapshot, keep_deferred: bool = False, same_names: bool = False) -> None:
        """``same_names``: ``snap`` is what this root's own commit published from its working
        tree (the same paths: the tree's names index stays)."""
        self.snapshot = snap
        self._adopted_base = None
        self._base = snap.files
        self._reset_working(keep_deferred, same_names)

    def _reset_working(self, keep_deferred: bool = False, same_names: bool = False) -> None:
        """Working tree = the manifest's; outside objects are listed again when needed."""
        self._tree.reset(self._base, self.snapshot.dirs, same_names)
        self._adopting = set()
        self._direct.forget(deferred=not keep_deferred)

    def begin(self) -> None:
        self.in_transaction = True
        self._direct.forget()  # staged objects of other processes since the last listing

    def rollback(self) -> None:
        with self._lock:
            self._reset_working()
            self.in_transaction = False

    def commit(self, now_ms: int | None = None) -> bool:
        """Publish this transaction's changes as manifest N+1 (see the module doc).  Returns False
        when there was nothing to publish; raises :class:`CommitConflictError` on a lost race."""
        with self._lock:
            try:
                if not self._tree.changed(self._base, self.snapshot.dirs):
                    self._run_deferred()
                    self._reset_working(keep_deferred=False)
                    return False
                return self._commit(int(time.time() * 1000) if now_ms is None else now_ms)
            finally:
                self.in_transaction = False

    def _commit(self, now: int) -> bool:
        if self.read_only:
            raise StorageError(f"{self.store.url}: opened read-only")
        if self.number < 0:
            orphans.check_empty_prefix(self.store)
        self.store.probe()
        token = uuid.uuid4().hex
        files, uploads = self._tree.changes(self.snapshot, token)
        # a sweep that began before this reading of its mark never deletes what is uploaded next
        mark = orphans.mark_before_uploads(self.store)
        self.faults.step("before-upload")
        uploaded_at = time.monotonic()
        self.store.put_many(uploads)
        self.faults.step("uploaded")
        creating = False  # a create of our commit object is in flight (it may have landed)

        def step(name: str) -> None:
            nonlocal creating
            if name in ("creating", "manifest-created"):
                creating = True
            elif name == "conflict":
                creating = False  # that create lost: our commit is not there
            self.faults.step(name)

        try:
            if time.monotonic() - uploaded_at > self.orphan_grace_s() / 2:
                # an orphan sweep may take these uploads for a crashed writer's: upload them again
                raise CommitConflictError(
                    f"{self.store.url}: commit {self.number + 1} took too long; uploading again"
                )
            done = commitlog.publish(
                self.store,
                self.snapshot,
                files,
                set(self._tree.dirs),
                token=token,
                now=now,
                confirmed_at=self._confirmed_at,
                mergers=self.mergers,
                read=self._read_ref,
                step=step,
                touched=self._tree.touched,
            )
        except BaseException as e:
            conflict = isinstance(e, CommitConflictError)
            self.conflicts += conflict
            if conflict or not creating:
                # our commit is not there: its uploads are nobody's.  Once its create may have
                # landed (an interrupt or a lost reply after it), they may be the state's files:
                # they are left to the orphan sweep, which deletes only what no commit holds.
                with contextlib.suppress(Exception):
                    self.store.delete([k for k, _ in uploads])
            raise
        self._confirmed_at = time.monotonic()
        self._survive_sweeps(mark, uploads + done.uploaded)
        self.rebases += done.rebased
        self._reader.remember(uploads)
        self._load(done.snapshot, keep_deferred=True, same_names=not done.rebased)
        self._run_deferred(done.due)
        self.faults.step("committed")
        return True

    def _survive_sweeps(self, mark: bytes | None, uploads: list[tuple[str, bytes]]) -> None:
        """After our commit was created, before it is acknowledged: when a sweep began since the
        sweep mark ``mark`` was read (before the uploads), it may have deleted them for orphans
        (whatever our create took, whatever any clock did): upload them again, same keys and
        bytes.  One GET; the uploads again only then (see :mod:`.orphans`)."""
        if not uploads:
            return
        try:
            now = orphans.sweep_mark(self.store)
        except Exception as e:  # our commit is there: raising would make the operation run again
            log.warning("%s: could not read the sweep mark (%s); uploading again", self.store.url, e)
            swept = True
        else:
            swept = now != mark  # (a sweep that begins after this reading resolves our commit)
        if not swept:
            return
        log.warning(
            "%s: an orphan sweep may have run while commit %d was in flight; uploading its %d objects again",
            self.store.url,
            self.snapshot.number + 1,
            len(uploads),
        )
        try:
            self.store.put_many(uploads)
        except Exception as e:
            log.error(
                "%s: commit %d is published but uploading its objects again failed (%s); an orphan "
                "sweep that ran meanwhile may have deleted some",
                self.store.url,
                self.snapshot.number + 1,
                e,
            )

    def _read_ref(self, ref: Ref) -> bytes:
        if ref.data is not None:
            return ref.data
        assert ref.key is not None
        return self._reader.read(ref.key, ref.size, 0, ref.size)

    def _adopted(self) -> set[str]:
        """Keys of staged objects the state adopted as files, or this transaction adopts (never
        deleted as staged data)."""
        if self._adopted_base is None:
            self._adopted_base = {
                e.key for e in self._base.values() if e.key is not None and e.key.startswith(OUTSIDE)
            }
        return self._adopted_base | self._adopting

    def _run_deferred(self, extra: list[str] | None = None) -> None:
        keys = self._direct.take_deferred(self._adopted) + list(extra or [])
        if keys:
            try:
                self.store.delete(keys)
            except Exception as e:
                log.warning(
                    "%s: could not delete %d superseded objects (%s); a later sweep will",
                    self.store.url,
                    len(keys),
                    e,
                )

    def orphan_grace_s(self) -> float:
        """Age below which an unreferenced object may still be an upload of a commit in flight."""
        return orphans.orphan_grace_s(self.store)

    def sweep_orphans(self, now_ms: int | None = None) -> int:
        """Delete the objects no manifest will ever delete (see :mod:`.orphans`).
        Returns how many objects were deleted; :attr:`uploads_aborted` is set to how many multipart
        uploads were aborted."""
        # judged against the newest manifest, read without touching this root's snapshot: counting
        # it as a confirmation (``_newest``) would let the next commit skip its gap check
        swept = orphans.sweep_orphans(
            self.store, lambda: commitlog.resolve(self.store), None if now_ms is None else now_ms / 1000.0
        )
        if swept is None:
            return 0
        deleted, self.uploads_aborted = swept
        return deleted

    # ------------------------------------------------------------------ outside objects

    def modified_ms(self, path: str) -> int | None:
        """Outside objects (staged data): the server's modification time as last listed."""
        path = self.check_relative(path)
        return self._direct.modified_ms(path) if is_outside(path) else None

    # ------------------------------------------------------------------ Storage

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        path = self.check_relative(path)
        if is_outside(path):
            return self._direct.read(path, start, end)
        with self._lock:
            e = self._tree.entry(path)
        end = e.size if end is None else min(end, e.size)
        if start >= end:
            return b""
        if e.data is not None:
            return bytes(e.data[start:end])
        assert e.key is not None
        key = e.key
        try:
            if e.patch is None:
                return self._reader.read(key, e.size, start, end)
            return overlay.read_patched(
                lambda lo, hi: self._reader.read(key, e.size, lo, hi), e.patch, start, end
            )
        except FileNotFoundError as err:  # (a reader of an older state refreshes and reads again)
            raise StorageIOError(
                errno.ENOENT,
                f"its object {self.store.url}/{key} is missing (deleted outside pylog? the root's state "
                "still refers to it)",
                f"{self.describe()}/{path}",
                f"read bytes [{start}, {end})",
            ) from err

    def size(self, path: str) -> int:
        path = self.check_relative(path)
        if is_outside(path):
            return self._direct.size(path)
        return self._tree.entry(path).size

    def exists(self, path: str) -> bool:
        path = self.check_relative(path)
        if is_outside(path):
            return path in self._direct.listing()
        return path in self._tree.files or self.isdir(path)

    def isdir(self, path: str) -> bool:
        path = self.check_relative(path)
        return path == "" or path in self._tree.dirs

    def listdir(self, path: str = "") -> list[str]:
        path = self.check_relative(path)
        with self._lock:
            names = self._tree.names(path)
        if path == "":  # consumer offsets: written by other roots at any time
            if not self.in_transaction:
                self._direct.forget()
            names.update(self._direct.tops())
        return sorted(names)

    def listdir_staged(self, path: str) -> list[str]:
        """Staged objects under ``path`` (one LIST of the outside objects per transaction)."""
        path = self.check_relative(path)
        return self._direct.staged(path, self._adopted())

    def makedirs(self, path: str) -> None:
        path = self.check_relative(path)
        self._check_writable(path)
        with self._lock:
            self._tree.makedirs(path)

    def _check_writable(self, path: str) -> None:
        if self.read_only:
            raise StorageError(f"{self.store.url}/{path}: the root was opened read-only")

    def _local(self, path: str, keep: bool) -> Entry:
        """The working-copy entry of ``path``, copied into memory on first write."""
        e = self._tree.files.get(path)
        if isinstance(e, Entry) and e.local:
            return e
        data = bytearray()
        if e is not None and keep and e.size:
            log.debug("%s/%s: copying an existing object to modify it", self.store.url, path)
            data = bytearray(self.read(path))
        new = Entry(len(data), data=data, local=True)
        self._tree.put(path, new)
        self._tree.dirty = True
        return new

    def open_append(self, path: str, *, direct: bool = False) -> AppendFile:
        """``direct`` (around a page cache) has no meaning for objects and is ignored."""
        path = self.check_relative(path)
        if is_outside(path):
            return OutsideAppend(self._direct, path)
        self._check_writable(path)
        with self._lock:
            return VirtualAppend(self._tree, path, self._local(path, keep=True), self._reopen)

    def _reopen(self, path: str) -> Entry:
        """The working-copy entry of ``path`` for an append handle opened before the working
        copy was last replaced (by a commit: the writer's logs stay open across its commits)."""
        with self._lock:
            if path not in self._tree.files:
                raise FileNotFoundError(
                    errno.ENOENT, "removed or renamed while open for appending (reopen the log)", path
                )
            return self._local(path, keep=True)

    def write_atomic(self, path: str, data: bytes) -> None:
        path = self.check_relative(path)
        if is_outside(path):
            self._direct.put(path, data)
            return
        self._check_writable(path)
        with self._lock:
            e = self._local(path, keep=False)
            e.data = bytearray(data)
            e.size = len(data)

    def rename(self, src: str, dst: str) -> None:
        src, dst = self.check_relative(src), self.check_relative(dst)
        self._check_writable(src)
        with self._lock:
            self._tree.rename(src, dst)

    def delete(self, path: str) -> None:
        path = self.check_relative(path)
        if is_outside(path):
            self._direct.delete(path, defer=self.in_transaction, adopted=self._adopted)
            return
        self._check_writable(path)
        with self._lock:
            self._tree.remove(path)

    def rmdir(self, path: str) -> None:
        path = self.check_relative(path)
        self._check_writable(path)
        with self._lock:
            self._tree.rmdir(path)

    def upload_staged(self, path: str, local_path: str) -> None:
        """Upload the local file ``local_path`` as the staged (direct) object ``path``, streamed."""
        path = self.check_relative(path)
        if not is_outside(path):
            raise StorageError(f"{self.store.url}/{path}: only staged data is uploaded from a file")
        self._direct.put_file(path, local_path)

    def adopt(self, staged: str, path: str, size: int, patch: bytes | None = None) -> None:
        """Make the staged (direct) object ``staged`` (``size`` bytes, as its writer reported:
        nothing is listed) the file ``path`` of the tree as it is - no download, no upload -
        read with ``patch`` put over it (see ``snapshot.Ref.patch``).
        The object then belongs to the state: deleting or sweeping it as staged data is
        skipped, and it is deleted as garbage once a later state no longer refers to it."""
        staged, path = self.check_relative(staged), self.check_relative(path)
        self._check_writable(path)
        if not is_outside(staged) or is_outside(path):
            raise StorageError(f"{self.store.url}: cannot adopt {staged!r} as {path!r}")
        with self._lock:
            self._tree.put(path, Entry(size, key=OUTSIDE + staged, patch=patch))
            self._adopting.add(OUTSIDE + staged)
            self._tree.dirty = True

    writes_in_place = False  # tasks stage whole objects; a commit adopts them (adopt, write_at)

    def write_at(self, path: str, edits: list[tuple[int, bytes]]) -> None:
        """8-byte ``edits`` of an object of the tree: recorded as its patch (applied on every
        read; nothing is downloaded or uploaded); of a file written in this transaction:
        applied to its bytes."""
        path = self.check_relative(path)
        self._check_writable(path)
        with self._lock:
            e = self._tree.entry(path)
            if e.data is not None:
                e = self._local(path, keep=True)
                assert isinstance(e.data, bytearray)
                for pos, b in edits:
                    e.data[pos : pos + len(b)] = b
                return
            self._tree.put(path, Entry(e.size, key=e.key, patch=overlay.merge(e.patch, edits, e.size, path)))
            self._tree.dirty = True

    def truncate(self, path: str, size: int) -> None:
        path = self.check_relative(path)
        self._check_writable(path)
        with self._lock:
            e = self._local(path, keep=True)
            assert isinstance(e.data, bytearray)
            del e.data[size:]
            e.size = len(e.data)

    def fsync_dir(self, path: str = "") -> None:
        return None

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        # writers are not excluded: each commit is a put-if-absent of the next manifest, and the
        # loser of a race re-reads and retries (optimistic concurrency)
        yield


__all__ = ["ObjectStorage"]
