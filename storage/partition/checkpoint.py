"""Kafka's offset checkpoint files (``CheckpointFile`` + ``OffsetCheckpointFile``).

Layout (Kafka's ``CheckpointFile`` with version 0), UTF-8 text::

    0                       version
    2                       number of entries
    mytopic 0 1234          <topic> <partition> <offset>, one per line
    mytopic 1 99

Written with ``\\n`` line endings, entries sorted by (topic, partition), through
:meth:`Storage.write_atomic` (``<file>.tmp`` → fsync → rename → fsync the directory), so a reader
sees the old or the new file, never a mix; a ``.tmp`` left by a crash is never read.

Reading follows Kafka's rules (an empty file, or a file that ends after the version line, is an
empty map; ``\\r\\n`` and ``\\r`` line endings are accepted, as Java's ``readLine`` does) and is
strict about everything else: every malformed file raises :class:`CorruptCheckpointError` naming
the file and the 1-based line, never a silent 0.  Kafka's log manager resets to an empty map on
such errors; deciding that is the caller's business.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Mapping

from pylog.storage.backends.base import Storage
from pylog.storage.config import INT32_MAX, INT64_MAX, INT64_MIN, validate_topic_name
from pylog.storage.errors import ConfigError, CorruptCheckpointError, InvalidOffsetError, StorageError

__all__ = [
    "CLEANER_OFFSET",
    "LOG_START_OFFSET",
    "RECOVERY_POINT",
    "VERSION",
    "format_offsets",
    "parse_offsets",
    "read_offsets",
    "write_offsets",
]

RECOVERY_POINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET = "log-start-offset-checkpoint"
CLEANER_OFFSET = "cleaner-offset-checkpoint"
VERSION = 0

_LINE_END_RE = re.compile(r"\r\n|\r|\n")  # java.io.BufferedReader.readLine's terminators
_JAVA_WS = " \t\n\x0b\f\r"  # java.util.regex \s
_WS_RE = re.compile(f"[{re.escape(_JAVA_WS)}]+")
_INT_RE = re.compile(r"[+-]?[0-9]+")  # Integer.parseInt / Long.parseLong syntax

TopicPartition = tuple[str, int]
"""(topic, partition): the key of these files, of high watermarks and of consumed offsets."""

Offsets = dict[TopicPartition, int]


def _int(text: str) -> int | None:
    """``text`` as an integer if it has Java's integer syntax, else None.

    Digit strings too long for any range here become a value outside int64 (Python refuses to
    convert very long digit strings).
    """
    if len(text) < 19 and text.isascii() and text.isdigit():
        return int(text)  # the usual case
    if not _INT_RE.fullmatch(text):
        return None
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 20:
        return -(10**20) if text.startswith("-") else 10**20
    return int(text)


def _show(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _check_entry(key: object, offset: object) -> tuple[str, int, int]:
    if not (isinstance(key, tuple) and len(key) == 2):
        raise ConfigError(f"checkpoint keys must be (topic, partition) tuples, got {key!r}")
    topic, partition = key
    validate_topic_name(topic)
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition <= INT32_MAX:
        raise ConfigError(
            f"partition of topic {topic!r} must be an integer in [0, {INT32_MAX}], got {partition!r}"
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or not INT64_MIN <= offset <= INT64_MAX:
        raise InvalidOffsetError(
            f"offset of {topic}-{partition} must be an integer in [{INT64_MIN}, {INT64_MAX}], got {offset!r}"
        )
    return topic, partition, offset


def format_offsets(entries: Mapping[tuple[str, int], int]) -> bytes:
    """The checkpoint bytes for ``entries``: version 0, count, sorted entry lines, ``\\n`` endings.

    Raises :class:`ConfigError` for an illegal topic name or partition and
    :class:`InvalidOffsetError` for an offset outside int64.
    """
    if not _plainly_valid(entries):  # something to report (or int subclasses): entry by entry
        for key, offset in entries.items():
            _check_entry(key, offset)
    keys = sorted(entries)
    body = "".join([f"{k[0]} {k[1]} {entries[k]}\n" for k in keys])
    return f"{VERSION}\n{len(keys)}\n{body}".encode("ascii")


def _plainly_valid(entries: Mapping[tuple[str, int], int]) -> bool:
    """Whether ``entries`` are valid (str, int) keys and int offsets, checked in whole-column
    passes (each distinct topic name validated once); False when a check fails, for
    :func:`_check_entry` to name the entry."""
    if not entries:
        return True
    keys = entries.keys()
    if set(map(type, keys)) != {tuple} or set(map(len, keys)) != {2}:
        return False
    topics = set(map(_first, keys))
    partitions = list(map(_second, keys))
    offsets = entries.values()
    if set(map(type, topics)) != {str} or set(map(type, partitions)) | set(map(type, offsets)) != {int}:
        return False
    if min(partitions) < 0 or max(partitions) > INT32_MAX:
        return False
    if min(offsets) < INT64_MIN or max(offsets) > INT64_MAX:
        return False
    try:
        for topic in topics:
            validate_topic_name(topic)
    except ConfigError:
        return False
    return True


_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def parse_offsets(data: bytes, *, path: str | None = None) -> dict[tuple[str, int], int]:
    """Parse checkpoint bytes; ``path`` only names the file in errors."""

    fast = _parse_canonical(data)
    if fast is not None:
        return fast

    def fail(message: str, line: int) -> CorruptCheckpointError:
        if path is None:  # CorruptCheckpointError shows the line only after a path
            message = f"line {line}: {message}"
        return CorruptCheckpointError(message, path=path, line=line)

    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = len(_LINE_END_RE.split(bytes(data[: e.start]).decode("utf-8")))
        raise fail(f"invalid UTF-8 at byte {e.start}", line_no) from e
    if not text:
        return {}  # Kafka: an empty file is an empty checkpoint
    lines = _LINE_END_RE.split(text)
    if lines[-1] == "":
        lines.pop()  # the terminator of the last line

    version = _int(lines[0])
    if version is None:
        raise fail(f"version line {_show(lines[0])} is not an integer", 1)
    if version != VERSION:
        raise fail(f"unsupported checkpoint version {version} (expected {VERSION})", 1)
    if len(lines) < 2:
        return {}  # Kafka: no count line means no entries

    count_line = lines[1]
    if not count_line.strip(_JAVA_WS):
        raise fail("entry count is missing (empty line)", 2)
    count = _int(count_line)
    if count is None:
        raise fail(f"entry count {_show(count_line)} is not an integer", 2)
    if not 0 <= count <= INT32_MAX:
        raise fail(f"entry count {_show(count_line)} is out of range [0, {INT32_MAX}]", 2)

    result: Offsets = {}
    first_seen: dict[tuple[str, int], int] = {}
    valid_topics: set[str] = set()  # (a root of thousands of partitions has few topics)
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split(" ")  # what this module writes; anything else takes the slow path
        if len(fields) != 3 or not all(fields) or not line.isprintable():
            stripped = line.strip(_JAVA_WS)
            fields = _WS_RE.split(stripped) if stripped else []
        if len(fields) != 3:
            raise fail(
                f"malformed entry {_show(line)}: expected 3 fields '<topic> <partition> <offset>', "
                f"found {len(fields)}",
                number,
            )
        topic, partition_text, offset_text = fields
        if topic not in valid_topics:
            try:
                validate_topic_name(topic)
            except ConfigError as e:
                raise fail(f"malformed entry: {e}", number) from e
            valid_topics.add(topic)
        partition = _int(partition_text)
        if partition is None:
            raise fail(f"malformed entry: partition {_show(partition_text)} is not an integer", number)
        if partition < 0:
            raise fail(f"malformed entry: partition {partition} is negative", number)
        if partition > INT32_MAX:
            raise fail(
                f"malformed entry: partition {_show(partition_text)} is out of range [0, {INT32_MAX}]", number
            )
        offset = _int(offset_text)
        if offset is None:
            raise fail(f"malformed entry: offset {_show(offset_text)} is not an integer", number)
        if not INT64_MIN <= offset <= INT64_MAX:
            raise fail(f"malformed entry: offset {_show(offset_text)} is out of the int64 range", number)
        key = (topic, partition)
        if key in first_seen:
            raise fail(f"duplicate entry for {topic}-{partition} (first on line {first_seen[key]})", number)
        first_seen[key] = number
        result[key] = offset

    if len(result) != count:
        raise fail(f"expected {count} entries, found {len(result)}", 2)
    return result


_CANONICAL = re.compile(r"0\n([0-9]{1,9})\n((?:[A-Za-z0-9._-]{1,249} [0-9]{1,9} -?[0-9]{1,18}\n)*)")


def _parse_canonical(data: bytes) -> Offsets | None:
    """The entries of a checkpoint in the form :func:`format_offsets` writes (numbers in range,
    one space between the fields), matched by one regular expression, then split and converted
    in whole-file passes: no Python step per line.  None for anything else (and for any error),
    which the line-by-line parser then reads or rejects naming the line."""
    try:
        text = bytes(data).decode("ascii")
    except UnicodeDecodeError:
        return None
    m = _CANONICAL.fullmatch(text)
    if m is None:
        return None
    fields = m.group(2).split()  # (the match holds three fields a line, one space between)
    topics = fields[0::3]
    try:
        for topic in set(topics):
            validate_topic_name(topic)
        # the numbers as JSON arrays: converted in C (a leading zero is not JSON: the slow path)
        partitions = json.loads("[" + ",".join(fields[1::3]) + "]")
        offsets = json.loads("[" + ",".join(fields[2::3]) + "]")
    except (ConfigError, ValueError):
        return None
    result = dict(zip(zip(topics, partitions, strict=True), offsets, strict=True))
    return result if len(result) == len(topics) == int(m.group(1)) else None


def write_offsets(storage: Storage, path: str, entries: Mapping[tuple[str, int], int]) -> None:
    """Durably replace the checkpoint at ``path`` (root-relative) with ``entries``."""
    data = format_offsets(entries)
    storage.write_atomic(path, data)
    _remember(storage, path, data, dict(entries))  # the next read of these bytes parses nothing


def read_offsets(storage: Storage, path: str) -> dict[tuple[str, int], int]:
    """The entries of the checkpoint at ``path``; a missing file is an empty map.  An I/O error
    raises :class:`StorageError` naming the file."""
    try:
        if not storage.exists(path):
            return {}
        data = storage.read(path)
    except OSError as e:
        raise StorageError(
            f"{storage.describe()}/{path}: cannot read the checkpoint: {e.strerror or e} (errno {e.errno})"
        ) from e
    key = (storage.describe(), path)
    hit = _parsed.get(key)
    if hit is not None and hit[0] == data:  # read again unchanged (a root opened, then writing)
        return dict(hit[1])
    parsed = parse_offsets(data, path=path)
    _remember(storage, path, data, parsed)
    return dict(parsed)


def _remember(storage: Storage, path: str, data: bytes, entries: Offsets) -> None:
    key = (storage.describe(), path)
    _parsed.pop(key, None)
    _parsed[key] = (bytes(data), entries)
    while len(_parsed) > _PARSED_KEPT:
        del _parsed[next(iter(_parsed))]


_PARSED_KEPT = 16
_parsed: dict[tuple[str, str], tuple[bytes, Offsets]] = {}
"""The last checkpoints parsed, by (storage, path), with their bytes."""
