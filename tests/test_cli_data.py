"""`pylog create-topic / produce / consume / recover`: round trips, follow mode, bad input.

Tests taking ``backend`` run on local disk and on S3, with ``--storage-option`` arguments
(tests/conftest.py); ``recover`` after a crash is about files on disk."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylog.cli import main
from tests.conftest import Backend


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
    backend: Backend,
    tmp_path_factory: pytest.TempPathFactory,
    recs: list,
) -> None:
    root, opts = backend.child(uuid.uuid4().hex[:8]).url, backend.cli_args()  # a fresh root per example
    assert main(["create-topic", root, *opts, "t", "--partitions", "1"]) == 0
    src = tmp_path_factory.mktemp("in") / "in.jsonl"
    src.write_text("\n".join(_line(r) for r in recs) + "\n")
    assert main(["produce", root, *opts, "t", "--file", str(src)]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["consume", root, *opts, "t"]) == 0
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
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root, opts = backend.url, backend.cli_args()
    assert main(["create-topic", root, *opts, "t", "--partitions", "2"]) == 0
    produce, consume = ["produce", root, *opts, "t"], ["consume", root, *opts, "t"]
    assert run([*produce, "--format", "kv"], "k1\tv1\nk2\tv2\nk1\tv3\n", monkeypatch) == 0
    assert run([*produce, "--format", "value", "--partition", "1"], "plain\n", monkeypatch) == 0
    capsys.readouterr()
    assert main([*consume, "--format", "kv", "--partition", "0", "--partition", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(["k1\tv1", "k2\tv2", "k1\tv3", "\tplain"])
    assert main([*consume, "--offset", "1", "--format", "value", "--max-messages", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    t0 = int(time.time() * 1000) - 60_000
    assert main([*consume, "--from-timestamp", str(t0), "--format", "value"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["plain", "v1", "v2", "v3"]


def test_bad_input_is_reported_with_its_line(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root, opts = backend.url, backend.cli_args()
    assert main(["create-topic", root, *opts, "t"]) == 0
    assert main(["create-topic", root, *opts, "t"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["create-topic", root, *opts, "t", "--if-not-exists"]) == 0
    assert main(["create-topic", root, *opts, "bad/name"]) == 1
    assert main(["create-topic", root, *opts, "x", "--config", "nonsense"]) == 2
    assert main(["create-topic", root, *opts, "x", "--config", "segment.bytes=abc"]) == 1
    assert "segment.bytes" in capsys.readouterr().err
    assert run(["produce", root, *opts, "t"], '{"value": "ok"}\nnot json\n', monkeypatch) == 1
    assert "line 2" in capsys.readouterr().err
    assert run(["produce", root, *opts, "nope"], '{"value": "x"}\n', monkeypatch) == 1
    assert "unknown topic 'nope'" in capsys.readouterr().err
    assert main(["consume", root, *opts, "t", "--partition", "3"]) == 1
    assert "out of range" in capsys.readouterr().err
    assert main(["create-topic", root, *opts, "y", "--storage-option", "no-equals-sign"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.subprocess
def test_consume_follow_sees_new_records(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower in its own process sees what a writer (this process) appends meanwhile."""
    root, opts = backend.url, backend.cli_args()
    assert main(["create-topic", root, *opts, "t"]) == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pylog",
            "consume",
            root,
            *opts,
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
            assert run(["produce", root, *opts, "t", "--format", "value"], v + "\n", monkeypatch) == 0
            time.sleep(0.2)
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


