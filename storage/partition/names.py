"""The segment files of a partition directory's listing, found in a few array operations.

A partition of 10,000 segments lists some 40,000 names.  Looking at them one by one in Python
costs more than listing them; :func:`scan` joins them into one byte array once and finds what
a writer's load needs (the ``.log`` files with final names, the index files without one,
whether any name is a temporary one: ``.deleted``, ``.cleaned``, ``.swap``) with NumPy and
substring searches, whatever the number of names.  A segment file's name is its base offset
in 20 digits and a suffix; other names are passed over, as the loader passes over them.
Names it cannot vouch for this way (one that is not ASCII or holds a newline, a segment-like
name whose 20 characters are not a base offset) make it return None: the caller then looks
at each name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_STEM = 20  # digits of a segment file's base offset
INDEX_SUFFIXES = (".index", ".timeindex", ".txnindex")
_P10 = 10 ** np.arange(9, -1, -1, dtype=np.int64)
_HI_MAX, _LO_MAX = divmod(2**63 - 1, 10**10)


@dataclass(frozen=True)
class Scanned:
    bases: list[int]
    """The base offsets of the final ``.log`` files, ascending."""
    orphans: set[str]
    """The base offsets (as 20-digit names) of final index files whose segment has no ``.log``."""
    has_temp: bool
    """Whether a name ends with ``.deleted``, ``.cleaned`` or ``.swap``."""


def _bases(arr: np.ndarray, starts: np.ndarray, lens: np.ndarray, suffix: bytes) -> np.ndarray | None:
    """The base offsets of the names (``arr[starts[i] : starts[i] + lens[i]]``) that are 20
    characters and ``suffix``; None when such a name's 20 characters are not a base offset."""
    at = starts[lens == _STEM + len(suffix)]
    ok = np.ones(len(at), dtype=bool)
    for i, c in enumerate(suffix):
        ok &= arr[at + (_STEM + i)] == c
    at = at[ok]
    digits = arr[at[:, None] + np.arange(_STEM)].astype(np.int64) - ord("0")
    if len(at) and not bool(((digits >= 0) & (digits <= 9)).all()):
        return None
    hi, lo = digits[:, :10] @ _P10, digits[:, 10:] @ _P10
    if bool(((hi > _HI_MAX) | ((hi == _HI_MAX) & (lo > _LO_MAX))).any()):
        return None  # past the largest offset
    return hi * 10**10 + lo


def scan(names: list[str]) -> Scanned | None:
    """What a writer's load needs of the (sorted) ``names`` of a partition directory; None when
    a name cannot be told apart this way (see the module docstring)."""
    if not names:
        return Scanned([], set(), False)
    joined = "\n" + "\n".join(names) + "\n"
    if not joined.isascii():
        return None
    encoded = joined.encode("ascii")
    arr = np.frombuffer(encoded, dtype=np.uint8)
    newlines = np.flatnonzero(arr == ord("\n"))
    if len(newlines) != len(names) + 1:
        return None  # a name holding a newline
    starts = newlines[:-1] + 1
    lens = newlines[1:] - starts
    logs = _bases(arr, starts, lens, b".log")
    if logs is None:
        return None
    orphans: set[str] = set()
    for suffix in INDEX_SUFFIXES:
        indexed = _bases(arr, starts, lens, suffix.encode())
        if indexed is None:
            return None
        if len(indexed):  # (both ascending: each looked up among the .log files)
            at = np.minimum(np.searchsorted(logs, indexed), max(0, len(logs) - 1))
            alone = indexed if not len(logs) else indexed[logs[at] != indexed]
            orphans.update(f"{b:020d}" for b in alone.tolist())
    has_temp = any(s in encoded for s in (b".deleted\n", b".cleaned\n", b".swap\n"))
    return Scanned(logs.tolist(), orphans, has_temp)


__all__ = ["INDEX_SUFFIXES", "Scanned", "scan"]
