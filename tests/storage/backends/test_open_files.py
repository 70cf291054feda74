"""File handles stay bounded whatever the number of partitions and segments: the
append handles of active segments are an LRU of :data:`local.MAX_OPEN_APPEND_FILES`, and a
``create_topic`` that fails (too many open files) leaves no topic behind."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylog
from pylog.storage.backends import local
from pylog.storage.errors import StorageError


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small_cache() -> Iterator[int]:
    previous = local.MAX_OPEN_APPEND_FILES
    local.set_max_open_files(16)
    try:
        yield 16
    finally:
        local.set_max_open_files(previous)


@pytest.fixture
def low_nofile() -> Iterator[None]:
    """RLIMIT_NOFILE a little above the descriptors open now (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + 48, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_many_partitions_hold_bounded_handles(tmp_path: Path, small_cache: int, low_nofile: None) -> None:
    before = open_fds()
    root = pylog.open(tmp_path)
    root.create_topic("t", partitions=200)
    assert open_fds() - before <= small_cache + 8
    for p in range(200):
        root.append("t", [b"v%d" % p], partition=p)
    assert open_fds() - before <= small_cache + 8
    for p in range(200):
        assert root.read_table("t", partitions=[p]).column("value").to_pylist() == [b"v%d" % p]
    root.close()
    assert open_fds() <= before + 2
    root = pylog.open(tmp_path)  # reopened: every record is there, appends continue
    for p in range(0, 200, 7):
        root.append("t", [b"w"], partition=p)
        assert root.read_table("t", partitions=[p]).column("value").to_pylist() == [b"v%d" % p, b"w"]
    assert open_fds() - before <= small_cache + 8
    root.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_many_segments_hold_bounded_handles(tmp_path: Path, small_cache: int, low_nofile: None) -> None:
    before = open_fds()
    root = pylog.open(tmp_path)
    root.create_topic("t", partitions=1, config={"segment.bytes": 200})
    for i in range(60):
        root.append("t", [b"x" * 80, b"y%d" % i], partition=0)
    assert len([n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log")]) >= 60
    assert open_fds() - before <= small_cache + 8
    root.close()
    root = pylog.open(tmp_path)
    root.append("t", [b"z"], partition=0)
    values = root.read_table("t", partitions=[0]).column("value").to_pylist()
    assert len(values) == 121 and values[-1] == b"z"
    assert open_fds() - before <= small_cache + 8
    root.close()


def test_evicted_handle_reopens_and_keeps_bytes(tmp_path: Path, small_cache: int) -> None:
    storage = local.LocalStorage(tmp_path)
    files = [storage.open_append(f"f{i}") for i in range(40)]
    for i, f in enumerate(files):
        f.write(b"a%d" % i)
    assert len(local.OPEN_FILES) <= small_cache
    for i, f in enumerate(files):
        f.write(b"b")
        f.fsync()
        assert f.size() == len(b"a%d" % i) + 1
    for i, f in enumerate(files):
        f.truncate(1)
        f.close()
        assert (tmp_path / f"f{i}").read_bytes() == b"a"
    with pytest.raises(StorageError):
        files[0].write(b"x")


def test_create_topic_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = pylog.open(tmp_path)
    real = local.LocalStorage.open_append
    calls = {"n": 0}

    def failing(self: local.LocalStorage, path: str, *, direct: bool = False) -> local.AppendFile:
        calls["n"] += 1
        if calls["n"] > 100:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(self.resolve(path)))
        return real(self, path, direct=direct)

    monkeypatch.setattr(local.LocalStorage, "open_append", failing)
    with pytest.raises(StorageError) as e:
        root.create_topic("t", partitions=60)
    message = str(e.value)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert f"too many open files (ulimit -n = {limit})" in message
    assert "free space" not in message and (".log" in message or ".index" in message)
    assert "t" not in root.topics()
    assert not [n for n in os.listdir(tmp_path) if n.startswith("t-")]
    monkeypatch.setattr(local.LocalStorage, "open_append", real)
    root.create_topic("t", partitions=60)  # a retry: no TopicExistsError
    root.append("t", [b"v"], partition=59)
    root.close()
    root = pylog.open(tmp_path)
    assert root.partitions("t") == 60
    assert root.read_table("t", partitions=[59]).column("value").to_pylist() == [b"v"]
    root.close()


def test_emfile_named_with_the_limit(tmp_path: Path) -> None:
    err = local.StorageIOError.wrap(OSError(errno.EMFILE, "Too many open files"), tmp_path / "x", "read it")
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    reason = f"too many open files (ulimit -n = {limit}) (errno 24)"
    assert str(err) == f"{tmp_path / 'x'}: cannot read it: {reason}"
