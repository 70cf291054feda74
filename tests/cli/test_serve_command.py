"""``pylog serve --json``: where it listens, as one JSON object; while it runs it holds the
root's writer lock, so the CLI's topic and group deletions are refused, naming the holder."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pylog
from pylog.cli import main
from pylog.storage.root.consumers import write_consumer_offsets

pytestmark = pytest.mark.subprocess


def first_line(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, f"pylog serve did not start (status {proc.poll()})"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            data += os.read(proc.stdout.fileno(), 4096)
    return data.split(b"\n")[0].decode()


def test_serve_json_says_where_it_listens_and_its_lock_refuses_deletions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "root")
    with pylog.open(root) as r:
        r.create_topic("events")
        write_consumer_offsets(r.storage, "app", {("events", 0): 0})
    args = [sys.executable, "-m", "pylog", "serve", root, "--port", "0", "--json"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        info = json.loads(first_line(proc))
        assert info["host"] == "127.0.0.1" and info["port"] > 0 and info["root"].endswith("root")
        assert main(["delete-topic", root, "events"]) == 1
        assert "pylog delete-topic: error:" in capsys.readouterr().err
        assert main(["delete-group", root, "app", "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["error"]["type"] == "LogLockedError"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    with pylog.open(root, read_only=True) as r:
        assert r.topics() == ["events"]
