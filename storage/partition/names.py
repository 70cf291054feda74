"""The segment files of a partition directory's listing, found in a few passes over one string.

A partition of 10,000 segments lists some 40,000 names.  Looking at them one by one in Python
costs more than listing them; :func:`scan` joins them once and finds what a writer's load needs
(the ``.log`` files with final names, the index files without one, whether any name is a
temporary one: ``.deleted``, ``.cleaned``, ``.swap``) with splits, slices and set operations
done by the interpreter's C code.  Names it cannot vouch for that way (a ``.log`` file whose
name is not 20 digits, say) make it return None: the caller then looks at each name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STEM = 20  # digits of a segment file's base offset
_TEMP = re.compile(r"\.(?:deleted|cleaned|swap)\n")
INDEX_SUFFIXES = (".index", ".timeindex", ".txnindex")


@dataclass(frozen=True)
class Scanned:
    logs: list[str]
    """The base offsets (as 20-digit names) of the final ``.log`` files, ascending."""
    orphans: set[str]
    """The base offsets (as names) of final index files whose segment has no ``.log``."""
    has_temp: bool
    """Whether a name ends with ``.deleted``, ``.cleaned`` or ``.swap``."""

    def bases(self) -> list[int]:
        return list(map(int, self.logs))


def _stems(joined: str, suffix: str) -> list[str] | None:
    """The 20-digit stems of the names ending with ``suffix`` in ``joined`` (names each
    preceded and followed by a newline, sorted); None when such a name is not a 20-digit stem
    followed by ``suffix``."""
    pieces = joined.split(suffix + "\n")
    tails = [p[-_STEM - 1 :] for p in pieces[:-1]]  # "\n" + the stem, for each such name
    flat = "".join(tails)
    if flat[:: _STEM + 1] != "\n" * len(tails) or len(flat) != (_STEM + 1) * len(tails):
        return None
    stems = flat.split("\n")[1:]  # (flat starts with a newline when it is not empty)
    digits = "".join(stems)
    if digits and not (digits.isascii() and digits.isdigit()):
        return None
    return stems


def scan(names: list[str]) -> Scanned | None:
    """What a writer's load needs of the (sorted) ``names`` of a partition directory; None when
    a name cannot be told apart this way (see the module docstring)."""
    joined = "\n" + "\n".join(names) + "\n"
    logs = _stems(joined, ".log")
    if logs is None:
        return None
    indexed: set[str] = set()
    for suffix in INDEX_SUFFIXES:
        stems = _stems(joined, suffix)
        if stems is None:
            return None
        indexed.update(stems)
    orphans = indexed.difference(logs) if indexed else set()
    return Scanned(logs, orphans, _TEMP.search(joined) is not None)


__all__ = ["INDEX_SUFFIXES", "Scanned", "scan"]
