"""The list of segments a writer leaves in a partition directory it closes: ``.pylog-segments``.

Opening a log of many segments by listing its directory costs time in the number of files
(40,000 names for 10,000 segments).  A writer that closes a log of at least
:data:`MIN_SEGMENTS` segments cleanly leaves the sorted base offsets of its ``.log`` files in
``.pylog-segments`` (a dotted name: Kafka, ``pylog verify`` and ``pylog dump`` pass over it),
with the directory's identity (device, inode, size, modification time in nanoseconds) taken
after the file was written.  The next writer to open the log (holding the root's writer lock:
no other pylog process changes the directory meanwhile) uses the list instead of listing the
directory only when

* the file is whole (its CRC holds) and the directory's identity is still the recorded one
  (creating, removing or renaming any file in it changes its modification time);
* the ``.log`` files of its first and last segments exist, and none named after the log end
  offset does (a segment rolled behind the list's back);

and removes the file (durably) before it changes anything in the directory.  A writer that
stops without closing the log leaves no list, so the next one lists the directory, as it does
whenever the list is missing, damaged or stale.

The list is written only when the directory holds exactly the log's segments: its listing at
the close has no temporary file (``.deleted``, ``.cleaned``, ``.swap``: recovery must see
those), no index without its ``.log``, and the same ``.log`` files as the log.  The close
waits (a few milliseconds at most) until the clock has passed the directory's recorded
modification time, so that a change made right after the close cannot carry the same time; a
file system that keeps whole seconds only gets no list.  Local disks only: an object store's
listing comes from the snapshot's file map, held in memory.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pylog.storage.backends.base import Storage, join
from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import PylogError
from pylog.storage.partition.names import scan
from pylog.storage.partition.segment import LogSegment, segment_name
from pylog.storage.partition.segments import base_offsets

log = logging.getLogger("pylog.storage")

NAME = ".pylog-segments"
MIN_SEGMENTS = 128
"""Logs of fewer segments are listed at their opening (cheap) and get no list."""

_MAGIC = b"PYLOG-SEGMENTS\x00\x01"  # 14 bytes of name, format version 1
_HEAD = struct.Struct(">16sQq")  # magic, segment count, log end offset
_SLOT = 256  # the directory's identity: a 2-byte length, then UTF-8, zero-padded
_CRC = struct.Struct(">I")
_CLOCK_WAIT_S = 0.1

WRITTEN = [0]
"""Lists written in this process (tests count them)."""


@dataclass(frozen=True)
class ClosedList:
    bases: list[int]
    log_end_offset: int
    identity: str


def supported(storage: Storage) -> bool:
    return isinstance(storage, LocalStorage)


def encode(bases: np.ndarray, log_end_offset: int, identity: str = "") -> bytes:
    ident = identity.encode()
    if len(ident) > _SLOT - 2:
        raise ValueError(f"directory identity too long: {identity!r}")
    body = b"".join(
        (
            _HEAD.pack(_MAGIC, len(bases), log_end_offset),
            bases.astype(">i8").tobytes(),
            len(ident).to_bytes(2, "big") + ident.ljust(_SLOT - 2, b"\x00"),
        )
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> ClosedList | None:
    """The list in ``data``; None when it is not one whole list of ascending base offsets."""
    if len(data) < _HEAD.size + _SLOT + _CRC.size:
        return None
    magic, count, leo = _HEAD.unpack_from(data)
    if magic != _MAGIC or len(data) != _HEAD.size + 8 * count + _SLOT + _CRC.size:
        return None
    if zlib.crc32(memoryview(data)[: -_CRC.size]) != _CRC.unpack_from(data, len(data) - _CRC.size)[0]:
        return None
    bases = np.frombuffer(data, dtype=">i8", count=count, offset=_HEAD.size)
    if count == 0 or bases[0] < 0 or (count > 1 and not bool(np.all(bases[1:] > bases[:-1]))):
        return None
    slot = data[_HEAD.size + 8 * count : -_CRC.size]
    n = int.from_bytes(slot[:2], "big")
    if not 0 < n <= _SLOT - 2 or leo < int(bases[-1]):
        return None
    try:
        identity = slot[2 : 2 + n].decode()
    except UnicodeDecodeError:
        return None
    return ClosedList(bases.astype(np.int64).tolist(), leo, identity)


def take(storage: Storage, directory: str) -> list[int] | None:
    """For a writer opening the log in ``directory``: the base offsets of its segments from
    the list its last writer left, or None when there is none that still holds (the caller
    lists the directory).  The list is removed either way, before the caller changes
    anything."""
    if not supported(storage):
        return None
    path = join(directory, NAME)
    if not storage.exists(path):
        return None
    identity = storage.identity(directory)  # (before the removal changes it)
    data = storage.read(path)
    storage.delete(path)
    storage.fsync_dir(directory)  # a crash from here on never finds this list again
    found = decode(data)
    if found is None:
        log.warning("%s/%s: not a whole segment list; listing the directory", storage.describe(), path)
        return None
    if found.identity != identity:
        log.debug("%s: changed since its segment list was written; listing it", directory)
        return None
    first, last = found.bases[0], found.bases[-1]
    if not (
        storage.exists(join(directory, segment_name(first) + ".log"))
        and storage.exists(join(directory, segment_name(last) + ".log"))
    ):
        return None
    if found.log_end_offset > last and storage.exists(
        join(directory, segment_name(found.log_end_offset) + ".log")
    ):
        return None
    return found.bases


def leave(storage: Storage, directory: str, segments: Sequence[LogSegment]) -> bool:
    """At the clean close of the writer's log in ``directory`` (of ``segments``): write its
    segment list (see the module docstring); True if it was written.  A failure to write it is
    logged, not raised: the next writer then lists the directory."""
    if not supported(storage) or len(segments) < MIN_SEGMENTS:
        return False
    path = join(directory, NAME)
    try:
        return _leave(storage, directory, segments, path)
    except (OSError, PylogError) as e:
        log.warning("%s/%s: could not write the segment list: %s", storage.describe(), path, e)
        with contextlib.suppress(OSError, PylogError):  # (a partial list fails its CRC)
            storage.delete(path)
        return False


def _leave(storage: Storage, directory: str, segments: Sequence[LogSegment], path: str) -> bool:
    names = storage.listdir(directory)
    if NAME in names:
        storage.delete(path)
    scanned = scan(names)
    if scanned is None or scanned.has_temp or scanned.orphans:
        return False  # recovery must see these: the next open lists the directory
    bases = np.array(scanned.bases, dtype=np.int64)
    if not np.array_equal(bases, base_offsets(segments)):
        log.warning("%s: its segment files differ from the log's segments; no segment list", directory)
        return False
    leo = segments[-1].read_next_offset()
    storage.write_atomic(path, encode(bases, leo))  # (without the identity: matches nothing yet)
    identity = storage.identity(directory)
    mtime_ns = int(identity.rsplit(":", 1)[1]) if identity else 0
    if mtime_ns % 1_000_000_000 == 0 or not _clock_past(mtime_ns):
        storage.delete(path)  # whole seconds: a change within this one would go unseen
        return False
    assert identity is not None
    data = encode(bases, leo, identity)
    slot_at = _HEAD.size + 8 * len(bases)
    storage.write_at(path, [(slot_at, data[slot_at:])])
    WRITTEN[0] += 1
    return True


def _clock_past(mtime_ns: int) -> bool:
    """Wait until the clock file times are taken from is past ``mtime_ns``; False if it is not
    within :data:`_CLOCK_WAIT_S` (a clock set back)."""
    clock = getattr(time, "CLOCK_REALTIME_COARSE", time.CLOCK_REALTIME)
    deadline = time.monotonic() + _CLOCK_WAIT_S
    while time.clock_gettime_ns(clock) <= mtime_ns:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


__all__ = ["MIN_SEGMENTS", "NAME", "ClosedList", "decode", "encode", "leave", "take"]
