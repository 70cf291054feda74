"""How a process gets the codec's kernels: the interpreted copy for a short job, the compiled one
(from numba's cache, compiled under a lock) for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pylog.storage.codec import _kernels


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


@pytest.mark.subprocess
def test_a_short_job_never_loads_numba_and_a_long_one_switches_for_good() -> None:
    if _kernels.compiled() is None:
        pytest.skip("numba is not available (PYLOG_NO_JIT set or numba missing)")
    out = _child(
        """
        import sys
        from pylog.storage.codec import _kernels, records
        enc = records.encode([b"value"] * 50, key=[b"k"] * 50)
        got = records.decode(bytes(enc.buffer))
        assert got.records.column("value").to_pylist() == [b"value"] * 50
        assert "numba" not in sys.modules, "a short job imported numba"
        assert _kernels.active(_kernels.PYTHON_BUDGET + 1) is _kernels.compiled()
        assert _kernels.active(1) is _kernels.compiled(), "went back to the interpreted copy"
        many = records.encode([b"v"] * (_kernels.PYTHON_BUDGET + 1))  # compiled copy
        assert records.decode(bytes(many.buffer)).records.num_rows == _kernels.PYTHON_BUDGET + 1
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_an_explicit_choice_wins_over_the_budget() -> None:
    previous = _kernels.use("python")
    try:
        assert _kernels.active(10**9) is _kernels.python
    finally:
        _kernels.restore(previous)


@pytest.mark.subprocess
def test_a_signature_missing_from_the_cache_waits_for_the_process_compiling_it(tmp_path: Path) -> None:
    """Spark starts several Python workers at once: one compiles, the others wait on the cache
    directory's lock file and then load its result."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import fcntl, os, sys
                fd = os.open({str(tmp_path / _kernels.LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)
                fcntl.flock(fd, fcntl.LOCK_EX)
                print("held", flush=True)
                sys.stdin.readline()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        entered = threading.Event()

        def take() -> None:
            with _kernels._cache_lock(str(tmp_path)):
                entered.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not entered.wait(0.5), "took the lock another process holds"
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert entered.wait(60), "never got the lock after it was released"
        t.join(10)
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_reentrant_and_survives_a_directory_it_cannot_use(tmp_path: Path) -> None:
    with _kernels._cache_lock(str(tmp_path)), _kernels._cache_lock(str(tmp_path)):
        pass  # a compilation that compiles a helper takes it again
    blocker = tmp_path / "file"
    blocker.write_text("")
    with _kernels._cache_lock(str(blocker / "sub")):  # not a directory: no lock, no error
        pass
