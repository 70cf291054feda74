"""The state of a pylog root on an object store, and the JSON documents that record it (format 2).

A root's state (:class:`Snapshot`) is its file tree - each path mapped to an immutable object or
to bytes held inline - plus its directories, the objects waiting to be deleted (``garbage``) and
the checkpoints readers may start from.  Version N of the state is recorded by three kinds of
object, all JSON::

    _pylog/log/<N, 20 digits>.json                 commit N: what it changed (put-if-absent)
    _pylog/checkpoints/<N>.<16 hex digits>.json    the whole state at N (every few commits)
    _pylog/_last_checkpoint                        hint: the newest checkpoint (overwritten)

Commit N (``"format": "pylog-commit"``)::

    {"format": "pylog-commit", "version": 2, "number": N, "writer": "<token>",
     "base_writer": "<token of commit N-1>", "time_ms": 1767225600000,
     "put":    {"<path>": {"size": 123, "key": "<object key>"}     an uploaded file
                         | {"size", "key", "overlay": "<base64>"}  an object read with 8-byte
                                                                   values put over it (version 3)
                         | {"inline": "<base64>"}                   a small file, whole
                         | {"at": 4096, "append": "<base64>"}      bytes added to an inline file
                         | {"patch": [[i, j, "<base64>"], ...]}},  lines i..j of an inline file
                                                                   replaced (metadata files)
     "delete": ["<path>", ...], "dirs_add": [...], "dirs_delete": [...],
     "garbage_add": [["<key>", <time_ms superseded>], ...], "garbage_delete": ["<key>", ...],
     "checkpoint": {"number": N, "key": "...", "size": 4711, "sha256": "..."} | null,
     "retained_from": <oldest commit number not yet scheduled for deletion>}

A checkpoint (``"format": "pylog-checkpoint"``) holds the state at its number: ``files`` (the
entries above, never ``append``), ``dirs``, ``garbage``, ``checkpoints`` (the checkpoints retained
before it) and ``retained_from``.  The hint (``"format": "pylog-hint"``) holds
``{"checkpoint": {...}}``; a reader verifies the checkpoint's size and SHA-256 against it.

A reader of this version refuses a document of a newer version with
:class:`~pylog.storage.errors.UnsupportedFormatError` (nothing is changed).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pylog.storage.errors import CorruptMetadataError, UnsupportedFormatError

VERSION = 2
PATCH_VERSION = 3
"""Documents holding a patched object reference are written as version 3, so that a pylog that
cannot apply patches refuses them instead of reading unpatched bytes; others stay version 2."""
LOG = "_pylog/log/"
CHECKPOINTS = "_pylog/checkpoints/"
HINT = "_pylog/_last_checkpoint"

COMMIT_FORMAT = "pylog-commit"
CHECKPOINT_FORMAT = "pylog-checkpoint"
HINT_FORMAT = "pylog-hint"


def commit_key(number: int) -> str:
    return f"{LOG}{number:020d}.json"


def commit_number(key: str) -> int | None:
    """The number of a commit key; None for any other key."""
    num = key[len(LOG) : -len(".json")]
    return int(num) if key.startswith(LOG) and key.endswith(".json") and num.isdigit() else None


def checkpoint_key(number: int, token: str) -> str:
    return f"{CHECKPOINTS}{number:020d}.{token[:16]}.json"


def checkpoint_number(key: str) -> int | None:
    """The number of a checkpoint key; None for any other key."""
    if not key.startswith(CHECKPOINTS) or not key.endswith(".json"):
        return None
    num = key[len(CHECKPOINTS) :].split(".", 1)[0]
    return int(num) if num.isdigit() else None


def unit_of(path: str) -> str:
    """What a change of ``path`` conflicts on: its top-level directory (one topic-partition),
    or the file itself at the root."""
    return path.split("/", 1)[0]


# ---------------------------------------------------------------------- the state


@dataclass(frozen=True)
class Ref:
    """One file of the tree: an immutable object (``key``) or bytes held inline (``data``).

    ``patch`` (objects only): 8-byte values that replace the object's bytes at given positions
    whenever it is read, packed as big-endian int64 pairs ``(position, value)`` in increasing
    position order.  A staged segment adopted into a log as it is (see
    :meth:`~pylog.storage.backends.objectstore.storage.ObjectStorage.adopt`) gets the ``baseOffset`` of
    each batch this way, instead of being downloaded, patched and uploaded again."""

    size: int
    key: str | None = None
    data: bytes | None = None
    patch: bytes | None = None
    local: ClassVar[bool] = False  # as a working tree's entry: committed, not written since


@dataclass(frozen=True)
class CheckpointRef:
    number: int
    key: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "key": self.key, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def from_json(d: Any) -> CheckpointRef:
        return CheckpointRef(int(d["number"]), str(d["key"]), int(d["size"]), str(d["sha256"]))


@dataclass
class Snapshot:
    """The state of a root at commit ``number`` (-1: no state yet)."""

    number: int = -1
    writer: str = ""
    files: dict[str, Ref] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    garbage: list[tuple[str, int]] = field(default_factory=list)
    checkpoints: list[CheckpointRef] = field(default_factory=list)  # retained, oldest first
    retained_from: int = 0  # the oldest commit object not yet scheduled for deletion
    log_bytes: int = 0  # bytes of the commits since the newest checkpoint

    def copy(self) -> Snapshot:
        return replace(
            self,
            files=dict(self.files),
            dirs=set(self.dirs),
            garbage=list(self.garbage),
            checkpoints=list(self.checkpoints),
        )

    def keys(self) -> set[str]:
        """The objects this state keeps: its files', its garbage, its checkpoints."""
        keys = {r.key for r in self.files.values() if r.key}
        keys |= {k for k, _ in self.garbage}
        keys |= {c.key for c in self.checkpoints}
        return keys


