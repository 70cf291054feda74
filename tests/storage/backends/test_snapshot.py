"""The state documents of the object-store commit log (storage/backends/objectstore/snapshot.py), without a
server: a commit encodes exactly the change between two trees (appends and line patches
included), checkpoints round-trip and are verified, newer versions are refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends.objectstore.snapshot import (
    Ref,
    Snapshot,
    apply,
    apply_edits,
    checkpoint_ref,
    diff,
    encode_checkpoint,
    encode_commit,
    line_edits,
    parse_checkpoint,
    parse_commit,
)
from pylog.storage.errors import CorruptMetadataError, UnsupportedFormatError

lines = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=30)


@settings(max_examples=300, deadline=None)
@given(lines, lines, st.booleans())
def test_line_edits_turn_the_old_bytes_into_the_new(old: list[bytes], new: list[bytes], torn: bool) -> None:
    a, b = b"".join(old), b"".join(new)
    if torn:  # a last line without its newline
        b = b[:-1]
    assert apply_edits(a, line_edits(a, b)) == b


def _tree(files: dict[str, bytes | str]) -> dict[str, Ref]:
    return {p: (Ref(len(v), data=v) if isinstance(v, bytes) else Ref(100, key=v)) for p, v in files.items()}


def _base() -> Snapshot:
    state = b"".join(b'  "%d": %d,\n' % (p, p * 10) for p in range(50))
    return Snapshot(
        number=6,
        writer="w6",
        files=_tree(
            {
                "t-0/0.log": b"A" * 300,
                "t-1/0.log": "t-1/0.log.abc",
                "pylog-state.json": state,
                "gone": b"x",
            }
        ),
        dirs={"t-0", "t-1"},
    )


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.integers(0, 49), st.integers(0, 10**6))
def test_a_commit_carries_exactly_the_change(extra: bytes, partition: int, hw: int) -> None:
    base = _base()
    state = base.files["pylog-state.json"].data
    assert state is not None
    new_state = state.replace(b'"%d": %d,' % (partition, partition * 10), b'"%d": %d,' % (partition, hw))
    files = dict(base.files)
    files["t-0/0.log"] = Ref(300 + len(extra), data=b"A" * 300 + extra)  # appended
    files["pylog-state.json"] = Ref(len(new_state), data=new_state)  # one line changed
    files["t-2/0.log"] = Ref(5000, key="t-2/0.log.def")  # uploaded
    del files["gone"]
    ch = diff(base, files, base.dirs | {"t-2"})
    # a writer that names what it touched (a superset of the change) gets the same change
    touched = {"t-0/0.log", "pylog-state.json", "t-2/0.log", "gone", "t-1/0.log", "never-there"}
    assert encode_commit(7, "w7", "w6", 1, diff(base, files, base.dirs | {"t-2"}, touched)) == encode_commit(
        7, "w7", "w6", 1, ch
    )
    raw = encode_commit(7, "w7", "w6", 1, ch)
    doc = json.loads(raw)
    assert doc["put"]["t-0/0.log"].keys() == {"at", "append"}  # only the new bytes travel
    if new_state != state:
        assert "patch" in doc["put"]["pylog-state.json"] and len(raw) < len(state)
    c = parse_commit(raw, "commit 7", base)
    after = apply(base, c.change, c.number, c.writer)
    assert after.files == files and after.dirs == base.dirs | {"t-2"}
    assert (c.number, c.base_writer) == (7, "w6")


def test_an_append_to_a_state_that_does_not_hold_the_file_is_corrupt() -> None:
    base = _base()
    files = dict(base.files)
    files["t-0/0.log"] = Ref(301, data=b"A" * 301)
    raw = encode_commit(7, "w7", "w6", 1, diff(base, files, base.dirs))
    other = _base()
    other.files["t-0/0.log"] = Ref(3, data=b"AAA")
    with pytest.raises(CorruptMetadataError, match=r"corrupt commit: appends to 't-0/0\.log' at 300"):
        parse_commit(raw, "commit 7", other)


def test_a_checkpoint_is_verified_against_what_its_commit_recorded() -> None:
    base = _base()
    raw = encode_checkpoint(base, 1)
    ref = checkpoint_ref(6, "_pylog/checkpoints/6.x.json", raw)
    loaded = parse_checkpoint(raw, ref, "ckpt")
    assert loaded.files == base.files and loaded.dirs == base.dirs and loaded.checkpoints == [ref]
    with pytest.raises(CorruptMetadataError, match="not the one its commit recorded"):
        parse_checkpoint(raw[:-1], ref, "ckpt")
    with pytest.raises(CorruptMetadataError, match="not the one its commit recorded"):
        parse_checkpoint(raw.replace(b'"w6"', b'"w9"'), ref, "ckpt")


def test_a_newer_version_is_refused_and_garbage_is_corrupt() -> None:
    with pytest.raises(UnsupportedFormatError, match="c9: written by a newer pylog"):
        parse_commit(json.dumps({"format": "pylog-commit", "version": 4}).encode(), "c9", Snapshot())
    with pytest.raises(CorruptMetadataError, match="not valid JSON"):
        parse_commit(b'{"format": "pylog-com', "c9", Snapshot())
    with pytest.raises(CorruptMetadataError, match="not a pylog-commit document"):
        parse_commit(b'{"format": "other", "version": 2}', "c9", Snapshot())
