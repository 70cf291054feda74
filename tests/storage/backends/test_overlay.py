"""Patches read over immutable objects (storage/backends/objectstore/overlay.py): any range of a patched
object reads as the same range of the object with the values written in place."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends.objectstore import overlay
from pylog.storage.errors import StorageError


@st.composite
def patched_objects(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, bytes]], int, int]:
    size = draw(st.integers(8, 400))
    data = draw(st.binary(min_size=size, max_size=size))
    slots = sorted(draw(st.sets(st.integers(0, size // 8 - 1), max_size=20)))
    shift = draw(st.integers(0, 7))
    edits = [
        (min(s * 8 + shift, size - 8), draw(st.integers(-(2**63), 2**63 - 1)).to_bytes(8, "big", signed=True))
        for s in slots
    ]
    edits = [e for i, e in enumerate(edits) if i == 0 or e[0] - edits[i - 1][0] >= 8]
    start = draw(st.integers(0, size))
    end = draw(st.integers(start, size))
    return data, edits, start, end


@settings(max_examples=300, deadline=None)
@given(patched_objects())
def test_any_range_reads_as_if_written_in_place(
    case: tuple[bytes, list[tuple[int, bytes]], int, int],
) -> None:
    data, edits, start, end = case
    expected = bytearray(data)
    for pos, b in edits:
        expected[pos : pos + 8] = b
    patch = overlay.merge(None, edits, len(data), "obj")
    got = overlay.read_patched(lambda lo, hi: data[lo:hi], patch, start, end)
    assert got == bytes(expected[start:end])


def test_a_later_edit_replaces_an_earlier_one_and_bad_edits_are_refused() -> None:
    data = bytes(32)
    first = overlay.merge(None, [(0, (1).to_bytes(8, "big")), (16, (2).to_bytes(8, "big"))], 32, "obj")
    second = overlay.merge(first, [(16, (3).to_bytes(8, "big"))], 32, "obj")
    got = overlay.read_patched(lambda lo, hi: data[lo:hi], second, 0, 32)
    assert got == (1).to_bytes(8, "big") + bytes(8) + (3).to_bytes(8, "big") + bytes(8)
    with pytest.raises(StorageError, match="inside it"):
        overlay.merge(None, [(30, bytes(8))], 32, "obj")
    with pytest.raises(StorageError, match="overlap"):
        overlay.merge(first, [(4, bytes(8))], 32, "obj")
