"""`pylog create-topic / produce / consume / recover`: round trips, follow mode, bad input."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylog.cli import main


def run(argv: list[str], stdin: str = "", monkeypatch: pytest.MonkeyPatch | None = None) -> int:
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return main(argv)


records_st = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.one_of(st.none(), st.binary(max_size=12)),
            "value": st.one_of(st.none(), st.binary(max_size=40)),
            "headers": st.lists(
                st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=2
            ),
            "timestamp": st.integers(0, 2**41),
        }
    ),
    min_size=1,
    max_size=25,
)


def _line(r: dict) -> str:
    import base64

    def field(name: str) -> dict:
        v = r[name]
        return {name: None} if v is None else {f"{name}_b64": base64.b64encode(v).decode()}

    hs = [[k, None if v is None else {"b64": base64.b64encode(v).decode()}] for k, v in r["headers"]]
    return json.dumps({**field("key"), **field("value"), "headers": hs, "timestamp": r["timestamp"]})


def _decode(obj: dict, name: str) -> bytes | None:
    import base64

    if f"{name}_b64" in obj:
        return base64.b64decode(obj[f"{name}_b64"])
    return None if obj[name] is None else obj[name].encode()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=records_st)
def test_produce_consume_round_trip_is_exact(
    tmp_path_factory: pytest.TempPathFactory,
    recs: list,
) -> None:
    root = str(tmp_path_factory.mktemp("r"))
    assert main(["create-topic", root, "t", "--partitions", "1"]) == 0
    src = Path(root) / "in.jsonl"
    src.write_text("\n".join(_line(r) for r in recs) + "\n")
    assert main(["produce", root, "t", "--file", str(src)]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["consume", root, "t"]) == 0
    got = [json.loads(line) for line in out.getvalue().split("\n") if line]  # not splitlines(): U+0085
    assert [g["offset"] for g in got] == list(range(len(recs)))
    for g, r in zip(got, recs, strict=True):
        assert _decode(g, "key") == r["key"] and _decode(g, "value") == r["value"]
        assert g["timestamp"] == r["timestamp"]
        hs = [
            (
                k,
                None
                if v is None
                else (v.encode() if isinstance(v, str) else __import__("base64").b64decode(v["b64"])),
            )
            for k, v in g["headers"]
        ]
        assert hs == r["headers"]


def test_kv_and_value_formats_offsets_and_timestamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path)
    assert main(["create-topic", root, "t", "--partitions", "2"]) == 0
    assert run(["produce", root, "t", "--format", "kv"], "k1\tv1\nk2\tv2\nk1\tv3\n", monkeypatch) == 0
    assert run(["produce", root, "t", "--format", "value", "--partition", "1"], "plain\n", monkeypatch) == 0
    capsys.readouterr()
    assert main(["consume", root, "t", "--format", "kv", "--partition", "0", "--partition", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(["k1\tv1", "k2\tv2", "k1\tv3", "\tplain"])
    assert main(["consume", root, "t", "--offset", "1", "--format", "value", "--max-messages", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_bad_input_is_reported_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path)
    assert main(["create-topic", root, "t"]) == 0
    assert main(["create-topic", root, "t"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["create-topic", root, "t", "--if-not-exists"]) == 0
    assert main(["create-topic", root, "bad/name"]) == 1
    assert main(["create-topic", root, "x", "--config", "nonsense"]) == 2
    assert main(["create-topic", root, "x", "--config", "segment.bytes=abc"]) == 1
    assert "segment.bytes" in capsys.readouterr().err
    assert run(["produce", root, "t"], '{"value": "ok"}\nnot json\n', monkeypatch) == 1
    assert "line 2" in capsys.readouterr().err
    assert run(["produce", root, "nope"], '{"value": "x"}\n', monkeypatch) == 1
    assert "unknown topic 'nope'" in capsys.readouterr().err
    assert main(["consume", root, "t", "--partition", "3"]) == 1
    assert "out of range" in capsys.readouterr().err


def test_consume_follow_sees_new_records(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert main(["create-topic", root, "t"]) == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pylog",
            "consume",
            root,
            "t",
            "--follow",
            "--poll-interval",
            "0.1",
            "--max-messages",
            "3",
            "--format",
            "value",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        for v in ("a", "b", "c"):
            p = subprocess.run(
                [sys.executable, "-m", "pylog", "produce", root, "t", "--format", "value"],
                input=v + "\n",
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert p.returncode == 0, p.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert out.splitlines() == ["a", "b", "c"], err


def test_recover_after_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pylog

    root = pylog.open(tmp_path)
    root.create_topic("t", config={"segment.bytes": 1024})
    for i in range(30):
        root.append("t", [b"r%02d" % i] * 3)
    seg = root.log("t", 0).active
    root._writer.close()  # type: ignore[union-attr]  # crash: no clean-shutdown marker
    with open(tmp_path / seg.log_path, "ab") as f:
        f.write(b"\x01" * 50)
    assert main(["recover", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (log,) = report["logs"]
    assert log["truncated_bytes"] == 50 and log["lost_bytes"] == 50
    assert main(["verify", str(tmp_path)]) == 0
