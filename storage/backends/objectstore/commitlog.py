"""Finding and extending the newest state of a root on an object store.

**Reading.**  Commit numbers have no gaps and a commit object is created with put-if-absent, so
a process that knows state N learns about N+1, N+2... by GETting them until one is missing: when
nothing changed, one small GET and no LIST.  A process that knows nothing (or whose knowledge is
older than half ``pylog.file_delete_delay_ms``, after which old commit objects may have been
deleted) starts from the checkpoint named by the hint object (two GETs) and catches up from
there.  Only when the hint is missing or does not match its checkpoint (a crash between the two,
a hand-edited root) are the keys LISTed.

**Committing** state N+1 on a snapshot N (:func:`publish`):

1. at the first commit, and then when :func:`_checkpoint_due`, the whole new state is uploaded
   as a checkpoint under a key of its own (never trusted until step 2 names it);
2. commit N+1 is created with put-if-absent: the commit point;
3. after a checkpoint, the hint is overwritten (only a hint: readers verify what it names).

A writer that loses the race reads the commits that won and, if they touched none of the
files it changed (root files with a three-way merge function - high watermarks, Kafka's
checkpoint files, topic metadata - are merged key by key), re-bases its change on them and tries
the next number; only a real overlap (:func:`_overlap`) makes the whole operation run again.

**Deleting.**  Commits and checkpoints are never deleted while a reader may start from them:
when checkpoint C2 is written after C1, the commits up to C1 and the checkpoint before C1 go to
``garbage`` and are deleted a delete delay later; the commits after C1 stay.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.snapshot import (
    CHECKPOINTS,
    HINT,
    LOG,
    Change,
    CheckpointRef,
    Ref,
    Snapshot,
    apply,
    check_version,
    checkpoint_key,
    checkpoint_number,
    checkpoint_ref,
    commit_key,
    commit_number,
    diff,
    dropped_keys,
    encode_checkpoint,
    encode_commit,
    encode_hint,
    parse_checkpoint,
    parse_commit,
    parse_hint,
)
from pylog.storage.errors import CommitConflictError, CorruptMetadataError, UnsupportedFormatError

log = logging.getLogger("pylog.storage")

CHECKPOINT_INTERVAL = 20
"""A checkpoint of the whole state is written at most every this many commits..."""

CHECKPOINT_BYTES_RATIO = 2
"""...and once the commits since the last one add up to 1/this of its size: a checkpoint then
costs each commit at most about this many times its own bytes, however large the state grows
(and a process that knows nothing reads at most the commits since, in concurrent windows)."""


def _checkpoint_due(base: Snapshot, n: int) -> bool:
    if not base.checkpoints:
        return True
    last = base.checkpoints[-1]
    return n - last.number >= CHECKPOINT_INTERVAL and base.log_bytes * CHECKPOINT_BYTES_RATIO >= last.size


REBASES = 8
"""How often one commit is re-based on winners of the race before the operation runs again."""

Merger = Callable[[bytes | None, bytes | None, bytes | None, set[str]], bytes | None]
"""Three-way merge of a root file: (base, ours, theirs, units this commit touches) -> merged
bytes, or None when the changes overlap."""

KNOWN_ROOTS = 64
"""How many roots' newest states a process keeps (the least recently used go first)."""

_KNOWN: OrderedDict[str, tuple[Snapshot, float]] = OrderedDict()
"""Per URL, the newest state this process has read or written and when it was confirmed newest
(``time.monotonic``); at most :data:`KNOWN_ROOTS` of them."""
_KNOWN_LOCK = threading.Lock()


def _get(store: ObjectClient, key: str) -> bytes | None:
    try:
        return store.get(key)
    except FileNotFoundError:
        return None


def remember(store: ObjectClient, snap: Snapshot, confirmed_at: float) -> None:
    with _KNOWN_LOCK:
        old = _KNOWN.get(store.url)
        if old is None or old[0].number <= snap.number:
            _KNOWN[store.url] = (snap, confirmed_at)
        _KNOWN.move_to_end(store.url)
        while len(_KNOWN) > KNOWN_ROOTS:
            _KNOWN.popitem(last=False)


