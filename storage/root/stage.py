"""Staging: what a writer prepares for a commit (a Spark task of the sink), per partition.

:func:`open_stager` gives the writer of one task's batches for one partition:

* on a storage that modifies files in place (a local disk), staged *segments* with their
  indexes (:mod:`pylog.storage.partition.staging`), which the commit links into the log
  (patch 8 bytes per batch and rename) or, below ``COPY_BELOW_BYTES``, copies into its
  active segment;
* elsewhere (object stores), one staged file of batches, which the commit copies; a small one
  can travel in the task's commit message instead (:meth:`FlatStager.finish` ``inline``).

Either way the result is a :class:`~pylog.storage.root.publish.StagedFile` to send to the
committer.  A stager first removes what an earlier run under the same name left, so a
replayed commit never publishes those rows twice (the Spark sink names each run of a task
uniquely, so that a task of a failed run still running cannot write into a new run's files).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from dataclasses import replace
from typing import Protocol

import numpy as np

from pylog.storage.backends.base import AppendFile, Storage
from pylog.storage.backends.local import LocalStorage
from pylog.storage.backends.objectstore.keys import INLINE_MAX
from pylog.storage.codec import batch as B
from pylog.storage.config import LogConfig
from pylog.storage.partition import staging
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


class _LogStager:
    """A stager that writes through a :class:`StagingLog` (``self._log``)."""

    _log: StagingLog

    @property
    def next_offset(self) -> int:
        return self._log.next_offset

    @property
    def size(self) -> int:
        return self._log.size

    def write(self, data: np.ndarray | bytes | memoryview, headers: B.BatchHeaders) -> None:
        self._log.append(data, headers)


class SegmentStager(_LogStager):
    """Staged segments with their indexes, linked into the log by the commit."""

    def __init__(
        self,
        storage: Storage,
        topic: str,
        partition: int,
        name: str,
        config: LogConfig,
        *,
        direct: bool = True,
    ):
        self.topic, self.partition, self.name = topic, partition, name
        directory = partition_dir(topic, partition)
        for old in storage.listdir(directory):  # an earlier run of this attempt
            if old == name or old.startswith(name + "."):
                storage.delete(f"{directory}/{old}")
        self._log = StagingLog(storage, directory, name, config, direct=direct)

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


class ObjectSegmentStager(_LogStager):
    """Staged segments with their indexes, written on this machine's disk and uploaded as
    objects when finished (object stores): the commit adopts the objects as the segments'
    files (:func:`staging.adopt`; nothing is downloaded or uploaded again).  A small staging
    can travel in the task's commit message instead, as one flat file of batches.  Uploads
    stream from the files: memory does not grow with the staging."""

    def __init__(
        self,
        storage: Storage,
        topic: str,
        partition: int,
        name: str,
        config: LogConfig,
        tmp_dir: str | None = None,
    ):
        self.topic, self.partition, self.name = topic, partition, name
        self._storage = storage
        self._dir = partition_dir(topic, partition)
        self._tmp = tempfile.mkdtemp(prefix="pylog-stage-", dir=tmp_dir)
        self._local = LocalStorage(self._tmp)
        self._local.makedirs(self._dir)
        self._log = StagingLog(self._local, self._dir, name, config)
        self._uploaded: list[str] = []
        # the objects outlive the commit (it adopts them): a re-run of this task attempt (a
        # restarted query replays a batch) must never overwrite them, so each run names its own
        self._token = secrets.token_hex(4)

    def finish(self, *, inline: bool = False) -> StagedFile:
        segs = self._log.finish()
        local = self._local
        try:
            if inline:  # the batches, numbered from 0 across the segments, in the message
                data = b"".join(local.read(staging.staged_log_path(self._dir, self.name, s)) for s in segs)
                return StagedFile(self.topic, self.partition, self.name, data)
            out = []
            for seg in segs:
                files, small = [], []
                for kind, path in zip(
                    staging.STAGED_KINDS, staging.staged_paths(self._dir, self.name, seg), strict=True
                ):
                    if not local.exists(path):
                        continue
                    if kind != "log" and local.size(path) <= INLINE_MAX:  # kept in the state anyway
                        small.append((kind, local.read(path)))
                        continue
                    remote = staging.unique_staged_path(path, self._token)
                    self._upload(remote, str(local.resolve(path)))
                    self._uploaded.append(remote)
                    files.append((remote.rsplit("/", 1)[-1], local.size(path)))
                out.append(
                    replace(seg, files=tuple(files), batches=self._log.batches(seg.base), inline=tuple(small))
                )
            return StagedFile(self.topic, self.partition, self.name, segments=tuple(out))
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _upload(self, remote: str, local_path: str) -> None:
        upload = getattr(self._storage, "upload_staged", None)
        if upload is not None:  # streamed from the file
            upload(remote, local_path)
        else:
            with open(local_path, "rb") as f:
                self._storage.write_atomic(remote, f.read())

    def abandon(self) -> None:
        for path in self._uploaded:
            self._storage.delete(path)
        shutil.rmtree(self._tmp, ignore_errors=True)


def open_stager(
    storage: Storage,
    topic: str,
    partition: int,
    name: str,
    config: LogConfig,
    tmp_dir: str | None = None,
    *,
    direct: bool = True,
) -> Stager:
    """The stager of staging ``name`` (see :func:`publish.stage_name`) for one partition;
    ``tmp_dir``: where an object store's staged segments are written before their upload
    (default: the system's temporary directory).  ``direct``: on local disk, staged segments
    are written around the page cache (``O_DIRECT``, see :class:`StagingLog`); False writes them
    through it, so that readers of the topic soon after the commit read them from memory."""
    if storage.writes_in_place:
        return SegmentStager(storage, topic, partition, name, config, direct=direct)
    if getattr(storage, "transactional", False):
        return ObjectSegmentStager(storage, topic, partition, name, config, tmp_dir)
    return FlatStager(storage, topic, partition, name)


__all__ = ["FlatStager", "ObjectSegmentStager", "SegmentStager", "Stager", "open_stager"]