@dataclass
class Change:
    """What one commit changes in a :class:`Snapshot`."""

    put: dict[str, Ref] = field(default_factory=dict)
    appended: dict[str, int] = field(default_factory=dict)  # put paths extending inline bytes: at
    patches: dict[str, list[tuple[int, int, bytes]]] = field(default_factory=dict)  # line edits
    delete: set[str] = field(default_factory=set)
    dirs_add: set[str] = field(default_factory=set)
    dirs_delete: set[str] = field(default_factory=set)
    garbage_add: list[tuple[str, int]] = field(default_factory=list)
    garbage_delete: set[str] = field(default_factory=set)
    checkpoint: CheckpointRef | None = None
    retained_from: int | None = None

    def empty(self) -> bool:
        return not (self.put or self.delete or self.dirs_add or self.dirs_delete)

    def files(self) -> set[str]:
        """The files this change writes or removes."""
        return set(self.put) | self.delete

    def dirs(self) -> set[str]:
        """The directories this change creates or removes."""
        return self.dirs_add | self.dirs_delete

    def units(self) -> set[str]:
        """The topic-partition directories and root files this change touches."""
        paths: Iterable[str] = [*self.put, *self.delete, *self.dirs_add, *self.dirs_delete]
        return {unit_of(p) for p in paths}


def diff(
    base: Snapshot, files: dict[str, Ref], dirs: set[str], touched: Iterable[str] | None = None
) -> Change:
    """The change from ``base`` to the tree ``files``/``dirs`` (garbage not included).
    ``touched``: the only paths that may differ; ``files`` then need hold no other path (the
    rest of the tree is ``base``'s), so that the cost is that of the change, not of the tree."""
    ch = Change()
    paths = files.keys() if touched is None else [p for p in touched if p in files]
    for path in paths:
        ref = files[path]
        old = base.files.get(path)
        if old is not None and (old is ref or old == ref):
            continue
        ch.put[path] = ref
        if old is not None and old.data is not None and ref.data is not None:
            n = len(old.data)
            if len(ref.data) > n and ref.data[:n] == old.data:
                ch.appended[path] = n
            elif "/" not in path:
                edits = line_edits(old.data, ref.data)
                if sum(len(b) + 16 for _, _, b in edits) < len(ref.data):
                    ch.patches[path] = edits
    gone = base.files if touched is None else [p for p in touched if p in base.files]
    ch.delete = {p for p in gone if p not in files}
    ch.dirs_add = dirs - base.dirs
    ch.dirs_delete = base.dirs - dirs
    return ch