def known(store: ObjectClient, within_s: float) -> tuple[Snapshot, float] | None:
    """The state this process last confirmed newest for this root, with when it did, if that was
    at most ``within_s`` seconds ago, and under half the delete delay (a commit from an older
    state would be refused anyway, and objects it maps may be gone); no request."""
    within_s = min(within_s, store.file_delete_delay_ms / 2000)
    with _KNOWN_LOCK:
        cached = _KNOWN.get(store.url)
    if cached is None or time.monotonic() - cached[1] > within_s:
        return None
    return cached


def forget(store: ObjectClient) -> None:
    with _KNOWN_LOCK:
        _KNOWN.pop(store.url, None)


# ---------------------------------------------------------------------- reading


WALK_WINDOW = 32
"""At most this many commits are fetched at once when catching up (the first is fetched alone:
when nothing changed, that is the only request)."""


def _walk(
    store: ObjectClient, snap: Snapshot, changes: list[Change] | None = None, window: int = 1
) -> Snapshot | None:
    """``snap`` with every commit after it applied (GETs until one is missing; after the first
    found, in concurrent windows of up to :data:`WALK_WINDOW`); None when a commit does not
    follow the state before it (a root deleted and created again)."""
    while True:
        keys = [commit_key(snap.number + 1 + i) for i in range(window)]
        got = store.get_many(keys)
        for key in keys:
            raw = got[key]
            if raw is None:
                return snap
            c = parse_commit(raw, f"{store.url}/{key}", snap)
            if c.number != snap.number + 1 or c.base_writer != snap.writer:
                log.info(
                    "%s/%s does not follow the state this process knew; reading the root afresh",
                    store.url,
                    key,
                )
                return None
            if changes is not None:
                changes.append(c.change)
            snap = apply(snap, c.change, c.number, c.writer, len(raw))
        window = min(window * 2, WALK_WINDOW)


def _from_hint(store: ObjectClient) -> Snapshot | None:
    """The checkpoint the hint names; None when there is no usable hint."""
    raw = _get(store, HINT)
    if raw is None:
        return None
    try:
        ref = parse_hint(raw, f"{store.url}/{HINT}")
        data = store.get(ref.key)
        return parse_checkpoint(data, ref, f"{store.url}/{ref.key}")
    except UnsupportedFormatError:
        raise
    except (CorruptMetadataError, FileNotFoundError) as e:
        log.warning("%s: the checkpoint hint is unusable (%s); listing the commit log instead", store.url, e)
        return None


def _from_listing(store: ObjectClient) -> Snapshot | None:
    """The newest state found by LISTing the commit log."""
    commits = sorted(n for k in store.list(LOG) if (n := commit_number(k)) is not None)
    if not commits:
        return None
    listed = store.list(CHECKPOINTS)
    by_number: dict[int, list[str]] = {}
    for k in listed:
        n = checkpoint_number(k)
        if n is not None and n <= commits[-1]:
            by_number.setdefault(n, []).append(k)
    for n in sorted(by_number, reverse=True):
        raw = _get(store, commit_key(n))
        if raw is None:
            continue
        ref = _commit_checkpoint(raw, f"{store.url}/{commit_key(n)}")
        if ref is None or ref.key not in by_number[n]:
            continue  # uploaded by a writer that lost its race (or crashed): never trusted
        try:
            snap = parse_checkpoint(store.get(ref.key), ref, f"{store.url}/{ref.key}")
        except (CorruptMetadataError, FileNotFoundError) as e:
            log.warning("%s: skipping checkpoint %d (%s)", store.url, n, e)
            continue
        walked = _walk(store, snap)
        if walked is not None:
            return walked
    raise CorruptMetadataError(
        f"{store.url}: the commit log ({LOG}, commits {commits[0]}..{commits[-1]}) has no readable "
        f"checkpoint under {CHECKPOINTS}; the root cannot be read"
    )


def _commit_checkpoint(raw: bytes, where: str) -> CheckpointRef | None:
    """The checkpoint a commit document names, without resolving the rest of it."""
    try:
        doc = check_version(json.loads(raw), "pylog-commit", where)
        ck = doc.get("checkpoint")
        return None if ck is None else CheckpointRef.from_json(ck)
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable commit (%s)", where, e)
        return None


