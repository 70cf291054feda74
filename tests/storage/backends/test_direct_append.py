"""Appends written around the page cache (O_DIRECT): the sink's staged segments."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends import local
from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import StorageError, StorageIOError


def _direct(tmp: Path) -> LocalStorage:
    st_ = LocalStorage(tmp)
    f = st_.open_append("probe", direct=True)
    direct = isinstance(f, local._DirectAppend)
    f.close()
    if not direct:
        pytest.skip(f"the file system of {tmp} refuses O_DIRECT (pylog falls back to buffered appends there)")
    return st_


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 3 * local._BLOCK + 17), min_size=1, max_size=12),
    fsync_after=st.sets(st.integers(0, 11)),
)
def test_direct_appends_hold_every_byte_in_order(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[int], fsync_after: set[int]
) -> None:
    st_ = _direct(tmp_path_factory.mktemp("direct"))
    want = bytearray()
    f = st_.open_append("seg.log", direct=True)
    for i, n in enumerate(chunks):
        data = bytes((len(want) + k) % 251 for k in range(n))
        assert f.write(data) == n
        want += data
        assert f.size() == len(want)
        if i in fsync_after:
            f.fsync()  # every byte is in the file, the partial last block through the page cache
            assert st_.read("seg.log") == bytes(want)
    f.close()
    assert st_.read("seg.log") == bytes(want)
    g = st_.open_append("seg.log", direct=True)  # reopened mid-block: continues it
    assert g.size() == len(want)
    g.write(b"tail" * 1500)
    g.close()
    assert st_.read("seg.log") == bytes(want) + b"tail" * 1500


def test_a_direct_append_writes_more_than_its_buffer_and_truncates(tmp_path: Path) -> None:
    st_ = _direct(tmp_path)
    big = os.urandom(local._DIRECT_CHUNK * 2 + 12345)
    f = st_.open_append("a.log", direct=True)
    f.write(big[:100])
    f.write(big[100:])
    f.fsync()
    assert st_.read("a.log") == big
    f.truncate(local._BLOCK * 3 + 5)
    f.write(b"xyz")
    f.close()
    assert st_.read("a.log") == big[: local._BLOCK * 3 + 5] + b"xyz"


def test_a_failed_direct_write_names_the_file_and_the_file_takes_no_more(tmp_path: Path) -> None:
    st_ = _direct(tmp_path)
    f = st_.open_append("b.log", direct=True)
    f.write(b"x" * 10)
    os.close(f._fd)  # the descriptor is gone: the next write to disk fails like an I/O error
    f._fd = os.open(os.devnull, os.O_RDONLY)
    with pytest.raises(StorageIOError, match=r"b\.log"):
        f.write(b"y" * local._DIRECT_CHUNK)
    # blocks may have reached the file past what size() counts: nothing more is written
    for then in (lambda: f.write(b"z"), f.fsync, lambda: f.truncate(0)):
        with pytest.raises(StorageError, match=r"b\.log.*earlier write failed"):
            then()
    f.close()
    assert (tmp_path / "b.log").read_bytes() == b""
    with pytest.raises(StorageError, match=r"b\.log.*any more"):
        f.write(b"after close")


def test_a_file_system_refusing_direct_writes_gets_buffered_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some file systems accept O_DIRECT at open and refuse the writes (EINVAL)."""
    st_ = _direct(tmp_path)
    real = os.pwrite

    def refuse(fd: int, data: object, pos: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, pos)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwrite", refuse)
    data = os.urandom(3 * local._DIRECT_CHUNK + 999)
    f = st_.open_append("d.log", direct=True)
    f.write(data[:5000])
    f.write(data[5000:])
    f.fsync()
    f.close()
    assert (tmp_path / "d.log").read_bytes() == data


def test_short_writes_are_written_on_until_every_byte_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write may take fewer bytes than asked (a disk almost full, a signal): fsync must not
    return with bytes missing."""
    st_ = _direct(tmp_path)
    real = os.pwrite

    def short(fd: int, data: object, pos: int) -> int:
        view = memoryview(data)  # type: ignore[arg-type]
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:  # whole blocks, at most two at a time
            return real(fd, view[: 2 * local._BLOCK], pos)
        return real(fd, view[:10], pos)  # the buffered partial block: 10 bytes at a time

    monkeypatch.setattr(os, "pwrite", short)
    data = os.urandom(5 * local._BLOCK + 1234)
    f = st_.open_append("c.log", direct=True)
    f.write(data)
    f.fsync()
    assert (tmp_path / "c.log").read_bytes() == data
    f.close()


def test_files_written_at_once_share_one_buffer(tmp_path: Path) -> None:
    """A task appends to one staged file per partition: the aligned buffer is per thread, each
    file keeps only its partial last block (under 4 KiB)."""
    st_ = _direct(tmp_path)
    files = [st_.open_append(f"p{i}.log", direct=True) for i in range(20)]
    for i, f in enumerate(files):
        f.write(bytes([i]) * (local._DIRECT_CHUNK + 100 + i))
    assert all(len(f._tail) < local._BLOCK for f in files)
    for i, f in enumerate(files):
        f.close()
        assert (tmp_path / f"p{i}.log").read_bytes() == bytes([i]) * (local._DIRECT_CHUNK + 100 + i)
