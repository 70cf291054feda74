"""Opening a pylog root from a local path or an fsspec URL (behind :func:`pylog.open`).

:func:`open_root` picks the storage of the root (local disk, or an object store through
:class:`~pylog.storage.backends.objectstore.storage.ObjectStorage`) and opens a
:class:`~pylog.storage.root.manager.Root` on it; :func:`open_staging` opens only the storage a
writer's tasks stage into.  What the root then reads, and the steps by which it becomes the
writer at its first change, are listed in order in :mod:`~pylog.storage.root.writer`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pylog.storage.backends.base import Storage
from pylog.storage.backends.local import LocalStorage
from pylog.storage.backends.objectstore.client import is_object_url
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.errors import ConfigError
from pylog.storage.root.manager import Root
from pylog.storage.root.rebase import MERGERS

__all__ = ["open_root", "open_staging"]


def open_root(
    path: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    read_only: bool = False,
    lock_timeout: float = 0.0,
    trust_known_s: float = 0.0,
) -> Root:
    """Open (creating if needed) a pylog root at a local path or an fsspec URL.

    Local disk: reading needs no lock; the first write takes the root's writer lock, and with
    ``lock_timeout`` > 0 waits that many seconds for another writer to finish.

    Object stores (``s3://bucket/prefix``, any fsspec filesystem with put-if-absent): every
    change is published atomically by one commit of the root's commit log; concurrent writers
    are safe (one that loses a race to a writer of other partitions re-bases its commit).
    ``trust_known_s``: start from the state this process confirmed newest at most that long
    ago, without a request (see :meth:`ObjectStorage.refresh`).
    ``storage_options`` go to fsspec (``endpoint_url``, ``key``, ``secret``,
    ``client_kwargs.region_name``, ``anon``...), plus pylog's ``pylog.*`` settings.

    ``path`` must name a directory (or a URL): an empty path, a regular file or something other
    than a ``str``/``os.PathLike`` is a :class:`ConfigError`/:class:`StorageError` naming it."""
    text = _path_text(path)
    if is_object_url(text):
        storage = ObjectStorage.open(
            text, dict(storage_options or {}), read_only=read_only, trust_known_s=trust_known_s
        )
        storage.mergers = dict(MERGERS)  # a race with a writer of other partitions is re-based
        return Root(storage, read_only=read_only, lock_timeout=lock_timeout)
    if storage_options:
        raise ConfigError(
            f"{text}: storage options apply to object-store URLs (s3://...), not to local paths"
        )
    return Root(
        LocalStorage(_local_path(text), create=not read_only), read_only=read_only, lock_timeout=lock_timeout
    )


def open_staging(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The storage a writer's tasks stage into (:func:`pylog.storage.root.stage.open_stager`),
    opened without reading the root's state: on an object store it costs no request (a task
    that knows its topics' partition counts and configs from the driver opens nothing else).
    Staging writes only the task's own staged files, outside the published state."""
    text = _path_text(path)
    if is_object_url(text):
        return ObjectStorage.open(text, dict(storage_options or {}), read_only=True, load=False)
    return LocalStorage(_local_path(text), create=False)


def _path_text(path: object) -> str:
    """``path`` (a ``str`` or ``os.PathLike``) as text, refusing what names no root: another
    type (``os.fspath`` would take ``bytes`` and raise a bare ``TypeError`` otherwise) and an
    empty path (which would open the current directory)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        raise ConfigError(f"path must be a str or os.PathLike, got {type(text).__name__} {text!r}")
    if not text or text == "file://":
        raise ConfigError(
            f"path: {text!r} is empty; name the root directory (or an object-store URL such as "
            "s3://bucket/prefix), '.' for the current directory"
        )
    return text


def _local_path(text: str) -> str:
    return text[len("file://") :] if text.startswith("file://") else text
