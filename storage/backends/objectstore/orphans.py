"""The orphan sweep of a pylog root on an object store, and the empty-prefix rule it relies on.

Commits delete what they stop referencing themselves (a manifest's ``garbage``, once due), so
the sweep only has to find what no commit will ever delete: uploads of writers that crashed or
lost a race before deleting them, and garbage whose deletion failed.  :func:`sweep_orphans`

1. overwrites the sweep mark (its time on the store is the sweep's "now", below), then lists
   every object under the root's prefix;
2. only then resolves the *newest* state (never the sweeping root's own snapshot, which may be
   older); if there is none it stops there, deleting and aborting nothing;
3. deletes every listed object that is at least :func:`orphan_grace_s` old (by its modification
   time on the server) and that the newest state neither maps a file to nor lists in its
   ``garbage`` nor retains as a checkpoint, except outside objects (``_pylog/direct/``), the
   hint, commits from the oldest one the state retains on, checkpoints numbered at or above the
   state's, and other keys under ``_pylog/`` not named like what pylog writes there.  Older
   commits and checkpoints are deleted like any object (commits normally delete them through ``garbage``);
4. on S3, aborts the multipart uploads under the prefix begun at least the grace ago (a writer
   that died in the middle of a large upload leaves an invisible, billed upload behind).

The grace is ``max(pylog.file_delete_delay_ms, 1 h)``, and an object's age is judged by the
store's clock only: each sweep first overwrites the sweep mark (:data:`SWEEP_MARK`, a fresh token)
and takes that object's modification time in its own listing as "now", so no host clock (one
suspended, one set back or forward) and no stall of the sweeper makes an upload look older than it
is.  A commit in flight is safe from a sweep on three counts:

* the listing comes before the manifest is resolved, so an upload referenced by a commit created
  in between counts as referenced, and the sweep resolves the newest state once more just before
  it deletes (a commit created while it decided keeps its objects);
* a commit whose uploads began more than half the grace before it creates its commit deletes them
  and runs again (uploading under a new writer token);
* and whatever its create took (a stalled request, a suspended host), a writer reads the sweep
  mark after its create: if a sweep began since before its uploads (the mark changed), it uploads
  its objects again (same keys, same bytes) before it acknowledges.  A sweep that began before
  its uploads takes them for younger than itself and never deletes them.  One GET a commit that
  uploads anything (:func:`sweep_mark`); the uploads again only when a sweep ran meanwhile.

Left: a sweep that stalls, between its second resolution and its delete request, for longer than
a writer's whole commit (create and re-upload) can still delete objects that commit names.

Since the sweep deletes whatever no manifest refers to, a prefix must hold one pylog root and
nothing else: :func:`check_empty_prefix` refuses a root's first commit anywhere else.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from pylog.storage.backends.objectstore.client import PROBES, ObjectClient
from pylog.storage.backends.objectstore.keys import OUTSIDE, is_upload_key
from pylog.storage.backends.objectstore.snapshot import (
    CHECKPOINTS,
    HINT,
    LOG,
    Snapshot,
    checkpoint_number,
    commit_number,
)
from pylog.storage.errors import StorageError

log = logging.getLogger("pylog.storage")

SWEEP_MARK = "_pylog/sweep"
"""Overwritten with a fresh token by every sweep before it lists: its modification time is the
sweep's "now" by the store's clock, and a writer that sees it change since before its uploads
knows a sweep may have taken them (see the module doc)."""

ORPHAN_GRACE_S = 3600.0
"""Unreferenced objects younger than this (or the delete delay, if longer) are never swept."""


def orphan_grace_s(store: ObjectClient) -> float:
    """Age below which an unreferenced object may still be an upload of a commit in flight."""
    return max(store.file_delete_delay_ms / 1000.0, ORPHAN_GRACE_S)


_MARKS: dict[str, bytes | None] = {}
"""Per root URL, the sweep mark as this process last read it: the one reading a commit takes
before its uploads, whichever root object of the process read it."""
_MARKS_LOCK = threading.Lock()


def sweep_mark(store: ObjectClient) -> bytes | None:
    """The current sweep mark (None before the first sweep): one GET.  Remembered for
    :func:`mark_before_uploads`."""
    try:
        mark = store.get(SWEEP_MARK)
    except FileNotFoundError:
        mark = None
    with _MARKS_LOCK:
        _MARKS[store.url] = mark
    return mark


def mark_before_uploads(store: ObjectClient) -> bytes | None:
    """A reading of the sweep mark taken before the uploads that follow: the one this process
    last read for this root (no request), else one GET.  Any earlier reading will do: every
    sweep writes a fresh token, so a sweep that began since that reading has changed the mark;
    an old reading only makes a writer upload again when it did not need to."""
    with _MARKS_LOCK:
        if store.url in _MARKS:
            return _MARKS[store.url]
    return sweep_mark(store)


def sweep_orphans(
    store: ObjectClient, newest: Callable[[], Snapshot | None], now_s: float | None = None
) -> tuple[int, int] | None:
    """Sweep ``store`` (see the module doc); ``newest`` resolves its newest state.  Returns
    how many objects were deleted and how many multipart uploads were aborted, or None when
    there is no manifest (nothing is touched then).  Ages are measured by the store's clock;
    ``now_s`` ahead of this host's clock moves that clock forward by as much (how tests age
    objects), never back, and a host clock ahead of the store's adds nothing."""
    ahead = 0.0 if now_s is None else max(0.0, now_s - time.time())
    grace = orphan_grace_s(store)
    store.put(SWEEP_MARK, uuid.uuid4().hex.encode())  # before the listing: see the module doc
    listing = store.list("")
    snap = newest()  # after the listing: what is committed meanwhile is referenced or too young
    if snap is None:
        return None
    if SWEEP_MARK in listing:
        now = listing[SWEEP_MARK][1] + ahead  # the store's clock when this sweep began
    else:
        log.warning("%s: the sweep mark is not in the listing; sweeping nothing this time", store.url)
        return 0, 0
    referenced = snap.keys()
    doomed = []
    for key, (_, mtime, _) in listing.items():
        if key in referenced or key.startswith(OUTSIDE) or key == HINT or now - mtime < grace:
            continue
        if key.startswith("_pylog/") and not _sweepable(key, snap):
            continue
        doomed.append(key)
    if doomed:
        again = newest()  # a commit created while this sweep decided keeps its objects
        if again is not None and again is not snap:
            referenced = again.keys()
            doomed = [k for k in doomed if k not in referenced]
    store.delete(doomed)
    return len(doomed), store.abort_stale_uploads(grace, now)


