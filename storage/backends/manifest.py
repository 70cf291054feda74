"""The manifests of a pylog root on an object store: keys, JSON format, and finding the newest.

A manifest is the state of the whole root at one version, an immutable JSON object created with
put-if-absent under ``_pylog/manifests/<number, 20 digits>.json``; numbers have no gaps::

    {"format": "pylog-manifest", "version": 1, "number": 42,
     "writer": "<random token of the commit>", "base_writer": "<token of manifest 41>",
     "time_ms": 1767225600000,
     "files": {"<path>": {"size": 1048576, "key": "<path>.<first 16 hex digits of a token>"},
               "<small path>": {"inline": "<base64>"}},
     "dirs": ["<dir>", ...],
     "garbage": [["<key>", <time_ms it was superseded>], ...]}

Files up to :data:`INLINE_MAX` bytes, except segment data (``.log``), are held inline; any other
file is an object whose key is the file's path plus part of the writer token of the commit that
uploaded it, so a key is never used twice.  ``garbage`` lists the objects (and the previous
manifest) that commits stopped referencing, until they are deleted.

*Direct* objects live under ``_pylog/direct/``, outside every manifest: staged sink data and
consumer offsets, each written whole by one PUT.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from pylog.storage.backends.objectstore import ObjectStore
from pylog.storage.errors import CorruptMetadataError, StorageError

MANIFESTS = "_pylog/manifests/"
DIRECT = "_pylog/direct/"
FORMAT = "pylog-manifest"
VERSION = 1
INLINE_MAX = 4096
"""Files up to this size, except segment data (``.log``), are kept inside the manifest."""

_UPLOAD_SUFFIX = re.compile(r"\.[0-9a-f]{16}$")

_NEWEST: dict[str, tuple[int, str, dict[str, Any]]] = {}
"""Per URL, the newest manifest this process has read or written: number, ETag, document."""


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


def is_direct(path: str) -> bool:
    """Files outside the published state: staged sink data and consumer offsets (each written
    whole by one PUT, so atomic by itself)."""
    d, _, name = path.rpartition("/")
    return name.startswith(".pylog-stage.") or (not d and name.startswith("pylog-consumer-offsets."))


def parent(path: str) -> str:
    return path.rpartition("/")[0]


# ---------------------------------------------------------------------- the document


def holds_inline(path: str, size: int) -> bool:
    """Whether a file written by a commit is kept inside the manifest rather than uploaded."""
    return size == 0 or (size <= INLINE_MAX and not path.endswith(".log"))


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


def referenced_keys(doc: dict[str, Any]) -> set[str]:
    """The objects a manifest keeps: its files' objects, its garbage, and the manifest itself."""
    keys = {str(f["key"]) for f in doc["files"].values() if "key" in f}
    keys |= {str(k) for k, _ in doc.get("garbage", [])}
    keys.add(manifest_key(int(doc["number"])))
    return keys


# ---------------------------------------------------------------------- the newest manifest


def _read(store: ObjectStore, key: str) -> dict[str, Any]:
    return parse_manifest(store.get(key), f"{store.url}/{key}")


def newest_manifest(store: ObjectStore) -> dict[str, Any] | None:
    """The newest manifest under ``store``, None if there is none.  Manifests are immutable and
    numbered without gaps, so once this process knows manifest N, one LIST of the keys from N on
    tells whether N is still the newest (same ETag: a root deleted and created again is never
    mistaken for the old one) and a GET is needed only for a manifest it has not read yet."""
    known = _NEWEST.get(store.url)
    if known is not None and known[1]:
        listing = store.list(MANIFESTS, start_after=manifest_key(known[0] - 1))
        newest = max((k for k in listing if manifest_number(k) is not None), default=None)
        if newest == manifest_key(known[0]) and listing[newest][2] == known[1]:
            return known[2]
        if newest is not None and newest > manifest_key(known[0]):
            try:
                doc = _read(store, newest)
            except FileNotFoundError:
                doc = None  # superseded and deleted meanwhile: a full listing below
            if doc is not None:
                _NEWEST[store.url] = (int(doc["number"]), listing[newest][2], doc)
                return doc
    for _ in range(5):
        listing = store.list(MANIFESTS)
        numbers = sorted(n for k in listing if (n := manifest_number(k)) is not None)
        if not numbers:
            return None
        key = manifest_key(numbers[-1])
        try:
            doc = _read(store, key)
        except FileNotFoundError:
            continue  # superseded and deleted since the listing: list again
        _NEWEST[store.url] = (numbers[-1], listing[key][2], doc)
        return doc
    raise StorageError(f"{store.url}: the newest manifest keeps disappearing; is a sweeper misconfigured?")


def remember_created(store: ObjectStore, raw: bytes, doc: dict[str, Any]) -> None:
    """Note a manifest this process just created as the newest one it knows.  S3's ETag of a
    single PUT is the MD5 of its bytes, so the next :func:`newest_manifest` needs no GET."""
    _NEWEST[store.url] = (int(doc["number"]), f'"{hashlib.md5(raw).hexdigest()}"', doc)


def is_newest_or_base(store: ObjectStore, n: int, token: str) -> bool:
    """After creating manifest ``n`` with writer ``token``: true if it is the newest, or the base
    of the next one (another writer built on it at once).  False if newer manifests exist that
    do not descend from it: ``n`` filled a gap left by the deletion of a superseded manifest."""
    newer = [k for k in store.list(MANIFESTS, start_after=manifest_key(n)) if manifest_number(k) is not None]
    if not newer:
        return True
    first = min(newer)
    try:
        nxt = _read(store, first)
    except FileNotFoundError:
        return False
    return int(nxt["number"]) == n + 1 and nxt.get("base_writer") == token


__all__ = [
    "DIRECT",
    "INLINE_MAX",
    "MANIFESTS",
    "encode_manifest",
    "garbage_of",
    "holds_inline",
    "inline_data",
    "inline_file",
    "is_direct",
    "is_newest_or_base",
    "is_upload_key",
    "manifest_key",
    "manifest_number",
    "new_manifest",
    "newest_manifest",
    "object_file",
    "parent",
    "parse_manifest",
    "referenced_keys",
    "remember_created",
    "upload_key",
]
