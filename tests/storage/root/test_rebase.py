"""Three-way merges of a root's own files (storage/root/rebase.py): what a commit re-based on a
writer of other partitions keeps of both."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.partition.checkpoint import format_offsets, parse_offsets
from pylog.storage.root.publish import PublishState, QueryRecord
from pylog.storage.root.rebase import MERGERS, merge3, merge_offsets, merge_state, merge_topics

small = st.dictionaries(st.integers(0, 6), st.integers(0, 3), max_size=6)


@settings(max_examples=300, deadline=None)
@given(small, small, small)
def test_merge3_keeps_each_sides_changes_and_refuses_overlaps(
    base: dict[int, int], ours: dict[int, int], theirs: dict[int, int]
) -> None:
    merged = merge3(base, ours, theirs)
    keys = {*base, *ours, *theirs}
    changed_both = [
        k
        for k in keys
        if ours.get(k) != base.get(k) and theirs.get(k) != base.get(k) and ours.get(k) != theirs.get(k)
    ]
    if changed_both:
        assert merged is None
        return
    assert merged is not None
    for k in keys:
        expect = ours.get(k) if ours.get(k) != base.get(k) else theirs.get(k)
        assert merged.get(k) == expect


def test_offsets_and_state_merge_per_partition_and_query() -> None:
    base = format_offsets({("x", 0): 5, ("y", 0): 7})
    ours = format_offsets({("x", 0): 9, ("y", 0): 7})
    theirs = format_offsets({("x", 0): 5, ("y", 0): 8, ("y", 1): 1})
    merged = merge_offsets(base, ours, theirs, {"x-0"})
    assert merged is not None and parse_offsets(merged) == {("x", 0): 9, ("y", 0): 8, ("y", 1): 1}
    assert merge_offsets(base, ours, format_offsets({("x", 0): 6, ("y", 0): 7}), {"x-0"}) is None

    b = PublishState({("x", 0): 5}, {})
    o = PublishState({("x", 0): 9}, {"q1": QueryRecord(3, 100)})
    t = PublishState({("x", 0): 5, ("y", 0): 2}, {"q2": QueryRecord(7, 100)})
    got = merge_state(b.to_json(), o.to_json(), t.to_json(), {"x-0"})
    assert got is not None
    s = PublishState.from_json(got, "state")
    assert s.high_watermarks == {("x", 0): 9, ("y", 0): 2}
    assert s.queries == {"q1": QueryRecord(3, 100), "q2": QueryRecord(7, 100)}
    same_query = PublishState({("x", 0): 5, ("y", 0): 2}, {"q1": QueryRecord(4, 100)})
    assert merge_state(b.to_json(), o.to_json(), same_query.to_json(), {"x-0"}) is None  # a replay race


def test_a_topic_changed_by_the_other_writer_conflicts_only_if_this_commit_wrote_it() -> None:
    def doc(topics: dict[str, int]) -> bytes:
        return json.dumps(
            {"version": 1, "topics": {t: {"partitions": n, "config": {}} for t, n in topics.items()}}
        ).encode()

    base = doc({"x": 2, "y": 2})
    theirs = doc({"x": 2, "y": 3})  # y grew a partition
    assert merge_topics(base, base, theirs, {"y-0"}) is None  # we wrote y with the old count
    merged = merge_topics(base, doc({"x": 2, "y": 2, "z": 1}), theirs, {"x-0", "z-0", "pylog-topics.json"})
    assert merged is not None
    assert json.loads(merged)["topics"] == {
        t: {"partitions": n, "config": {}} for t, n in {"x": 2, "y": 3, "z": 1}.items()
    }
    assert MERGERS["pylog-topics.json"](base, base, b"{not json", {"x-0"}) is None  # unreadable: re-run