def resolve(
    store: ObjectClient, known: Snapshot | None = None, confirmed_at: float = float("-inf")
) -> Snapshot | None:
    """The newest state of the root under ``store`` (None if it has none), starting from what
    ``known`` (confirmed newest at ``confirmed_at``) or this process already knows."""
    started = time.monotonic()
    with _KNOWN_LOCK:
        cached = _KNOWN.get(store.url)
    if cached is not None and (known is None or cached[0].number >= known.number):
        known, confirmed_at = cached
    snap: Snapshot | None = None
    hint_read, hinted = False, None
    if known is not None and known.number >= 0:
        fresh = (started - confirmed_at) * 1000 < store.file_delete_delay_ms / 2
        start: Snapshot | None = known
        if not fresh:  # old commits may be gone: the hint tells whether checkpoints passed us
            hint_read, hinted = True, _from_hint(store)
            start = None
            if hinted is not None:
                ours = {c.key for c in known.checkpoints}
                # a hinted checkpoint older than our state that we never saw: another root now
                # lives at this URL (deleted and created again): start from its checkpoint
                passed = hinted.number > known.number or hinted.checkpoints[-1].key not in ours
                start = hinted if passed else known
        if start is not None:
            snap = _walk(store, start)
            if snap is None and start is hinted:
                hinted = None  # diverged from the hinted checkpoint too: list
    if snap is None:
        if not hint_read:
            hinted = _from_hint(store)
        snap = _walk(store, hinted) if hinted is not None else None
        if snap is None:
            snap = _from_listing(store)
    if snap is None:
        forget(store)
    else:
        remember(store, snap, started)
    return snap


# ---------------------------------------------------------------------- committing


@dataclass
class Published:
    snapshot: Snapshot
    due: list[str]  # garbage this commit dropped: delete it now
    rebased: int  # how often the change was re-based on other writers' commits
    uploaded: list[tuple[str, bytes]]  # what this call uploaded that its commit names (a checkpoint)


def _conflict(store: ObjectClient, n: int, why: str) -> CommitConflictError:
    return CommitConflictError(f"{store.url}: commit {n} was created by another writer meanwhile ({why})")


def _rebase(
    store: ObjectClient,
    base: Snapshot,
    ours: Change,
    mergers: dict[str, Merger],
    read: Callable[[Ref], bytes],
) -> Snapshot:
    """The state of the winners of a race, with ``ours`` made applicable to it (changed in
    place: merged root files); CommitConflictError when the changes overlap."""
    winners: list[Change] = []
    newest = _walk(store, base, winners, window=4)  # one exists: fetch a few at once
    if newest is None:
        raise _conflict(store, base.number + 1, "it does not follow this state")
    if not winners:
        raise _conflict(store, base.number + 1, "but it is gone now")
    their_files: set[str] = set().union(*(w.files() for w in winners))
    their_dirs: set[str] = set().union(*(w.dirs() for w in winners))
    overlap = _overlap(ours.files(), ours.dirs(), their_files, their_dirs) - set(mergers)
    if overlap:
        raise _conflict(store, base.number + 1, f"it changed {sorted(overlap)[0]!r} too")
    theirs: set[str] = set().union(*(w.units() for w in winners))
    mine = ours.units()
    for unit in theirs:
        merge = mergers.get(unit)
        if merge is None:
            continue
        b = base.files.get(unit)
        t = newest.files.get(unit)
        o = ours.put.get(unit) if unit in ours.put else (None if unit in ours.delete else b)
        merged = merge(
            None if b is None else read(b),
            None if o is None else read(o),
            None if t is None else read(t),
            mine,
        )
        if merged is None:
            raise _conflict(store, base.number + 1, f"its change of {unit!r} overlaps this one's")
        if unit in mine:
            ours.put[unit] = Ref(len(merged), data=merged)
            ours.appended.pop(unit, None)
            ours.patches.pop(unit, None)
            ours.delete.discard(unit)
    return newest


def _overlap(mine: set[str], my_dirs: set[str], theirs: set[str], their_dirs: set[str]) -> set[str]:
    """What two changes both touched: the same file, or a file in a directory the other one
    created or removed.  A file, not a whole partition: a cleaner's pass (segments below the
    active one) and an append (the active segment, or a roll after it) re-base on each other;
    every change of a partition's log end touches its active segment, so two writers that
    decide from the log end always overlap."""
    out = (mine & theirs) | (my_dirs & their_dirs)
    out |= {f for f in mine if f.partition("/")[0] in their_dirs}
    out |= {f for f in theirs if f.partition("/")[0] in my_dirs}
    return out


