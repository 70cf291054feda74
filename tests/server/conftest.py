"""Fixtures of the ``pylog serve`` tests: a real server process over a root, on 127.0.0.1.

:class:`ServeProcess` starts ``python -m pylog serve ROOT --port 0`` and reads the port from its
first line of output (no fixed wait), stops it with SIGTERM (and checks the clean exit), and can
restart it over the same root.  The ``serve`` fixture gives a started one over a fresh local root;
``serve_factory`` makes more (an S3 root: pass ``storage_options``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0


class ServeProcess:
    """One ``pylog serve`` process over ``root`` (see the module docstring)."""

    def __init__(
        self,
        root: str,
        log_dir: Path,
        *,
        storage_options: dict[str, str] | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.root = root
        self.log_dir = log_dir
        self.storage_options = storage_options or {}
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.runs = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        args = [sys.executable, "-m", "pylog", "serve", self.root, "--port", "0"]
        args += ["--group-initial-rebalance-delay-ms", "0", *self.extra]
        for k, v in self.storage_options.items():
            args += ["-S", f"{k}={v}"]
        self.runs += 1
        self.stderr_path = self.log_dir / f"serve-{id(self)}-{self.runs}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.stderr_path, "wb") as stderr:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while b"\n" not in line:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.proc.kill()
                raise AssertionError(f"pylog serve did not start: {self.stderr_path.read_text()[-3000:]}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                line += chunk
        first = line.split(b"\n")[0].decode()
        assert "listening on" in first, first
        self.port = int(first.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
        return self

    def stop(self, *, check: bool = True) -> int:
        """SIGTERM, then wait for the exit; with ``check``, assert a clean one (status 0)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"pylog serve did not stop on SIGTERM: {self.log()[-3000:]}") from None
        if check:
            assert code == 0, f"pylog serve exited with {code}: {self.log()[-3000:]}"
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> ServeProcess:
        self.stop()
        return self.start()

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[ServeProcess] = []

    def make(root: str | None = None, **kw: Any) -> ServeProcess:
        s = ServeProcess(root or str(tmp_path / f"root{len(made)}"), tmp_path, **kw)
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.kill()


@pytest.fixture
def serve(serve_factory: Any) -> ServeProcess:
    """A started ``pylog serve`` over a fresh local root (``serve.root``)."""
    return serve_factory()
