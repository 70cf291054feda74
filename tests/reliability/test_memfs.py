"""The power-loss file system model itself: what survives a kill and what survives a power cut."""

from __future__ import annotations

import random

import pytest

from pylog.storage.errors import LogLockedError, StorageError
from tests.reliability.memfs import Crash, MemStorage


def test_kill_keeps_everything_power_cut_keeps_only_what_was_fsynced() -> None:
    st = MemStorage()
    st.makedirs("d")
    st.fsync_dir("")
    f = st.open_append("d/a")
    f.write(b"synced")
    f.fsync()
    st.fsync_dir("d")
    f.write(b"+cache")
    assert st.kill().read("d/a") == b"synced+cache"
    assert st.power_cut().read("d/a") == b"synced"


def test_names_are_durable_only_after_the_directory_is_fsynced() -> None:
    st = MemStorage()
    st.makedirs("d")
    f = st.open_append("d/new")
    f.write(b"x")
    f.fsync()
    assert not st.power_cut().exists("d")  # the directory itself was never made durable
    st.fsync_dir("")
    assert st.power_cut().listdir("d") == []  # the file's name was never made durable
    st.fsync_dir("d")
    assert st.power_cut().read("d/new") == b"x"
    st.rename("d/new", "d/renamed")
    st.delete("d/renamed")
    cut = st.power_cut()
    assert cut.listdir("d") == ["new"]  # rename and delete undone
    st.fsync_dir("d")
    assert st.power_cut().listdir("d") == []


def test_write_atomic_leaves_old_or_new_at_every_crash_point() -> None:
    for k in range(1, 6):
        st = MemStorage()
        st.write_atomic("f", b"old")
        st.crash_after(k)
        with pytest.raises(Crash):
            st.write_atomic("f", b"new")
            st.fsync_dir("")  # one more step, so that every k crashes
        st.crash_after(None)
        st._dead = False
        for after in (st.kill(), st.power_cut()):
            assert after.read("f") in (b"old", b"new")
        if k >= 5:  # renamed and the directory fsynced
            assert st.power_cut().read("f") == b"new"


def test_a_crashed_process_does_nothing_more() -> None:
    st = MemStorage()
    st.crash_after(1)
    with pytest.raises(Crash):
        st.makedirs("a/b")
    with pytest.raises(Crash):
        st.exists("a")
    assert st.dead


def test_torn_tail_is_a_prefix_of_the_unsynced_bytes_or_zeros() -> None:
    rng = random.Random(7)
    seen = set()
    for _ in range(200):
        st = MemStorage()
        f = st.open_append("f")
        st.fsync_dir("")
        f.write(b"AAAA")
        f.fsync()
        f.write(b"BBBBBBBB")
        data = st.power_cut(rng, tear=1.0).read("f")
        assert data.startswith(b"AAAA") and len(data) > 4
        tail = data[4:]
        assert tail == b"B" * len(tail) or tail == bytes(len(tail))
        seen.add(tail[:1])
    assert seen == {b"B", b"\0"}


def test_open_handles_follow_renames_and_unlinks() -> None:
    st = MemStorage()
    f = st.open_append("a")
    st.rename("a", "b")
    f.write(b"x")
    assert st.read("b") == b"x"
    st.delete("b")
    f.write(b"y")  # writes to an unlinked inode, as a descriptor does
    assert not st.exists("b")


def test_lock_is_exclusive_and_paths_stay_inside_the_root() -> None:
    st = MemStorage()
    with st.lock(".lock"), pytest.raises(LogLockedError), st.lock(".lock"):
        pass
    with st.lock(".lock"):
        pass
    for bad in ("../x", "/abs", "a/../../b"):
        with pytest.raises(StorageError):
            st.exists(bad)
