"""Object stores through fsspec: immutable objects, ranged reads, put-if-absent.

An :class:`ObjectClient` is one fsspec filesystem plus a base prefix (``s3://bucket/prefix``).
It offers only what pylog's object-store mode needs, each with pylog's rules:

========================  ==================================================================
operation                 rule
========================  ==================================================================
``get(key, start, end)``  ranged GET; never a whole-object download to read a few bytes
``put(key, data)``        objects are written once, under names never used before
``create(key, data)``     put-if-absent (``If-None-Match: *``).  True when *our* object is
                          there: a 412 after a lost response or an SDK retry is recognised
                          by reading the object back (its bytes hold the writer's token)
``list(prefix)``          always from the server (fsspec's listing cache is bypassed)
``delete(keys)``          tolerant of keys already gone
========================  ==================================================================

Transient failures (connection refused or reset, timeouts, 5xx, 409 conflicts of concurrent
conditional writes) are retried with backoff until ``retry_timeout_s`` has passed, so a server
that restarts in the middle of a publish delays it instead of failing it.

Storage options (endpoint, credentials, region, anonymous access...) go to the fsspec
filesystem, except pylog's own ``pylog.*`` keys (:mod:`.options` reads both); they are never
logged.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pylog.storage.backends.objectstore.options import PYLOG_OPTIONS, redact, split_options
from pylog.storage.errors import (
    CommitOutcomeUnknownError,
    ConditionalWritesUnsupportedError,
    ConfigError,
    ObjectStoreError,
)
from pylog.storage.faults import Faults

log = logging.getLogger("pylog.storage")

T = TypeVar("T")

PROBES = "_pylog/probe/"
"""Where :meth:`ObjectClient.probe` creates (and at once deletes) its test objects."""


_PERMANENT = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
    KeyError,
)


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, _PERMANENT):
        return False
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
        return False
    text = f"{type(e).__name__} {e}"
    if "ConditionalRequestConflict" in text or "409" in text:
        return True
    if isinstance(e, (ConnectionError, TimeoutError, OSError)):
        return True
    return any(
        w in text
        for w in (
            "EndpointConnectionError",
            "ConnectionClosed",
            "ReadTimeout",
            "ConnectTimeout",
            "ServiceUnavailable",
            "SlowDown",
            "InternalError",
            "ClientConnector",
        )
    )


UPLOAD_PART_BYTES = 16 << 20
"""Part size of a streamed multipart upload to S3 (a staged segment; at least 5 MiB)."""
UPLOAD_CONCURRENCY = 4
"""Parts of one streamed upload in flight at once (so at most 64 MiB of it in memory)."""


class RequestCounter:
    """Counts requests by kind (benchmarks and tests)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _BlockCache:
    """Whole small immutable objects (indexes, segments just read), LRU, bounded in bytes.
    Objects are never modified, so a cached copy is never stale."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, k: tuple[str, str]) -> bytes | None:
        with self._lock:
            v = self._items.get(k)
            if v is not None:
                self._items.move_to_end(k)
            return v

    def put(self, k: tuple[str, str], v: bytes) -> None:
        if len(v) > self.max_bytes // 8:
            return
        with self._lock:
            if k in self._items:
                return
            self._items[k] = v
            self._bytes += len(v)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


_CACHE = _BlockCache()
_PROBED: set[str] = set()
_PROBE_LOCK = threading.Lock()


class ObjectClient:
    """Objects under one base URL, addressed by keys relative to it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        import fsspec

        fs_kwargs, own = split_options(storage_options)
        self.url = url.rstrip("/")
        self.retry_timeout_s = float(own["retry_timeout_s"])
        self.file_delete_delay_ms = int(own["file_delete_delay_ms"])
        self.read_ahead_bytes = int(own["read_ahead_bytes"])
        fs_kwargs.setdefault("use_listings_cache", False)  # coordination must never see a stale listing
        try:
            self.fs, base = fsspec.core.url_to_fs(self.url, **fs_kwargs)
        except (ImportError, ValueError, TypeError) as e:
            raise ConfigError(
                f"{self.url}: cannot open this storage ({e}); storage options given: "
                f"{sorted(redact(storage_options or {}))}"
            ) from e
        self.base = base.rstrip("/")
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.requests = RequestCounter()
        self.faults = Faults()  # its conditional create, for fault injection (pylog.storage.faults)

    def __repr__(self) -> str:
        return f"ObjectClient({self.url!r})"

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    # ------------------------------------------------------------------ retries

    def _retry(self, what: str, key: str, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_timeout_s
        delay = 0.05
        while True:
            try:
                return fn()
            except Exception as e:
                if not _is_transient(e) or time.monotonic() + delay > deadline:
                    if isinstance(e, _PERMANENT):
                        raise
                    raise ObjectStoreError(f"{self.url}/{key}: {what} failed: {type(e).__name__}: {e}") from e
                log.info("%s/%s: %s failed (%s); retrying in %.2fs", self.url, key, what, e, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------------ operations

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object (one ranged GET)."""
        self.requests.add("get")
        p = self.path(key)
        if start is None and end is None and self.protocol in ("s3", "s3a"):
            # one GET (s3fs would HEAD first to split a whole-object read into parallel ranges)
            def fetch() -> bytes:
                return bytes(self.fs.cat_file(p, max_concurrency=1))
        else:

            def fetch() -> bytes:
                return bytes(self.fs.cat_file(p, start=start, end=end))

        try:
            data = self._retry("read", key, fetch)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{self.url}/{key}: no such object") from e
        return bytes(data)

    def get_many(self, keys: list[str]) -> dict[str, bytes | None]:
        """Whole objects, fetched concurrently (one GET each); None for a missing one."""
        if len(keys) == 1:
            try:
                return {keys[0]: self.get(keys[0])}
            except FileNotFoundError:
                return {keys[0]: None}
        self.requests.add("get", len(keys))
        paths = {self.path(k): k for k in keys}

        def fetch() -> dict[str, bytes | None]:
            results = self._cat_files(list(paths))
            out: dict[str, bytes | None] = {}
            for (_, k), v in zip(paths.items(), results, strict=True):
                if isinstance(v, FileNotFoundError):
                    out[k] = None
                elif isinstance(v, BaseException):
                    raise v  # retried when transient
                else:
                    out[k] = bytes(v)
            return out

        return self._retry("read", keys[0], fetch)

    def _cat_files(self, paths: list[str]) -> list[bytes | BaseException]:
        """Whole objects at once: concurrent GETs on an async filesystem (s3fs), with neither a
        HEAD nor a listing first (fsspec's ``cat`` of several paths expands them)."""
        if getattr(self.fs, "async_impl", False):
            import asyncio

            from fsspec.asyn import sync

            kwargs = {"max_concurrency": 1} if self.protocol in ("s3", "s3a") else {}  # no HEAD first

            async def gather() -> list[Any]:
                return await asyncio.gather(
                    *(self.fs._cat_file(p, **kwargs) for p in paths), return_exceptions=True
                )

            return list(sync(self.fs.loop, gather))
        out: list[bytes | BaseException] = []
        for p in paths:
            try:
                out.append(self.fs.cat_file(p))
            except Exception as e:
                out.append(e)
        return out

    def remember(self, key: str, data: bytes) -> None:
        """Put an object this process just wrote into the cache (it is what readers ask next)."""
        _CACHE.put((self.url, key), data)

    def get_cached(self, key: str, size: int) -> bytes:
        """A whole (small, immutable) object, through the process-wide cache."""
        ck = (self.url, key)
        data = _CACHE.get(ck)
        if data is None:
            data = self.get(key) if size else b""
            _CACHE.put(ck, data)
        return data

    def put(self, key: str, data: bytes) -> None:
        self.requests.add("put")
        self._retry("write", key, lambda: self.fs.pipe_file(self.path(key), bytes(data)))

    def put_file(self, key: str, local_path: str) -> None:
        """Upload a local file, streamed: memory does not grow with the file (on S3, multipart
        parts of :data:`UPLOAD_PART_BYTES`, :data:`UPLOAD_CONCURRENCY` at a time)."""
        self.requests.add("put")
        kwargs: dict[str, int] = {}
        if self.protocol in ("s3", "s3a"):
            kwargs = {"chunksize": UPLOAD_PART_BYTES, "max_concurrency": UPLOAD_CONCURRENCY}
        self._retry("write", key, lambda: self.fs.put_file(local_path, self.path(key), **kwargs))

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Upload several objects concurrently (fsspec batches them)."""
        batch = {self.path(k): bytes(v) for k, v in items}
        if not batch:
            return
        self.requests.add("put", len(batch))
        self._retry("write", next(iter(batch)), lambda: self.fs.pipe(batch))

    def _create_once(self, key: str, data: bytes) -> None:
        p = self.path(key)
        if self.protocol in ("s3", "s3a"):
            self.fs.pipe_file(p, data, mode="create")
        else:  # generic fsspec: exclusive open ("x" mode); the probe proves it is honoured
            with self.fs.open(p, "xb") as f:
                f.write(data)

    def create(self, key: str, data: bytes) -> bool:
        """Put-if-absent.  True if the object now holds ``data`` (created by this call, even
        when the response was lost and a retry saw 412), False if another writer's object is
        there."""
        deadline = time.monotonic() + self.retry_timeout_s
        delay = 0.05
        while True:
            self.requests.add("create")
            try:
                self._create_once(key, data)
                self.faults.step("created")
                return True
            except FileExistsError:
                pass
            except Exception as e:
                if not _is_transient(e) or time.monotonic() + delay > deadline:
                    # the request may still have landed: look before reporting a failure
                    try:
                        return self.get(key) == data
                    except FileNotFoundError:
                        pass
                    except Exception as again:
                        raise CommitOutcomeUnknownError(
                            f"{self.url}/{key}: conditional create failed ({type(e).__name__}: {e}) and "
                            f"reading it back failed too ({type(again).__name__}); the change may or may "
                            "not be published: look before retrying it"
                        ) from e
                    raise ObjectStoreError(
                        f"{self.url}/{key}: conditional create failed: {type(e).__name__}: {e}"
                    ) from e
                log.info("%s/%s: conditional create failed (%s); checking, then retrying", self.url, key, e)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
            # 412 (or an ambiguous failure): is the object there, and is it ours?
            try:
                existing = self.get(key)
            except FileNotFoundError:
                continue  # it did not land: try again
            return existing == data

    def list(self, prefix: str, start_after: str | None = None) -> dict[str, tuple[int, float, str]]:
        """Keys under ``prefix`` (recursively) with (size, modification time, etag), from the
        server; with ``start_after``, only keys sorting after that key."""
        self.requests.add("list")
        p = self.path(prefix).rstrip("/")

        def find() -> dict[str, Any]:
            if self.protocol in ("s3", "s3a"):
                return self._list_s3(p, None if start_after is None else self.path(start_after))
            self.fs.invalidate_cache(p)
            try:
                return dict(self.fs.find(p, detail=True, withdirs=False))
            except FileNotFoundError:
                return {}

        found = self._retry("list", prefix, find)
        out: dict[str, tuple[int, float, str]] = {}
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            mtime = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
            if hasattr(mtime, "timestamp"):
                mtime = mtime.timestamp()
            key = _relative(path, self.base)
            if start_after is not None and key <= start_after:
                continue
            etag = str(info.get("ETag") or info.get("etag") or "")
            out[key] = (int(info.get("size") or 0), float(mtime), etag)
        return out

    def _list_s3(self, p: str, start_after: str | None = None) -> dict[str, Any]:
        """ListObjectsV2 pages straight from the server (s3fs's ``find`` adds a HEAD and a second
        listing when a prefix is empty)."""
        bucket, key, _ = self.fs.split_path(p)
        prefix = f"{key}/" if key else ""
        out: dict[str, Any] = {}
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if start_after is not None:
            kwargs["StartAfter"] = self.fs.split_path(start_after)[1]
        while True:
            resp = self.fs.call_s3("list_objects_v2", **kwargs)
            for o in resp.get("Contents", []):
                out[f"{bucket}/{o['Key']}"] = {
                    "size": o["Size"],
                    "LastModified": o["LastModified"],
                    "ETag": o.get("ETag", ""),
                }
            if not resp.get("IsTruncated"):
                return out
            self.requests.add("list")
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def delete(self, keys: Iterable[str]) -> None:
        paths = [self.path(k) for k in keys]
        if not paths:
            return
        self.requests.add("delete", (len(paths) + 999) // 1000)  # DeleteObjects: 1000 keys a request

        def rm() -> None:
            try:
                self.fs.rm(paths)
            except FileNotFoundError:
                for p in paths:  # some were gone already: delete the rest one by one
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(p)

        self._retry("delete", paths[0], rm)

    def abort_stale_uploads(self, older_than_s: float, now_s: float | None = None) -> int:
        """Abort multipart uploads under the base begun ``older_than_s`` ago or earlier (a writer
        that died in the middle of a large upload leaves an invisible, billed upload behind).
        S3 only; returns how many were aborted."""
        if self.protocol not in ("s3", "s3a"):
            return 0
        now = time.time() if now_s is None else now_s
        bucket, key, _ = self.fs.split_path(self.base)
        self.requests.add("list")
        resp = self._retry(
            "list uploads",
            "",
            lambda: self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{key}/" if key else ""),
        )
        aborted = 0
        for up in resp.get("Uploads", []):
            if now - up["Initiated"].timestamp() < older_than_s:
                continue
            self.requests.add("delete")
            with contextlib.suppress(FileNotFoundError):
                self.fs.call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]
                )
            aborted += 1
        return aborted

    # ------------------------------------------------------------------ probe

    def probe(self) -> None:
        """Prove that the target honours put-if-absent (a second create of one key must fail),
        once per process and URL; raise :class:`ConditionalWritesUnsupportedError` otherwise."""
        with _PROBE_LOCK:
            if self.url in _PROBED:
                return
        key = f"{PROBES}{uuid.uuid4().hex}"
        try:
            first = self.create(key, b"first")
            second = self.create(key, b"second")
        finally:
            try:
                self.delete([key])
            except Exception:
                log.info("%s/%s: could not delete the probe object", self.url, key)
        if not first or second:
            raise ConditionalWritesUnsupportedError(
                f"{self.url}: this storage does not honour conditional creates (If-None-Match: *): a second "
                "create of the same object succeeded, so concurrent writers could overwrite each other's "
                "commits. pylog refuses to write here; use a store with conditional writes (AWS S3, or a "
                "compatible server that implements them) or a local path"
            )
        with _PROBE_LOCK:
            _PROBED.add(self.url)


def _relative(path: str, base: str) -> str:
    path = path.strip("/")
    base = base.strip("/")
    if base and path.startswith(base + "/"):
        return path[len(base) + 1 :]
    return path


def is_object_url(path: str) -> bool:
    """True for fsspec URLs that are not local files (``s3://``, ``gs://``, ``memory://``...)."""
    return "://" in path and not path.startswith("file://")


__all__ = [
    "PROBES",
    "PYLOG_OPTIONS",
    "CommitOutcomeUnknownError",
    "ConditionalWritesUnsupportedError",
    "ObjectClient",
    "ObjectStoreError",
    "RequestCounter",
    "is_object_url",
    "redact",
    "split_options",
]