def publish(
    store: ObjectClient,
    base: Snapshot,
    files: dict[str, Ref],
    dirs: set[str],
    *,
    token: str,
    now: int,
    confirmed_at: float,
    mergers: dict[str, Merger] | None = None,
    read: Callable[[Ref], bytes],
    step: Callable[[str], None] = lambda _: None,
    touched: set[str] | None = None,
) -> Published:
    """Commit the tree ``files``/``dirs`` (whose objects are uploaded) as the state after
    ``base``; see the module doc.  With ``touched`` (the paths that may differ from ``base``),
    ``files`` need hold only those.  Raises CommitConflictError when another writer's change
    overlaps."""
    ours = diff(base, files, dirs, touched)
    dropped = dropped_keys(base, ours)
    delay = store.file_delete_delay_ms
    if (time.monotonic() - confirmed_at) * 1000 >= delay / 2:
        # commits newer than our state may have been deleted since it was confirmed: never
        # create a number that was used before
        newest = resolve(store, base, confirmed_at) or Snapshot()
        if newest.number != base.number or newest.writer != base.writer:
            raise _conflict(store, base.number + 1, "this root's state was older than half the delete delay")
    for rebased in range(REBASES + 1):
        n = base.number + 1
        ch = replace(
            ours,
            put=dict(ours.put),
            appended=dict(ours.appended),
            patches=dict(ours.patches),
            garbage_add=[(k, now) for k in dropped],
            garbage_delete={k for k, t in base.garbage if t + delay <= now},
        )
        checkpoint = _checkpoint_due(base, n)
        if checkpoint:
            if base.checkpoints:
                prev = base.checkpoints[-1]
                ch.garbage_add += [(commit_key(i), now) for i in range(base.retained_from, prev.number + 1)]
                ch.garbage_add += [(c.key, now) for c in base.checkpoints[:-1]]
                ch.retained_from = prev.number + 1
            else:
                ch.retained_from = n
        due_now = [k for k, t in ch.garbage_add if t + delay <= now]  # a delete delay of 0
        if due_now:
            ch.garbage_add = [(k, t) for k, t in ch.garbage_add if t + delay > now]
        ckpt_key = None
        if checkpoint:
            state = apply(base, ch, n, token)
            state.checkpoints = base.checkpoints[-1:]  # those before it (its own is in its commit)
            raw_ckpt = encode_checkpoint(state, now)
            ckpt_key = checkpoint_key(n, token)
            store.put(ckpt_key, raw_ckpt)
            ch.checkpoint = checkpoint_ref(n, ckpt_key, raw_ckpt)
            step("checkpoint-uploaded")
        raw = encode_commit(n, token, base.writer, now, ch)
        creating_at = time.monotonic()
        step("creating")
        if store.create(commit_key(n), raw):
            step("manifest-created")
            new = apply(base, ch, n, token, len(raw))
            remember(store, new, creating_at)
            if ch.checkpoint is not None:
                try:
                    store.put(HINT, encode_hint(ch.checkpoint))
                    step("hint-written")
                except Exception as e:  # only a hint: readers find the checkpoint without it
                    log.warning("%s: could not write the checkpoint hint (%s)", store.url, e)
            uploaded = [] if ckpt_key is None else [(ckpt_key, raw_ckpt)]
            return Published(new, sorted(ch.garbage_delete) + due_now, rebased, uploaded)
        step("conflict")
        _drop(store, ckpt_key)
        base = _rebase(store, base, ours, mergers or {}, read)
        log.info("%s: commit %d lost its race; re-based on commit %d", store.url, n, base.number)
    raise _conflict(store, base.number, f"re-based {REBASES} times")


def _drop(store: ObjectClient, key: str | None) -> None:
    if key is not None:
        with contextlib.suppress(Exception):
            store.delete([key])


__all__ = ["CHECKPOINT_INTERVAL", "Merger", "Published", "forget", "known", "publish", "remember", "resolve"]
