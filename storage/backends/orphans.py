"""The orphan sweep of a pylog root on an object store, and the empty-prefix rule it relies on.

Commits delete what they stop referencing themselves (a manifest's ``garbage``, once due), so
the sweep only has to find what no commit will ever delete: uploads of writers that crashed or
lost a race before deleting them, and garbage whose deletion failed.  :func:`sweep_orphans`

1. takes the current time, then lists every object under the root's prefix;
2. only then resolves the *newest* state (never the sweeping root's own snapshot, which may be
   older); if there is none it stops there, deleting and aborting nothing;
3. deletes every listed object that is at least :func:`orphan_grace_s` old (by its modification
   time on the server) and that the newest state neither maps a file to nor lists in its
   ``garbage`` nor retains as a checkpoint, except direct objects (``_pylog/direct/``), the
   hint, commits from the oldest one the state retains on, checkpoints and manifests numbered
   at or above the state's, the format 1 marker of an upgraded root, and other keys under
   ``_pylog/`` not named like what pylog writes there.  Older commits, checkpoints and manifests
   are deleted like any object (commits normally delete them through ``garbage``);
4. on S3, aborts the multipart uploads under the prefix begun at least the grace ago (a writer
   that died in the middle of a large upload leaves an invisible, billed upload behind).

The grace is ``max(pylog.file_delete_delay_ms, 1 h)``.  A commit in flight is safe from it on
two counts.  The listing comes before the manifest is resolved, so an upload referenced by a
manifest created in between counts as referenced.  And a commit whose uploads began more than
half the grace before it creates its manifest deletes them and runs again (uploading under a new
writer token), so the uploads of a manifest created after the sweep resolved the newest one
were younger than the grace when listed, unless that create itself took more than half the grace.

Since the sweep deletes whatever no manifest refers to, a prefix must hold one pylog root and
nothing else: :func:`check_empty_prefix` refuses a root's first commit anywhere else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pylog.storage.backends.manifest import DIRECT, MANIFESTS, is_upload_key, manifest_number
from pylog.storage.backends.objectstore import PROBES, ObjectStore
from pylog.storage.backends.snapshot import CHECKPOINTS, HINT, LOG, Snapshot, checkpoint_number, commit_number
from pylog.storage.errors import StorageError

ORPHAN_GRACE_S = 3600.0
"""Unreferenced objects younger than this (or the delete delay, if longer) are never swept."""


def orphan_grace_s(store: ObjectStore) -> float:
    """Age below which an unreferenced object may still be an upload of a commit in flight."""
    return max(store.file_delete_delay_ms / 1000.0, ORPHAN_GRACE_S)


def sweep_orphans(
    store: ObjectStore, newest: Callable[[], Snapshot | None], now_s: float | None = None
) -> tuple[int, int] | None:
    """Sweep ``store`` (see the module doc); ``newest`` resolves its newest state.  Returns
    how many objects were deleted and how many multipart uploads were aborted, or None when
    there is no manifest (nothing is touched then)."""
    now = time.time() if now_s is None else now_s
    grace = orphan_grace_s(store)
    listing = store.list("")
    snap = newest()  # after the listing: what is committed meanwhile is referenced or too young
    if snap is None:
        return None
    referenced = snap.keys()
    doomed = []
    for key, (_, mtime, _) in listing.items():
        if key in referenced or key.startswith(DIRECT) or key == HINT or now - mtime < grace:
            continue
        if key.startswith("_pylog/") and not _sweepable(key, snap):
            continue
        doomed.append(key)
    store.delete(doomed)
    return len(doomed), store.abort_stale_uploads(grace, now)


def _sweepable(key: str, snap: Snapshot) -> bool:
    """Whether a key under ``_pylog/`` that ``snap`` does not reference may be swept."""
    if key.startswith(LOG):
        num = commit_number(key)
        return num is not None and num < snap.retained_from and not snap.from_v1
    if key.startswith(CHECKPOINTS):
        num = checkpoint_number(key)
        return num is not None and num < snap.number and not snap.from_v1
    if key.startswith(MANIFESTS):
        num = manifest_number(key)
        return num is not None and num < snap.number and num != snap.v1_marker
    return key.startswith(PROBES)


def check_empty_prefix(store: ObjectStore) -> None:
    """Before a root's first commit: the prefix must hold nothing but probes, direct objects and
    uploads of earlier attempts (data, or the checkpoint of a first commit that never landed), or
    the sweep would take those objects (a copied Kafka log directory, another dataset) for
    garbage."""
    other = sorted(
        k
        for k in store.list("")
        if not k.startswith((PROBES, DIRECT, CHECKPOINTS)) and k != HINT and not is_upload_key(k)
    )
    if other:
        raise StorageError(
            f"{store.url}: holds {len(other)} objects but no pylog manifest (e.g. {other[0]!r}); "
            "pylog creates a root only under an empty prefix (its sweeps delete objects no manifest "
            "refers to). A copied Kafka log directory can be read with read_only=True"
        )


__all__ = ["ORPHAN_GRACE_S", "check_empty_prefix", "orphan_grace_s", "sweep_orphans"]