def _sweepable(key: str, snap: Snapshot) -> bool:
    """Whether a key under ``_pylog/`` that ``snap`` does not reference may be swept."""
    if key.startswith(LOG):
        num = commit_number(key)
        return num is not None and num < snap.retained_from
    if key.startswith(CHECKPOINTS):
        num = checkpoint_number(key)
        return num is not None and num < snap.number
    return key.startswith(PROBES)


def check_empty_prefix(store: ObjectClient) -> None:
    """Before a root's first commit: the prefix must hold nothing but probes, outside objects and
    uploads of earlier attempts (data, or the checkpoint of a first commit that never landed), or
    the sweep would take those objects (a copied Kafka log directory, another dataset) for
    garbage."""
    other = sorted(
        k
        for k in store.list("")
        if not k.startswith((PROBES, OUTSIDE, CHECKPOINTS))
        and k not in (HINT, SWEEP_MARK)
        and not is_upload_key(k)
    )
    if other:
        raise StorageError(
            f"{store.url}: holds {len(other)} objects but no pylog manifest (e.g. {other[0]!r}); "
            "pylog creates a root only under an empty prefix (its sweeps delete objects no manifest "
            "refers to). A copied Kafka log directory can be read with read_only=True"
        )


__all__ = [
    "ORPHAN_GRACE_S",
    "SWEEP_MARK",
    "check_empty_prefix",
    "orphan_grace_s",
    "sweep_mark",
    "sweep_orphans",
]
