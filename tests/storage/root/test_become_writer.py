"""Becoming the writer (storage/root/writer.py ``become_writer``): a step that fails after the
writer lock was taken releases it at once, so the same process (or another) can become the
writer once the cause is fixed, without waiting for the garbage collector."""

from __future__ import annotations

from pathlib import Path

import pytest

import pylog
from pylog.storage.errors import CorruptCheckpointError


def test_a_failed_become_writer_releases_the_lock(tmp_path: Path) -> None:
    root = pylog.open(tmp_path, lock_timeout=0)
    root.create_topic("t", partitions=1)
    root.close()
    checkpoint = tmp_path / "recovery-point-offset-checkpoint"
    checkpoint.write_bytes(b"garbage\n")
    first = pylog.open(tmp_path, lock_timeout=0)
    with pytest.raises(CorruptCheckpointError) as failed:  # (kept: its traceback holds the frames)
        first.create_topic("u", partitions=1)
    checkpoint.unlink()  # the cause fixed
    second = pylog.open(tmp_path, lock_timeout=0)
    second.create_topic("u", partitions=1)  # not refused by the lock of the failed attempt
    second.close()
    assert failed.value is not None
    assert pylog.open(tmp_path, read_only=True).topics() == ["t", "u"]
