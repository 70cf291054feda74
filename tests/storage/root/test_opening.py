"""Opening a root (storage/root/opening.py, and the local directory of backends/local.py):
what names no root directory, and a directory the writer lock cannot be created in, are
``PylogError`` s naming the path."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import pylog
from pylog import ConfigError, StorageError, StorageIOError
from pylog.storage.backends import local


def test_a_regular_file_is_not_a_root_directory(tmp_path: Path) -> None:
    """A file given as a root is named as a file, to writers and readers alike."""
    file = tmp_path / "notes.txt"
    file.write_text("not a root")
    for read_only in (False, True):
        with pytest.raises(StorageError, match=f"^{re.escape(str(file))}: is a file, not a root directory"):
            pylog.open(file, read_only=read_only)
    with pytest.raises(StorageError) as e:
        pylog.open(file / "root")  # a file among its parents: named, not a NotADirectoryError
    assert (
        str(e.value)
        == f"{file / 'root'}: cannot create the root directory: {file} is a file, not a directory"
    )
    assert file.read_text() == "not a root"


@pytest.mark.parametrize("path", ["", "file://"])
def test_an_empty_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """An empty path is refused: the current directory is never opened (or written to) as a root."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^path: '.*' is empty; name the root directory"):
        pylog.open(path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "named"),
    [(5, "got int 5"), (b"/tmp/root", "got bytes b'/tmp/root'"), (None, "got NoneType None")],
)
def test_a_path_that_is_not_a_str_or_pathlike_is_named(path: object, named: str) -> None:
    """A path of another type (bytes too) is refused naming its type and value."""
    with pytest.raises(ConfigError, match=f"^path must be a str or os.PathLike, {named}"):
        pylog.open(path)  # type: ignore[arg-type]


def _writes_fail_on_the_lock(root_dir: Path, why: str) -> None:
    root = pylog.open(root_dir)  # opening (and reading) needs no lock
    assert root.topics() == []
    with pytest.raises(StorageIOError) as e:
        root.create_topic("t")
    assert str(e.value).startswith(f"{root_dir / '.lock'}: cannot create the writer lock: ")
    assert why in str(e.value) and "open it with read_only=True" in str(e.value)
    assert isinstance(e.value, StorageError) and isinstance(e.value, OSError)
    root.close()
    with pylog.open(root_dir, read_only=True) as reader:  # as the message says
        assert reader.topics() == []


def test_a_read_only_file_system_is_named_on_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only mount made the first write fail with a bare ``OSError: [Errno 30]``.  The tests
    run as root, who may write a 0o555 directory, and may not mount one: ``os.open`` of the lock
    file raises EROFS as the kernel does on a read-only mount (the only thing simulated)."""
    real_open = os.open

    def read_only_fs(path: object, flags: int, *args: object) -> int:
        if str(path).endswith(f"{os.sep}.lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(local.os, "open", read_only_fs)
    _writes_fail_on_the_lock(
        tmp_path, f"the root directory {tmp_path} is read-only (a read-only file system)"
    )


@pytest.mark.subprocess
def test_a_directory_that_refuses_new_files_is_named_on_the_lock(tmp_path: Path) -> None:
    """The same for a real condition: an immutable directory (``chattr +i``), where even root may
    not create a file (EPERM)."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    root_dir = tmp_path / "immutable"
    root_dir.mkdir()
    made = subprocess.run(["chattr", "+i", str(root_dir)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a directory immutable here: {made.stderr.strip()}")
    try:
        _writes_fail_on_the_lock(root_dir, f"the root directory {root_dir} is not writable by this process")
    finally:
        subprocess.run(["chattr", "-i", str(root_dir)], check=True)
