"""`pylog describe` and `pylog verify` on real roots, healthy and damaged.

Healthy roots are checked on local disk and on S3 (``backend``, tests/conftest.py); the
damaged ones are damaged by editing files on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pylog
from pylog.cli import main
from pylog.storage.codec import records
from tests.conftest import Backend


def fill(root: pylog.Root) -> None:
    root.create_topic("events", partitions=2, config={"segment.bytes": 4096, "index.interval.bytes": 100})
    for i in range(40):
        root.append("events", [b"value-%04d" % i * 5] * 3, key=[b"k%d" % (i % 7)] * 3, timestamp=1000 + i)


@pytest.fixture
def root_dir(tmp_path: Path) -> Path:
    with pylog.open(tmp_path) as root:
        fill(root)
    return tmp_path


@pytest.fixture
def filled(backend: Backend) -> Backend:
    with backend.open() as root:
        fill(root)
    return backend


def test_describe_text_and_json(filled: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    args = [filled.url, *filled.cli_args()]
    assert main(["describe", *args]) == 0
    text = capsys.readouterr().out
    assert "topic events  partitions 2" in text and "segment.bytes=4096" in text
    assert "testing" not in text  # the credentials are never printed
    assert main(["describe", *args, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (t,) = info["topics"]
    assert info["clean_shutdown"] is True
    assert sum(p["log_end_offset"] for p in t["partitions"]) == 120
    assert all(len(p["segments"]) >= 1 for p in t["partitions"])
    assert t["config_overrides"]["segment.bytes"] == "4096"


def test_verify_healthy_root(filled: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    args = [filled.url, *filled.cli_args()]
    assert main(["verify", *args]) == 0
    assert capsys.readouterr().out.startswith("OK: checked")
    assert main(["verify", *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["checked"]["records"] == 120 and out["problems"] == []


def _first_segment(root_dir: Path) -> Path:
    return sorted((root_dir / "events-0").glob("*.log"))[0]


def test_verify_reports_a_bit_flip(root_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seg = _first_segment(root_dir)
    data = bytearray(seg.read_bytes())
    pos = int(records.decode(bytes(data)).batches.position[2])
    data[pos + 70] ^= 1
    seg.write_bytes(bytes(data))
    assert main(["verify", str(root_dir), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    (problem,) = [p for p in out["problems"] if p["file"].endswith(seg.name)]
    assert "CRC mismatch" in problem["message"] and f"byte {pos}" in problem["message"]


def test_verify_reports_bad_index_torn_tail_and_checkpoint(
    root_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seg = _first_segment(root_dir)
    index = seg.with_suffix(".index")
    raw = bytearray(index.read_bytes())
    assert len(raw) >= 16
    raw[4:8] = (int.from_bytes(raw[4:8], "big") + 1).to_bytes(4, "big")  # entry points mid-batch
    index.write_bytes(bytes(raw))
    with open(sorted((root_dir / "events-1").glob("*.log"))[-1], "ab") as f:
        f.write(b"\x00\x00\x00")
    (root_dir / "recovery-point-offset-checkpoint").write_text("7\n0\n")
    assert main(["verify", str(root_dir)]) == 1
    out = capsys.readouterr().out
    assert ".index" in out
    assert "3 invalid bytes at the end" in out
    assert "recovery-point-offset-checkpoint" in out and "version" in out


def test_bad_arguments(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("verify", "describe"):
        assert main([cmd, backend.child("missing").url, *backend.cli_args()]) == 1
        err = capsys.readouterr().err
        assert "missing" in err and ("no such directory" if backend.is_local else "no pylog root") in err
    assert main(["describe"]) == 2
    assert main([]) == 2


def test_describe_shows_consumer_lag(filled: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    from pylog.storage.root.consumers import write_consumer_offsets

    with filled.open() as root:
        write_consumer_offsets(root.storage, "my-query", {("events", 0): 10})
    args = [filled.url, *filled.cli_args()]
    assert main(["describe", *args, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (c,) = info["consumers"]
    ends = {p["partition"]: p["log_end_offset"] for p in info["topics"][0]["partitions"]}
    assert c["group"] == "my-query" and c["lag"] == ends[0] - 10 + ends[1]
    assert main(["describe", *args]) == 0
    out = capsys.readouterr().out
    assert "consumer group my-query: lag" in out
    assert "A Spark query commits a micro-batch's offsets when it plans its next micro-batch" in out


def test_describe_some_topics_only(filled: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    from pylog.storage.root.consumers import write_consumer_offsets

    with filled.open() as root:
        root.create_topic("other", 1)
        root.append("other", [b"x"])
        write_consumer_offsets(root.storage, "reads-other", {("other", 0): 0})
        write_consumer_offsets(root.storage, "reads-events", {("events", 0): 10})
    assert main(["describe", filled.url, "other", *filled.cli_args(), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [t["topic"] for t in info["topics"]] == ["other"]
    assert [(c["group"], c["lag"]) for c in info["consumers"]] == [("reads-other", 1)]
    assert main(["describe", filled.url, "events", "nope", *filled.cli_args()]) == 1
    err = capsys.readouterr().err
    assert "no topic 'nope'" in err and "its topics: events, other" in err
