"""Object keys of a pylog root on an object store, and which files a state holds inline.

A file uploaded by a commit is an object whose key is the file's path plus part of the writer
token of that commit (:func:`upload_key`), so a key is never used twice; small files are held
inline in the state (:func:`holds_inline`).  *Outside* objects live under ``_pylog/direct/``,
outside every state: staged sink data and consumer offsets, each written whole by one PUT.
"""

from __future__ import annotations

import re

from pylog.storage.backends.base import STAGE_PREFIX

OUTSIDE = "_pylog/direct/"
INLINE_MAX = 4096
"""Files of a topic-partition up to this size are kept inside the state, not uploaded; on an
object store an active segment is sealed (rolled) once it is larger."""

_UPLOAD_SUFFIX = re.compile(r"\.[0-9a-f]{16}$")

# ---------------------------------------------------------------------- keys and paths


def upload_key(path: str, token: str) -> str:
    """The object key of ``path`` uploaded by the commit with writer ``token`` (never reused)."""
    return f"{path}.{token[:16]}"


def is_upload_key(key: str) -> bool:
    """Whether ``key`` is named like an upload of a commit (see :func:`upload_key`)."""
    return _UPLOAD_SUFFIX.search(key) is not None


def is_outside(path: str) -> bool:
    """Files outside the published state: staged sink data and consumer offsets (each written
    whole by one PUT, so atomic by itself)."""
    d, _, name = path.rpartition("/")
    return name.startswith(STAGE_PREFIX) or (not d and name.startswith("pylog-consumer-offsets."))


def parent(path: str) -> str:
    return path.rpartition("/")[0]


# ---------------------------------------------------------------------- inline files


def holds_inline(path: str, size: int) -> bool:
    """Whether a file written by a commit is kept inside the state rather than uploaded: small
    files, and every file at the root (metadata that a race re-bases by merging it key by key)."""
    return size <= INLINE_MAX or "/" not in path


__all__ = [
    "INLINE_MAX",
    "OUTSIDE",
    "holds_inline",
    "is_outside",
    "is_upload_key",
    "parent",
    "upload_key",
]
