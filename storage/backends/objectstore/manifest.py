"""Format 1 of a pylog root on an object store (one manifest per version), and what both formats share.

Format 1 recorded each version of a root as one immutable JSON manifest listing every file,
created with put-if-absent under ``_pylog/manifests/<number, 20 digits>.json``::

    {"format": "pylog-manifest", "version": 1, "number": 42,
     "writer": "<random token of the commit>", "base_writer": "<token of manifest 41>",
     "time_ms": 1767225600000,
     "files": {"<path>": {"size": 1048576, "key": "<path>.<first 16 hex digits of a token>"},
               "<small path>": {"inline": "<base64>"}},
     "dirs": ["<dir>", ...],
     "garbage": [["<key>", <time_ms it was superseded>], ...]}

Such roots are still read, and are upgraded to format 2 (the commit log of
:mod:`~pylog.storage.backends.objectstore.commitlog`) by their first commit, which leaves a *marker* as the
next manifest (``"version": 2, "moved_to": "_pylog/log/"``) so that older pylog versions refuse
the root instead of writing beside the commit log.

Shared by both formats: a file uploaded by a commit is an object whose key is the file's path
plus part of the writer token of that commit, so a key is never used twice; small files are
held inline (:func:`holds_inline`).  *Direct* objects live under ``_pylog/direct/``, outside
every state: staged sink data and consumer offsets, each written whole by one PUT.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

from pylog.storage.backends.base import STAGE_PREFIX
from pylog.storage.backends.objectstore.snapshot import Ref, Snapshot
from pylog.storage.errors import CorruptMetadataError

MANIFESTS = "_pylog/manifests/"
OUTSIDE = "_pylog/direct/"
FORMAT = "pylog-manifest"
VERSION = 1
INLINE_MAX = 4096
"""Files of a topic-partition up to this size are kept inside the state, not uploaded; on an
object store an active segment is sealed (rolled) once it is larger."""

_UPLOAD_SUFFIX = re.compile(r"\.[0-9a-f]{16}$")

# ---------------------------------------------------------------------- keys and paths


def manifest_key(number: int) -> str:
    return f"{MANIFESTS}{number:020d}.json"


def manifest_number(key: str) -> int | None:
    """The number of a manifest key; None for any other key."""
    num = key[len(MANIFESTS) : -len(".json")]
    return int(num) if key.startswith(MANIFESTS) and key.endswith(".json") and num.isdigit() else None


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


# ---------------------------------------------------------------------- the document


def holds_inline(path: str, size: int) -> bool:
    """Whether a file written by a commit is kept inside the state rather than uploaded: small
    files, and every file at the root (metadata that a race re-bases by merging it key by key)."""
    return size <= INLINE_MAX or "/" not in path


def inline_file(data: bytes | bytearray) -> dict[str, Any]:
    return {"inline": base64.b64encode(bytes(data)).decode("ascii")}


def object_file(size: int, key: str) -> dict[str, Any]:
    return {"size": size, "key": key}


def inline_data(f: dict[str, Any]) -> bytes | None:
    """The bytes of an inline file entry; None for an object entry."""
    return base64.b64decode(f["inline"]) if "inline" in f else None


def new_manifest(
    number: int,
    *,
    writer: str,
    base_writer: str,
    time_ms: int,
    files: dict[str, dict[str, Any]],
    dirs: Iterable[str],
    garbage: list[tuple[str, int]],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "number": number,
        "writer": writer,
        "base_writer": base_writer,
        "time_ms": time_ms,
        "files": files,
        "dirs": sorted(dirs),
        "garbage": garbage,
    }


def encode_manifest(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """A manifest's document, checked; :class:`CorruptMetadataError` naming ``where`` otherwise."""
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} pylog manifest (format {doc.get('format')!r})")
        int(doc["number"])
        if not isinstance(doc["files"], dict) or not isinstance(doc["dirs"], list):
            raise ValueError("files/dirs have the wrong types")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{where}: corrupt manifest: {e}") from e
    return dict(doc)


def garbage_of(doc: dict[str, Any]) -> list[tuple[str, int]]:
    return [(str(k), int(t)) for k, t in doc.get("garbage", [])]


# ---------------------------------------------------------------------- upgrading to format 2


MARKER_VERSION = 2


def marker_document(number: int) -> bytes:
    """Manifest ``number`` of a root upgraded to format 2: pylog versions that read only format 1
    refuse it ("not a version 1 pylog manifest"), so they stop writing to the root."""
    return json.dumps(
        {
            "format": FORMAT,
            "version": MARKER_VERSION,
            "number": number,
            "moved_to": "_pylog/log/",
            "note": "this root uses the commit log of pylog format 2; upgrade pylog to read it",
        }
    ).encode()


def parse_manifest_any(raw: bytes, where: str) -> dict[str, Any]:
    """A format 1 manifest or an upgrade marker (see :func:`is_marker`)."""
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == MARKER_VERSION:
            int(doc["number"])
            return dict(doc)
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptMetadataError(f"{where}: corrupt manifest: {e}") from e
    return parse_manifest(raw, where)


def is_marker(doc: dict[str, Any]) -> bool:
    return doc.get("version") == MARKER_VERSION and "moved_to" in doc


def snapshot_from_v1(doc: dict[str, Any]) -> Snapshot:
    """The state a format 1 manifest records."""
    files: dict[str, Ref] = {}
    for path, f in doc["files"].items():
        data = inline_data(f)
        files[str(path)] = (
            Ref(len(data), data=data) if data is not None else Ref(int(f["size"]), key=str(f["key"]))
        )
    n = int(doc["number"])
    return Snapshot(
        number=n,
        writer=str(doc.get("writer", "")),
        files=files,
        dirs={str(d) for d in doc["dirs"]},
        garbage=garbage_of(doc),
        retained_from=n + 1,
        from_v1=True,
    )


__all__ = [
    "INLINE_MAX",
    "MANIFESTS",
    "OUTSIDE",
    "encode_manifest",
    "garbage_of",
    "holds_inline",
    "inline_data",
    "inline_file",
    "is_marker",
    "is_outside",
    "is_upload_key",
    "manifest_key",
    "manifest_number",
    "marker_document",
    "new_manifest",
    "object_file",
    "parent",
    "parse_manifest",
    "parse_manifest_any",
    "snapshot_from_v1",
    "upload_key",
]
