"""The ``pylog`` console command: argument handling and ``pylog dump``."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pylog import cli
from pylog.cli.inspection_commands import dump_command
from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.partition.index import OffsetIndex
from tests.kafka_fixtures import require_fixtures


def segment(directory: Path) -> Path:
    data = records.encode([b"a", b"b", b"c"], [b"k", None, b"k"], [10, 11, 12], base_offset=5).tobytes()
    log = directory / "00000000000000000005.log"
    log.write_bytes(data)
    idx = OffsetIndex(LocalStorage(directory), "00000000000000000005.index", 5)
    idx.append(7, 0)
    idx.close()
    return log


def test_dump_log_and_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = segment(tmp_path)
    index = log.with_suffix(".index")
    assert cli.main(["dump", "--files", str(log), str(index), "--print-data-log"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"Dumping {log}"
    assert lines[1] == "Log starting offset: 5"
    assert lines[2].startswith("baseOffset: 5 lastOffset: 7 count: 3 ")
    assert lines[3].endswith(" key: k payload: a")
    assert lines[4].endswith(" headerKeys: [] payload: b")
    assert lines[6:] == [f"Dumping {index}", "offset: 7 position: 0"]


def test_comma_separated_files_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = segment(tmp_path)
    index = log.with_suffix(".index")
    assert cli.main(["dump", "--verify-index-only", "--files", f"{index},{index}"]) == 0
    out, err = capsys.readouterr()
    assert (out.splitlines(), err) == ([f"Dumping {index}", f"Dumping {index}"], "")
    assert cli.main(["dump", "--files", str(index), "--index-sanity-check"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{index} passed sanity check."
    assert cli.main(["dump", "--files", str(log), "--max-bytes", "10"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"Dumping {log}", "Log starting offset: 5"]


def test_mismatch_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = segment(tmp_path)
    index = log.with_suffix(".index")
    index.write_bytes(struct.pack(">ii", 1, 0))  # offset 6: the batch at 0 ends at 7
    assert cli.main(["dump", "--files", str(index), "--verify-index-only"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Mismatches in :") and err[0].endswith(index.name)
    assert err[1] == "  Index offset: 6, log offset: 7"


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "00000000000000000000.log"
    assert cli.main(["dump", "--files", str(missing)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"Dumping {missing}"]
    assert err.strip() == f"{missing}: no such file"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dump"], "the following arguments are required: --files"),
        (["dump", "--files"], "expected at least one argument"),
        (["dump", "--files", "x.log", "--max-bytes", "-1"], "expected an integer in [0, 2147483647]"),
        (["dump", "--files", "x.log", "--max-bytes", "lots"], "expected an integer"),
        (["dump", "--files", "x.log", "--bogus"], "unrecognized arguments: --bogus"),
        (["nosuchcommand"], "invalid choice"),
        (["dump", "--files", ","], "--files names no file"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        (["dump", "--files", "x.log", "--bogus"], "usage: pylog dump ", "unrecognized arguments: --bogus"),
        (["dump", "--bad"], "usage: pylog dump ", "the following arguments are required: --files"),
        (["describe", "/tmp", "--bogus"], "usage: pylog describe ", "unrecognized arguments: --bogus"),
        (["--bogus", "dump", "--files", "x.log"], "usage: pylog [-h]", "unrecognized arguments: --bogus"),
    ],
)
def test_an_unknown_argument_shows_the_usage_it_belongs_to(
    argv: list[str], usage: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and message in err, err


def test_dump_json_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pylog dump --json --files DIR``: one JSON object for the segment files of a partition
    directory; a file of another kind is an error naming it (exit status 1)."""
    part = tmp_path / "t-0"
    part.mkdir()
    log = segment(part)
    (part / "leader-epoch-checkpoint").write_text("0\n0\n")  # not a segment file: left out
    assert cli.main(["dump", "--json", "--files", str(part), "--deep-iteration"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (err, doc["ok"], doc["problems"]) == ("", True, [])
    assert [f["file"] for f in doc["files"]] == [str(log), str(log.with_suffix(".index"))]
    assert [r["offset"] for r in doc["files"][0]["batches"][0]["records"]] == [5, 6, 7]
    assert doc["files"][1]["entries"] == [{"offset": 7, "position": 0}]
    notes = part / "leader-epoch-checkpoint"
    assert cli.main(["dump", "--json", "--files", str(notes)]) == 1
    (only,) = json.loads(capsys.readouterr().out)["files"]
    assert only["errors"][0].startswith(f"{notes}: not a segment file")


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "dump" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["dump", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pylog")
    if "dump" in argv:
        assert "--print-data-log" in out and "--verify-index-only" in out


def test_registry_builds_one_function_per_command() -> None:
    assert list(cli.COMMANDS) == [  # the order `pylog --help` lists them in
        "dump",
        "describe",
        "verify",
        "compact",
        "retain",
        "create-topic",
        "produce",
        "consume",
        "recover",
        "list-topics",
        "delete-topic",
        "alter-config",
        "add-partitions",
        "list-groups",
        "describe-group",
        "delete-group",
        "serve",
    ]
    with pytest.raises(ValueError, match="registered twice"):
        cli.command("dump", "again")(dump_command)


@pytest.mark.subprocess
def test_console_entry_point(tmp_path: Path) -> None:
    log = segment(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pylog.cli", "dump", "--files", str(log)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [f"Dumping {log}", "Log starting offset: 5"]
    proc = subprocess.run(
        [sys.executable, "-m", "pylog.cli", "dump", "--files", str(tmp_path / "missing.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pylog", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert all(name in proc.stdout for name in cli.COMMANDS)


def test_repeated_files_option_accumulates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = segment(tmp_path)
    index = log.with_suffix(".index")
    assert cli.main(["dump", "--files", str(index), "--verify-index-only", "--files", str(index)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"Dumping {index}", f"Dumping {index}"]


@pytest.mark.subprocess
def test_torn_broker_segment_dumps_with_exit_0_and_verify_fails(tmp_path: Path) -> None:
    """A segment a broker wrote, its last batch torn (as a crash leaves it), in a Kafka log
    directory: ``pylog dump`` prints the complete batches and Kafka's ``Found N invalid bytes``
    line on stdout and exits 0, as kafka-dump-log.sh does; ``pylog verify`` reports it and
    exits 1."""
    src = require_fixtures() / "kafka-go/v2c-v2-v2c/test-natty-0/00000000000000000000.log"
    raw = src.read_bytes()
    starts = [0]  # where each of its three batches starts, from their size fields
    while starts[-1] < len(raw):
        starts.append(starts[-1] + 12 + struct.unpack_from(">i", raw, starts[-1] + 8)[0])
    last = starts[-2]
    log = tmp_path / "logs" / "test-natty-0" / src.name
    log.parent.mkdir(parents=True)
    log.write_bytes(raw[: last + 30])
    dumped = subprocess.run(
        [sys.executable, "-m", "pylog", "dump", "--files", str(log)], capture_output=True, text=True
    )
    lines = dumped.stdout.splitlines()
    assert (dumped.returncode, dumped.stderr) == (0, "")
    assert [line.split(" lastOffset:")[0] for line in lines[2:-1]] == ["baseOffset: 0", "baseOffset: 2"]
    assert lines[-1] == f"Found 30 invalid bytes at the end of {src.name}"
    verified = subprocess.run(
        [sys.executable, "-m", "pylog", "verify", str(tmp_path / "logs")], capture_output=True, text=True
    )
    assert verified.returncode == 1
    assert "30 invalid bytes at the end of the log" in verified.stdout


@pytest.mark.subprocess
def test_a_reader_that_stops_early_is_not_an_error_of_the_file(tmp_path: Path) -> None:
    """``pylog dump ... | head``: the closed pipe ends the dump quietly; it is not reported as a
    problem of the segment being dumped (no "<file>: Broken pipe")."""
    values = [b"v%06d" % i for i in range(20_000)]
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(records.encode(values, None, 1000, batch_bytes=4096).tobytes())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylog.cli", "dump", "--files", str(log), "--print-data-log"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"Dumping ")
    proc.stdout.close()  # as `head` does: the dump's next writes fail with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141  # as a shell reports `cat` ended by SIGPIPE
    assert "Broken pipe" not in err and str(log) not in err, err
