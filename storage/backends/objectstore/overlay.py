"""8-byte values read over an immutable object: how an object store patches without rewriting.

A staged segment becomes a segment of a log when each batch's ``baseOffset`` (bytes 0-7 of the
batch, outside its CRC-32C) is set to the offset the commit assigns.  A local disk writes those
8 bytes in place.  An object cannot be modified, and downloading and uploading it again would
move every record byte through the committing process; instead the file's entry in the state
holds the values, and every read of the object puts them over the bytes it returns.

Patch layout (``snapshot.Ref.patch``), big-endian, sorted by position, no two overlapping::

    +-------------------+----------------+
    | position (int64)  | value (int64)  |   repeated once per patched 8-byte field
    +-------------------+----------------+
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pylog.storage.errors import StorageError

_PAIR = np.dtype([("position", ">i8"), ("value", ">i8")])
FIELD = 8  # bytes of one patched value


def pairs(patch: bytes) -> np.ndarray:
    """The ``(position, value)`` records of ``patch``."""
    return np.frombuffer(patch, dtype=_PAIR)


def encode(positions: np.ndarray, values: np.ndarray) -> bytes:
    out = np.empty(positions.shape[0], dtype=_PAIR)
    out["position"] = positions
    out["value"] = values
    return out.tobytes()


def merge(patch: bytes | None, edits: list[tuple[int, bytes]], size: int, where: str) -> bytes:
    """``patch`` with ``edits`` (``(position, 8 bytes)`` each) applied on top: a later value at
    a position replaces the earlier one.  Edits must be whole 8-byte fields inside the object."""
    pos = np.array([p for p, _ in edits], dtype=np.int64)
    if any(len(b) != FIELD for _, b in edits) or (pos.size and (pos.min() < 0 or pos.max() + FIELD > size)):
        raise StorageError(f"{where}: an object can only be patched with 8-byte values inside it")
    vals = np.frombuffer(b"".join(b for _, b in edits), dtype=">i8").astype(np.int64)
    if patch:
        old = pairs(patch)
        keep = ~np.isin(old["position"], pos)
        pos = np.concatenate([old["position"][keep].astype(np.int64), pos])
        vals = np.concatenate([old["value"][keep].astype(np.int64), vals])
    order = np.argsort(pos, kind="stable")
    pos, vals = pos[order], vals[order]
    if pos.size > 1 and (np.diff(pos) < FIELD).any():
        raise StorageError(f"{where}: patched 8-byte values overlap")
    return encode(pos, vals)


def read_patched(fetch: Callable[[int, int], bytes], patch: bytes, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of an object read by ``fetch(lo, hi)``, with
    ``patch`` put over them (a value cut by the range contributes the bytes inside it)."""
    p = pairs(patch)
    pos = p["position"].astype(np.int64)
    lo = int(np.searchsorted(pos, start - FIELD, side="right"))  # first field ending after start
    hi = int(np.searchsorted(pos, end, side="left"))  # fields starting before end
    data = fetch(start, end)
    if lo >= hi:
        return data
    buf = np.frombuffer(data, dtype=np.uint8).copy()
    values = p["value"][lo:hi].astype(">i8").view(np.uint8).reshape(-1, FIELD)
    rel = pos[lo:hi] - start  # where each field starts in buf (may be < 0 or run past the end)
    cols = rel[:, None] + np.arange(FIELD)[None, :]
    inside = (cols >= 0) & (cols < buf.shape[0])
    buf[cols[inside]] = values[inside]
    return buf.tobytes()


__all__ = ["FIELD", "encode", "merge", "pairs", "read_patched"]