def line_edits(old: bytes, new: bytes) -> list[tuple[int, int, bytes]]:
    """Edits that turn the lines of ``old`` into ``new``: (first line, end line, new bytes), in
    order, line numbers of ``old`` (metadata files at the root change a few lines per commit)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(i1, i2, b"".join(b[j1:j2])) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def apply_edits(old: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    lines = old.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0
    for i, j, data in edits:
        if not pos <= i <= j <= len(lines):
            raise ValueError(f"line edit {i}..{j} outside the {len(lines)} lines of the file")
        out.extend(lines[pos:i])
        out.append(data)
        pos = j
    out.extend(lines[pos:])
    return b"".join(out)


def dropped_keys(base: Snapshot, ch: Change) -> list[str]:
    """Objects of ``base`` that ``ch`` stops referencing (replaced or deleted files)."""
    still = {r.key for r in ch.put.values() if r.key}
    out = set()
    for path in [*ch.put, *ch.delete]:
        old = base.files.get(path)
        if old is not None and old.key and old.key not in still:
            out.add(old.key)
    if not out:
        return []  # (most commits: inline files only; no need to look at the rest of the tree)
    kept = {r.key for p, r in base.files.items() if r.key and p not in ch.put and p not in ch.delete}
    return sorted(out - kept)


def apply(base: Snapshot, ch: Change, number: int, writer: str, size: int = 0) -> Snapshot:
    """The state after commit ``number`` (by ``writer``, ``size`` bytes) made ``ch`` on ``base``."""
    s = base.copy()
    for path in ch.delete:
        s.files.pop(path, None)
    s.files.update(ch.put)
    s.dirs = (s.dirs - ch.dirs_delete) | ch.dirs_add
    if ch.garbage_delete:
        s.garbage = [(k, t) for k, t in s.garbage if k not in ch.garbage_delete]
    s.garbage.extend(ch.garbage_add)
    if ch.checkpoint is not None:
        s.checkpoints = [*s.checkpoints[-1:], ch.checkpoint]
    if ch.retained_from is not None:
        s.retained_from = ch.retained_from
    s.log_bytes = 0 if ch.checkpoint is not None else base.log_bytes + size
    s.number, s.writer = number, writer
    return s


# ---------------------------------------------------------------------- documents


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ref_json(ref: Ref) -> dict[str, Any]:
    if ref.data is not None:
        return {"inline": _b64(ref.data)}
    if ref.patch is not None:
        return {"size": ref.size, "key": ref.key, "overlay": _b64(ref.patch)}
    return {"size": ref.size, "key": ref.key}


def ref_from_json(d: Any) -> Ref:
    if "inline" in d:
        data = base64.b64decode(d["inline"], validate=True)
        return Ref(len(data), data=data)
    overlay = d.get("overlay")
    if overlay is not None:
        raw = base64.b64decode(overlay, validate=True)
        if len(raw) % 16:
            raise ValueError(f"a patch of {len(raw)} bytes is not a list of (position, value) pairs")
        return Ref(int(d["size"]), key=str(d["key"]), patch=raw)
    return Ref(int(d["size"]), key=str(d["key"]))


def _version(refs: Iterable[Ref]) -> int:
    return PATCH_VERSION if any(r.patch is not None for r in refs) else VERSION


def check_version(doc: Any, fmt: str, where: str) -> dict[str, Any]:
    """``doc`` as a dict of format ``fmt``; a newer version raises UnsupportedFormatError."""
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CorruptMetadataError(f"{where}: not a {fmt} document (format {got!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version < VERSION:
        raise CorruptMetadataError(f"{where}: {fmt} document with an invalid version {version!r}")
    if version > PATCH_VERSION:
        raise UnsupportedFormatError(
            f"{where}: written by a newer pylog ({fmt} format version {version}; this pylog reads "
            f"versions {VERSION} and {PATCH_VERSION}): upgrade pylog to open this root; nothing was changed"
        )
    return doc


def _load_json(raw: bytes, fmt: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CorruptMetadataError(f"{where}: not valid JSON ({e}); a torn or foreign object?") from e
    return check_version(doc, fmt, where)


def encode_commit(number: int, writer: str, base_writer: str, time_ms: int, ch: Change) -> bytes:
    put: dict[str, Any] = {}
    for path in sorted(ch.put):
        ref = ch.put[path]
        at = ch.appended.get(path)
        edits = ch.patches.get(path)
        if at is not None and ref.data is not None:
            put[path] = {"at": at, "append": _b64(ref.data[at:])}
        elif edits is not None:
            put[path] = {"patch": [[i, j, _b64(b)] for i, j, b in edits]}
        else:
            put[path] = ref_json(ref)
    doc = {
        "format": COMMIT_FORMAT,
        "version": _version(ch.put.values()),
        "number": number,
        "writer": writer,
        "base_writer": base_writer,
        "time_ms": time_ms,
        "put": put,
        "delete": sorted(ch.delete),
        "dirs_add": sorted(ch.dirs_add),
        "dirs_delete": sorted(ch.dirs_delete),
        "garbage_add": [[k, t] for k, t in ch.garbage_add],
        "garbage_delete": sorted(ch.garbage_delete),
        "checkpoint": None if ch.checkpoint is None else ch.checkpoint.to_json(),
        "retained_from": ch.retained_from,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Commit:
    number: int
    writer: str
    base_writer: str
    time_ms: int
    change: Change


def parse_commit(raw: bytes, where: str, base: Snapshot) -> Commit:
    """Commit document ``raw`` read from ``where``, resolved against the state it follows."""
    doc = _load_json(raw, COMMIT_FORMAT, where)
    try:
        ch = Change()
        for path, d in doc["put"].items():
            if "append" in d:
                old = base.files.get(path)
                at = int(d["at"])
                if old is None or old.data is None or len(old.data) != at:
                    raise ValueError(f"appends to {path!r} at {at}, which the state before does not hold")
                data = old.data + base64.b64decode(d["append"], validate=True)
                ch.put[path] = Ref(len(data), data=data)
                ch.appended[path] = at
            elif "patch" in d:
                old = base.files.get(path)
                if old is None or old.data is None:
                    raise ValueError(f"patches {path!r}, which the state before does not hold inline")
                edits = [(int(i), int(j), base64.b64decode(b, validate=True)) for i, j, b in d["patch"]]
                data = apply_edits(old.data, edits)
                ch.put[path] = Ref(len(data), data=data)
                ch.patches[path] = edits
            else:
                ch.put[path] = ref_from_json(d)
        ch.delete = {str(p) for p in doc["delete"]}
        ch.dirs_add = {str(p) for p in doc["dirs_add"]}
        ch.dirs_delete = {str(p) for p in doc["dirs_delete"]}
        ch.garbage_add = [(str(k), int(t)) for k, t in doc["garbage_add"]]
        ch.garbage_delete = {str(k) for k in doc["garbage_delete"]}
        if doc.get("checkpoint") is not None:
            ch.checkpoint = CheckpointRef.from_json(doc["checkpoint"])
        if doc.get("retained_from") is not None:
            ch.retained_from = int(doc["retained_from"])
        return Commit(
            int(doc["number"]), str(doc["writer"]), str(doc["base_writer"]), int(doc["time_ms"]), ch
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{where}: corrupt commit: {e}") from e


def encode_checkpoint(s: Snapshot, time_ms: int) -> bytes:
    """The checkpoint document of ``s`` (its own reference is not inside: ``checkpoints`` lists
    the ones retained before it)."""
    doc = {
        "format": CHECKPOINT_FORMAT,
        "version": _version(s.files.values()),
        "number": s.number,
        "writer": s.writer,
        "time_ms": time_ms,
        "files": {p: ref_json(r) for p, r in sorted(s.files.items())},
        "dirs": sorted(s.dirs),
        "garbage": [[k, t] for k, t in s.garbage],
        "checkpoints": [c.to_json() for c in s.checkpoints],
        "retained_from": s.retained_from,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def checkpoint_ref(number: int, key: str, raw: bytes) -> CheckpointRef:
    return CheckpointRef(number, key, len(raw), hashlib.sha256(raw).hexdigest())


def parse_checkpoint(raw: bytes, ref: CheckpointRef, where: str) -> Snapshot:
    """The state in checkpoint ``raw``, verified against ``ref`` (size and SHA-256): a checkpoint
    that is not exactly what its commit recorded is never trusted."""
    if len(raw) != ref.size or hashlib.sha256(raw).hexdigest() != ref.sha256:
        raise CorruptMetadataError(
            f"{where}: checkpoint {ref.number} is not the one its commit recorded "
            f"({len(raw)} bytes, expected {ref.size} with SHA-256 {ref.sha256[:16]}...)"
        )
    doc = _load_json(raw, CHECKPOINT_FORMAT, where)
    try:
        if int(doc["number"]) != ref.number:
            raise ValueError(f"holds state {doc['number']}, expected {ref.number}")
        return Snapshot(
            number=ref.number,
            writer=str(doc["writer"]),
            files={str(p): ref_from_json(d) for p, d in doc["files"].items()},
            dirs={str(d) for d in doc["dirs"]},
            garbage=[(str(k), int(t)) for k, t in doc["garbage"]],
            checkpoints=[*(CheckpointRef.from_json(c) for c in doc["checkpoints"]), ref],
            retained_from=int(doc["retained_from"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptMetadataError(f"{where}: corrupt checkpoint: {e}") from e


def encode_hint(ref: CheckpointRef) -> bytes:
    return json.dumps({"format": HINT_FORMAT, "version": VERSION, "checkpoint": ref.to_json()}).encode()


def parse_hint(raw: bytes, where: str) -> CheckpointRef:
    doc = _load_json(raw, HINT_FORMAT, where)
    try:
        return CheckpointRef.from_json(doc["checkpoint"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptMetadataError(f"{where}: corrupt hint: {e}") from e


__all__ = [
    "CHECKPOINTS",
    "HINT",
    "LOG",
    "VERSION",
    "Change",
    "CheckpointRef",
    "Commit",
    "Ref",
    "Snapshot",
    "apply",
    "apply_edits",
    "check_version",
    "checkpoint_key",
    "checkpoint_number",
    "checkpoint_ref",
    "commit_key",
    "commit_number",
    "diff",
    "dropped_keys",
    "encode_checkpoint",
    "encode_commit",
    "encode_hint",
    "line_edits",
    "parse_checkpoint",
    "parse_commit",
    "parse_hint",
    "unit_of",
]
