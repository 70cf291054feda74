"""The exception hierarchy: every error pylog raises on purpose is a ``PylogError``."""

from __future__ import annotations

import errno as _errno
from typing import Any


def open_files_limit() -> int | None:
    """This process's soft limit of open files (``ulimit -n``), None where unknown."""
    try:
        import resource

        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):  # pragma: no cover - Windows
        return None


def too_many_open_files(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (_errno.EMFILE, _errno.ENFILE)


def os_error_reason(err: OSError) -> str:
    """What went wrong, for a message: EMFILE/ENFILE named as too many open files with the limit."""
    if err.errno == _errno.EMFILE:
        return f"too many open files (ulimit -n = {open_files_limit()}) (errno {err.errno})"
    if err.errno == _errno.ENFILE:
        return f"too many open files in the system (errno {err.errno})"
    return f"{err.strerror or err} (errno {err.errno})"


def os_error_fix(err: BaseException) -> str:
    """How to fix the cause of an I/O failure, for a message."""
    if too_many_open_files(err):
        return "raise the limit of open files (ulimit -n) or close other files"
    return "free space, check the disk"


class PylogError(Exception):
    """Root of all pylog errors."""


class CorruptRecordError(PylogError):
    """Bytes that are not a valid Kafka record set.

    ``path`` names the file (when known) and ``position`` the byte position of the entry
    (batch or message) where the problem was found, relative to the start of the file or
    buffer that was being decoded.
    """

    def __init__(self, message: str, *, position: int | None = None, path: str | None = None):
        self.reason = message
        self.position = position
        self.path = path
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.position is not None:
            where.append(f"byte {self.position}")
        return f"{': '.join(where)}: {self.reason}" if where else self.reason

    def with_context(self, *, path: str | None = None, offset: int = 0) -> CorruptRecordError:
        """The same error re-anchored in a file: ``offset`` is added to the position."""
        pos = None if self.position is None else self.position + offset
        return CorruptRecordError(self.reason, position=pos, path=path or self.path)


class OffsetOutOfRangeError(PylogError):
    """An offset below the log start offset or above the log end offset."""


class ConfigError(PylogError, ValueError):
    """An unknown configuration key or an invalid value."""


class LogLockedError(PylogError):
    """Another process holds the writer lock of a pylog root."""


class CorruptIndexError(PylogError):
    """An offset, time or transaction index file that fails its sanity check."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class CorruptCheckpointError(PylogError):
    """A checkpoint file that does not follow Kafka's format (names the file and line)."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = f"{path}" + (f", line {line}" if line is not None else "") if path else ""
        super().__init__(f"{where}: {message}" if where else message)


class InvalidOffsetError(PylogError, ValueError):
    """An append whose offsets are not above the log end (or an index entry out of order)."""


class RecordTooLargeError(PylogError, ValueError):
    """A batch larger than ``max.message.bytes`` or ``segment.bytes``."""


class IndexFullError(InvalidOffsetError):
    """An append to an index that holds ``max_entries`` entries already."""


# ---------------------------------------------------------------- topics and roots


class UnknownTopicError(PylogError, LookupError):
    """A topic (or topic-partition) that the root does not hold; the message lists those it does."""


class TopicExistsError(PylogError):
    """``create_topic`` for a name the root already holds."""


class UnknownGroupError(PylogError, LookupError):
    """A consumer group without offsets in the root; the message lists the groups it has."""


class ReadOnlyError(PylogError):
    """A change asked of a root opened with ``read_only=True``."""


class CorruptMetadataError(PylogError):
    """A pylog metadata file (topic metadata, state file, object-store manifest) that cannot be
    parsed; the message names the file."""


class UnsupportedFormatError(CorruptMetadataError):
    """Metadata of a format version this pylog does not read (written by a newer pylog: upgrade
    pylog to read it); nothing is changed."""


class CommitConflictError(PylogError):
    """Another writer published the manifest this commit wanted to create, or (local disk) a
    segment a cleaning pass read changed before the pass could swap its result in."""


# ---------------------------------------------------------------- storage backends


class StorageError(PylogError):
    """A path outside the root, or an I/O failure with the path it concerns."""


class NoRootError(StorageError):
    """A root opened read-only where there is none: a missing local directory, an object-store
    prefix without a commit (a writer creates roots; a stream waits for one)."""


class ObjectStoreError(PylogError):
    """An object-store operation failed, naming the URL (never the credentials)."""


class CommitOutcomeUnknownError(ObjectStoreError):
    """A conditional create whose outcome could not be learned (the server stayed unreachable)."""


class ConditionalWritesUnsupportedError(ObjectStoreError):
    """The target does not honour put-if-absent: writing could lose data, so pylog refuses."""


# ---------------------------------------------------------------- readers, writers and tools


class DataLossError(PylogError):
    """Offsets a query needs are gone (retention, deletion) and failOnDataLoss is true."""


class SourceOptionError(ConfigError):
    """An invalid, unknown or conflicting source option (Kafka's IllegalArgumentException)."""


class SinkSchemaError(ConfigError):
    """The DataFrame written does not follow the pylog/Kafka sink column contract."""


class DumpError(PylogError):
    """A file that cannot be dumped (missing, unreadable, badly named)."""


class DamagedLogError(PylogError):
    """A partition whose files contradict each other or its acknowledged end (segment files
    missing below the high watermark, overlapping segments, a segment whose first batch does not
    match its file name, a log start beyond the end): a writer refuses to change it, a reader to
    read the offsets concerned.  ``pylog recover`` (:meth:`Root.recover`) repairs it, stating
    what would be lost.  ``directory`` is the partition's directory, ``problems`` what is wrong
    (each naming its files)."""

    def __init__(self, message: str, *, directory: str | None = None, problems: list[str] | None = None):
        self.directory = directory
        self.problems = list(problems or [])
        super().__init__(message)


class StorageIOError(StorageError, OSError):
    """An I/O failure (disk full, EIO, EACCES...) on a file of a root, naming the file and what
    was being done.  Also an ``OSError`` (``errno``, ``strerror``, ``filename``), so code that
    tells I/O failures from damaged content still does."""

    def __init__(self, errno: int | None, strerror: str, filename: str, doing: str = "use it"):
        super().__init__(errno, strerror, filename)
        self.doing = doing

    @classmethod
    def wrap(cls, err: OSError, filename: object, doing: str) -> StorageIOError:
        """``err`` as a :class:`StorageIOError` on ``filename`` (raise it ``from err``)."""
        return cls(err.errno, err.strerror or str(err), str(filename), doing)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errno, self.strerror, self.filename, self.doing))

    def __str__(self) -> str:
        if self.errno in (_errno.EMFILE, _errno.ENFILE):
            return f"{self.filename}: cannot {self.doing}: {os_error_reason(self)}"
        return f"{self.filename}: cannot {self.doing}: {self.strerror} (errno {self.errno})"


class ProtocolError(PylogError):
    """``pylog serve``: a frame that cannot be a Kafka request (its size, a truncated or
    unparseable body, an API or version not served); its connection is closed, as Kafka does."""


class RecordSetError(PylogError):
    """``pylog serve``: a produced record set the broker refuses for its partition; ``code`` is
    the Kafka error code of the answer (CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_RECORD,
    OUT_OF_ORDER_SEQUENCE_NUMBER...)."""

    def __init__(self, code: int, message: str):
        self.code = code
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, str(self)))


class DuplicateBatchError(RecordSetError):
    """``pylog serve``: an idempotent producer's retry of a batch already appended; it is not
    appended again, and the answer carries the offset the batch got the first time."""

    def __init__(self, base_offset: int):
        super().__init__(0, f"a retry of the batch appended at offset {base_offset}")
        self.base_offset = base_offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.base_offset,))
