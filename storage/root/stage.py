"""Staging: what a writer prepares for a commit (a Spark task of the sink), per partition.

:func:`open_stager` gives the writer of one task's batches for one partition:

* on a storage that modifies files in place (a local disk), staged *segments* with their
  indexes (:mod:`pylog.storage.partition.staging`), which the commit links into the log
  (patch 8 bytes per batch and rename) or, below ``COPY_BELOW_BYTES``, copies into its
  active segment;
* elsewhere (object stores), one staged file of batches, which the commit copies; a small one
  can travel in the task's commit message instead (:meth:`FlatStager.finish` ``inline``).

Either way the result is a :class:`~pylog.storage.root.publish.StagedFile` to send to the
committer.  A stager first removes what an earlier run of the same task attempt left (a
restarted query numbers its attempts from 0 again), so a replayed commit never publishes
those rows twice.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from pylog.storage.backends.fs import AppendFile, Storage
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.partition.staging import StagingLog
from pylog.storage.root.metadata import partition_dir
from pylog.storage.root.publish import StagedFile


class Stager(Protocol):
    topic: str
    partition: int

    @property
    def next_offset(self) -> int:
        """The relative offset the next batches written must start at."""

    @property
    def size(self) -> int:
        """Bytes staged so far."""

    def write(self, data: np.ndarray | bytes | memoryview, headers: B.BatchHeaders) -> None:
        """Stage encoded batches numbered from :attr:`next_offset` (``headers`` positions
        relative to ``data``)."""

    def finish(self, *, inline: bool = False) -> StagedFile:
        """Make the staged data durable; what to send to the committer."""

    def abandon(self) -> None:
        """Remove what was staged (a failed task)."""


class SegmentStager:
    """Staged segments with their indexes, linked into the log by the commit."""

    def __init__(self, storage: Storage, topic: str, partition: int, name: str, config: LogConfig):
        self.topic, self.partition, self.name = topic, partition, name
        directory = partition_dir(topic, partition)
        for old in storage.listdir(directory):  # an earlier run of this attempt
            if old == name or old.startswith(name + "."):
                storage.delete(f"{directory}/{old}")
        self._log = StagingLog(storage, directory, name, config)

    @property
    def next_offset(self) -> int:
        return self._log.next_offset

    @property
    def size(self) -> int:
        return self._log.size

    def write(self, data: np.ndarray | bytes | memoryview, headers: B.BatchHeaders) -> None:
        self._log.append(data, headers)

    def finish(self, *, inline: bool = False) -> StagedFile:
        segs = self._log.finish()
        return StagedFile(self.topic, self.partition, self.name, segments=tuple(segs))

    def abandon(self) -> None:
        self._log.abandon()


class FlatStager:
    """One file of batches (object stores), copied by the commit."""

    def __init__(self, storage: Storage, topic: str, partition: int, name: str):
        self.topic, self.partition, self.name = topic, partition, name
        self._storage = storage
        self._path = f"{partition_dir(topic, partition)}/{name}"
        self._file: AppendFile = storage.open_append(self._path)
        if self._file.size():  # an earlier run of this attempt: start afresh
            self._file.truncate(0)
        self._next = 0

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def size(self) -> int:
        return self._file.size()

    def write(self, data: np.ndarray | bytes | memoryview, headers: B.BatchHeaders) -> None:
        if len(headers):
            view = memoryview(data.data if isinstance(data, np.ndarray) else data).cast("B")
            lo = int(headers.position[0])
            self._file.write(view[lo : lo + int(headers.size.sum())])
            self._next = int(headers.last_offset[-1]) + 1

    def finish(self, *, inline: bool = False) -> StagedFile:
        detach = getattr(self._file, "detach", None)
        if inline and detach is not None:  # the bytes travel in the commit message: no object
            return StagedFile(self.topic, self.partition, self.name, detach())
        self._file.close()
        return StagedFile(self.topic, self.partition, self.name)

    def abandon(self) -> None:
        detach = getattr(self._file, "detach", None)
        if detach is not None:
            detach()
        else:
            self._file.close()
        self._storage.delete(self._path)


def open_stager(storage: Storage, topic: str, partition: int, name: str, config: LogConfig) -> Stager:
    """The stager of staging ``name`` (see :func:`publish.stage_name`) for one partition."""
    if storage.writes_in_place:
        return SegmentStager(storage, topic, partition, name, config)
    return FlatStager(storage, topic, partition, name)


__all__ = ["FlatStager", "SegmentStager", "Stager", "open_stager"]