def test_json_output_of_create_topic_produce_and_consume(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, opts = backend.url, backend.cli_args()
    assert (
        main(
            [
                "create-topic",
                root,
                *opts,
                "j",
                "--partitions",
                "2",
                "--config",
                "cleanup.policy=compact",
                "--json",
            ]
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert created["topic"] == "j" and created["created"] is True and created["partitions"] == 2
    assert (
        created["config"]["cleanup.policy"] == "compact"
        and created["config"]["segment.bytes"] == "1073741824"
    )
    assert main(["create-topic", root, *opts, "j", "--if-not-exists", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] is False
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"key": f"k{i}", "value": f"v{i}"}) + "\n" for i in range(20)))
    assert main(["produce", root, *opts, "j", "--file", str(src), "--json"]) == 0
    produced = json.loads(capsys.readouterr().out)
    assert produced["topic"] == "j" and produced["records"] == 20
    parts = produced["partitions"]
    assert sum(p["records"] for p in parts.values()) == 20
    for p in parts.values():  # offsets of a fresh topic: 0 .. records-1 per partition
        assert (p["first_offset"], p["last_offset"]) == (0, p["records"] - 1)
    assert main(["consume", root, *opts, "j", "--json", "--format", "kv"]) == 0  # --json wins
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted(x["value"] for x in lines) == sorted(f"v{i}" for i in range(20))
    assert {str(x["partition"]) for x in lines} == set(parts)


def test_produce_refuses_a_line_without_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``{"key": "a"}`` is refused, not taken silently as a tombstone; an explicit
    ``"value": null`` is one."""
    root = str(tmp_path / "r")
    assert main(["create-topic", root, "t"]) == 0
    assert run(["produce", root, "t"], '{"value": "x"}\n{"key": "a"}\n', monkeypatch) == 1
    err = capsys.readouterr().err
    assert (
        'line 2: no "value" (or "value_b64") field; give "value": null for a tombstone (fields: key)' in err
    )
    assert (
        run(["produce", root, "t"], '{"key": "a", "value": null}\n{"value_b64": "eA=="}\n', monkeypatch) == 0
    )
    capsys.readouterr()
    assert main(["consume", root, "t"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(g["key"], g["value"]) for g in got] == [("a", None), (None, "x")]  # nothing of the bad input


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (
            '{"value": "a", "timestamp": -5}',  # refused (Kafka's producer: InvalidTimestamp)
            "line 1: timestamp -5 is not epoch milliseconds in [0, 9223372036854775807] (Kafka's "
            "producer refuses negative timestamps)",
        ),
        ('{"value": "a", "timestamp": -1}', "line 1: timestamp -1 is not epoch milliseconds in [0, "),
        ('{"value": "a", "partition": -1}', "line 1: partition -1 is not a partition number (>= 0)"),
    ],
)
def test_produce_refuses_negative_timestamps_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str, named: str
) -> None:
    root = str(tmp_path / "r")
    assert main(["create-topic", root, "t"]) == 0
    assert run(["produce", root, "t"], line + "\n", monkeypatch) == 1
    assert named in capsys.readouterr().err
    assert run(["produce", root, "t"], '{"value": "a", "timestamp": 0}\n', monkeypatch) == 0


def test_produce_help_lists_the_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["produce", "--help"]) == 0
    out = capsys.readouterr().out
    fields = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()]
    for name in ("value", "value_b64", "key", "key_b64", "headers", "timestamp", "partition"):
        assert name in fields, name
    assert "a line without it is" in out and "null for a tombstone" in out


@pytest.mark.parametrize("value", ["-1", "-5"])
def test_consume_refuses_a_negative_max_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """A negative ``--max-messages`` is refused, not a run that reads nothing and exits 0
    (Kafka's console consumer takes -1 as "no limit": leaving the option out is pylog's way to
    say that)."""
    root = str(tmp_path / "r")
    assert main(["create-topic", root, "t"]) == 0
    assert run(["produce", root, "t"], '{"value": "a"}\n', monkeypatch) == 0
    capsys.readouterr()
    assert main(["consume", root, "t", "--max-messages", value]) == 2  # argparse's usage error
    assert (
        f"argument --max-messages: expected a number of records >= 0, got {value}" in capsys.readouterr().err
    )
    assert main(["consume", root, "t", "--max-messages", "0"]) == 0  # 0 reads nothing, as Kafka's
    assert capsys.readouterr().out == ""
