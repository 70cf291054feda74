"""Three-way merges of a root's own files, for re-basing a commit on an object store.

When two writers commit at once to one root on an object store, the loser re-bases its change on
the winner's if the two touched different files (see
:mod:`pylog.storage.backends.objectstore.commitlog`).  Every commit also rewrites a few files at the root
that hold one entry per topic-partition or per query; they are merged entry by entry here: an
entry the loser changed wins over the base, an entry only the winner changed is taken from it,
and an entry both changed differently is a real conflict (the operation then runs again).

========================================  ===================================================
file                                      entries
========================================  ===================================================
``pylog-state.json``                      high watermark per (topic, partition); last batch
                                          per streaming query
``recovery-point-offset-checkpoint``,     offset per (topic, partition)
``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint``
``pylog-topics.json``                     metadata per topic; a change of a topic whose
                                          partitions this commit wrote is a conflict (its
                                          partition count or configs may have changed)
========================================  ===================================================
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pylog.storage.errors import PylogError
from pylog.storage.partition.checkpoint import (
    CLEANER_OFFSET,
    LOG_START_OFFSET,
    RECOVERY_POINT,
    format_offsets,
    parse_offsets,
)
from pylog.storage.root.metadata import TOPICS_FILE
from pylog.storage.root.publish import STATE_FILE, PublishState

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


def merge3(base: Mapping[K, V], ours: Mapping[K, V], theirs: Mapping[K, V]) -> dict[K, V] | None:
    """Entry-wise three-way merge of mappings; None when one entry was changed differently by
    both sides."""
    out: dict[K, V] = {}
    for k in {*base, *ours, *theirs}:
        b, o, t = base.get(k, _MISSING), ours.get(k, _MISSING), theirs.get(k, _MISSING)
        if o == b:
            v = t
        elif t == b or o == t:
            v = o
        else:
            return None
        if v is not _MISSING:
            out[k] = v
    return out


Merger = Callable[[bytes | None, bytes | None, bytes | None, set[str]], bytes | None]


def _offsets(data: bytes | None) -> dict[tuple[str, int], int]:
    return {} if data is None else parse_offsets(data)


def merge_offsets(
    base: bytes | None, ours: bytes | None, theirs: bytes | None, touched: set[str]
) -> bytes | None:
    """Kafka's offset checkpoint files: one offset per topic-partition."""
    merged = merge3(_offsets(base), _offsets(ours), _offsets(theirs))
    return None if merged is None else format_offsets(merged)


def _state(data: bytes | None) -> PublishState:
    return PublishState() if data is None else PublishState.from_json(data, STATE_FILE)


def _both_changed(base: Mapping[K, V], ours: Mapping[K, V], theirs: Mapping[K, V]) -> bool:
    return any(ours.get(k) != base.get(k) != theirs.get(k) for k in {*ours, *theirs})


def merge_state(
    base: bytes | None, ours: bytes | None, theirs: bytes | None, touched: set[str]
) -> bytes | None:
    """``pylog-state.json``: high watermarks and query records."""
    b, o, t = _state(base), _state(ours), _state(theirs)
    hw = merge3(b.high_watermarks, o.high_watermarks, t.high_watermarks)
    # both sides published for one query: never merged, even into the same record, so
    # that whether a batch is already committed is decided on the newest state (the operation
    # runs again there); a writer may commit from a state it knows without asking the store
    queries = (
        None if _both_changed(b.queries, o.queries, t.queries) else merge3(b.queries, o.queries, t.queries)
    )
    if hw is None or queries is None:
        return None
    return PublishState(hw, queries).to_json()


def _topics(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    return dict(json.loads(data)["topics"])


def merge_topics(
    base: bytes | None, ours: bytes | None, theirs: bytes | None, touched: set[str]
) -> bytes | None:
    """``pylog-topics.json``: per topic; a topic the other writer changed whose partitions this
    commit wrote is a conflict."""
    b, o, t = _topics(base), _topics(ours), _topics(theirs)
    for name in {*b, *t}:
        if b.get(name) != t.get(name) and any(u.rpartition("-")[0] == name for u in touched):
            return None
    merged = merge3(b, o, t)
    if merged is None:
        return None
    return json.dumps({"version": 1, "topics": merged}, indent=1, sort_keys=True).encode()


def _safe(fn: Merger) -> Merger:
    """A merge that cannot parse a side is a conflict (the operation runs again on the newest
    state, which reports the damage with its own error)."""

    def run(base: bytes | None, ours: bytes | None, theirs: bytes | None, touched: set[str]) -> bytes | None:
        try:
            return fn(base, ours, theirs, touched)
        except (PylogError, ValueError, KeyError, TypeError):
            return None

    return run


MERGERS: dict[str, Merger] = {
    STATE_FILE: _safe(merge_state),
    RECOVERY_POINT: _safe(merge_offsets),
    LOG_START_OFFSET: _safe(merge_offsets),
    CLEANER_OFFSET: _safe(merge_offsets),
    TOPICS_FILE: _safe(merge_topics),
}
"""Merge functions by root file name."""

__all__ = ["MERGERS", "merge3", "merge_offsets", "merge_state", "merge_topics"]
