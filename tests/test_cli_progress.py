"""The ``pylog`` commands' progress displays: drawn on a terminal, nothing when piped or with
``--json``, and gone when the command ends."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

import pylog
from pylog.cli.progress import BytesProgress, ItemProgress

pytestmark = pytest.mark.subprocess  # the progress display on a real terminal, in a child


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_drawn_on_a_terminal_and_removed_at_the_end() -> None:
    console, out = terminal()
    with BytesProgress(console=console) as progress:
        assert progress.active
        progress("events-0", 5 << 20, 10 << 20)
        progress("events-1", 1 << 20, 4 << 20)  # the next log: its own total
    drawn = out.getvalue()
    assert "events-1" in drawn and "25%" in drawn and "4.2 MB" in drawn
    console, out = terminal()
    with ItemProgress(unit="segments", console=console) as items:
        assert items.callback is items
        for name in ("t-0/00000000000000000000.log", "t-0/00000000000000000042.log"):
            items(name)
    assert "2 segments" in out.getvalue() and "00000000000000000042.log" in out.getvalue()


def test_nothing_when_not_a_terminal_or_disabled() -> None:
    piped = io.StringIO()
    for console in (Console(file=piped), terminal()[0]):
        enabled = not console.is_terminal  # piped, or a terminal with the display turned off
        with BytesProgress(console=console, enabled=enabled) as progress:
            assert not progress.active
            progress("events-0", 5, 10)
        with ItemProgress(console=console, enabled=enabled) as items:
            assert items.callback is None
            items("events-0/00000000000000000000.log")
    assert piped.getvalue() == ""


def test_commands_write_only_their_output_when_piped(tmp_path: Path) -> None:
    root_dir = tmp_path / "root"
    with pylog.open(root_dir) as root:
        root.create_topic("c", partitions=1, config={"cleanup.policy": "compact", "segment.bytes": 4096})
        for v in range(5):
            keys = [b"k%d" % (i % 10) for i in range(100)]
            root.append("c", pa.table({"key": keys, "value": [b"v%d" % v] * 100}))
    for args in (["compact", "--force"], ["verify"], ["compact", "--force", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "pylog", *args, str(root_dir)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""  # no progress drawn into a pipe
        assert "\r" not in proc.stdout and "\x1b" not in proc.stdout
    assert json.loads(proc.stdout)["cleaning"] == []  # compacted by the first run already
