"""Clear errors: every bad argument, damaged file or failing disk gives a ``PylogError`` naming
the argument, row or file (a timestamp out of range states the valid range), and the CLI
reports it as a message (JSON under ``--json``), never as a traceback or a silent coercion."""

from __future__ import annotations

import datetime
import errno
import io
import json
import os
import pickle
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import pylog
from pylog import ConfigError, PylogError, StorageError
from pylog.cli import main
from pylog.storage.backends import local
from pylog.storage.root.writer import CLEAN_SHUTDOWN

RANGE = "[0, 9223372036854775807]"  # of a record's timestamp: Kafka's producer refuses negative ones


@pytest.fixture
def root(tmp_path: Path) -> pylog.Root:
    r = pylog.open(tmp_path / "root")
    r.create_topic("t", partitions=2)
    yield r
    r.close()


def cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, stdin: str = "") -> int:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return main(argv)


# ============================================================================ append arguments


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"timestamp": [1]}, "timestamp: has 1 values, expected 2"),  # too few: no IndexError
        ({"timestamp": [1, 2, 3]}, "timestamp: has 3 values, expected 2"),  # too many: not truncated
        ({"key": [b"k"]}, "key: has 1 values, expected 2"),  # not one record of two
        ({"key": [b"a", b"b", b"c"]}, "key: has 3 values, expected 2"),  # no ArrowIndexError
        ({"headers": [[]]}, "headers: has 1 values, expected 2"),
        ({"timestamp": 2**64}, f"out of range: expected epoch milliseconds in {RANGE}"),  # OverflowError
        ({"timestamp": [1e30, 1.0]}, f"row 0 is 1e+30; expected epoch milliseconds in {RANGE}"),
        ({"timestamp": [1.5, 1.0]}, "row 0 is 1.5"),
        ({"timestamp": ["x", "y"]}, "got 'x'"),
        ({"headers": [[("k",)], []]}, "headers: record 0"),  # a 1-tuple: named, not unpacked
        ({"headers": [[], [(1, b"v")]]}, "headers: record 1"),  # a non-str key: no ArrowTypeError
        ({"headers": [[], ["kv"]]}, "headers: record 1"),  # a str is not split into "k" -> "v"
        ({"partition": 0.5}, "partition: expected an integer partition number, got 0.5"),
        ({"partition": "0"}, "partition: expected an integer partition number, got '0'"),
        ({"partition": True}, "partition: expected an integer partition number"),
    ],
)
def test_bad_append_arguments_are_named_and_nothing_is_written(
    root: pylog.Root, kwargs: dict, named: str
) -> None:
    with pytest.raises(ConfigError, match="^" + next(iter(kwargs))) as e:  # names the argument
        root.append("t", [b"a", b"b"], **kwargs)
    assert named in str(e.value)
    assert root.read_table("t").num_rows == 0
    root.append("t", [b"ok"], partition=0)  # the root stays usable
    assert root.read_table("t").num_rows == 1


def test_partition_column_of_floats_is_refused(root: pylog.Root) -> None:
    with pytest.raises(ConfigError, match="'partition' column must hold integer"):
        root.append("t", pa.table({"value": [b"a"], "partition": [0.5]}))
    with pytest.raises(ConfigError, match="'partition' column is null in row 1"):
        root.append("t", pa.table({"value": [b"a", b"b"], "partition": pa.array([0, None], pa.int32())}))
    assert root.read_table("t").num_rows == 0


def test_datetime_and_integral_timestamps_are_taken(root: pylog.Root) -> None:
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    root.append("t", [b"a"], timestamp=when, partition=0)  # one datetime for every record
    root.append("t", [b"b", b"c"], timestamp=[when, when], partition=0)
    root.append("t", [b"d"], timestamp=[1_700_000_000_000.0], partition=0)
    ts = root.read_table("t").column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [1_704_067_200_000] * 3 + [1_700_000_000_000]


def test_offset_for_timestamp_of_a_string(root: pylog.Root) -> None:
    root.append("t", [b"a"], timestamp=5, partition=0)
    lg = root.log("t", 0)
    with pytest.raises(ConfigError, match=r"timestamp: expected epoch milliseconds.*got 'x'"):
        lg.offset_for_timestamp("x")  # named, not a numpy error
    with pytest.raises(ConfigError, match=r"\[-9223372036854775808, 9223372036854775807\]"):
        lg.offset_for_timestamp(2**64)
    assert lg.offset_for_timestamp(5).offset == 0


# ============================================================================ I/O errors


def test_disk_full_during_append_names_the_segment(root: pylog.Root, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(local.os, "fsync", full)
    with pytest.raises(StorageError) as e:
        root.append("t", [b"a"], partition=1)
    msg = str(e.value)
    assert "t-1/00000000000000000000.log" in msg and "errno 28" in msg and "fsync" in msg
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC  # still an I/O error
    again = pickle.loads(pickle.dumps(e.value))  # crosses process boundaries (Spark tasks)
    assert str(again) == msg
    monkeypatch.undo()
    with pytest.raises(PylogError):  # fail-stop: unacknowledged bytes, reopen to recover
        root.append("t", [b"b"], partition=1)


def test_io_error_deleting_the_clean_shutdown_marker_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pylog.open(tmp_path) as r:
        r.create_topic("t")
    assert (tmp_path / CLEAN_SHUTDOWN).exists()
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == CLEAN_SHUTDOWN:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    r = pylog.open(tmp_path)
    with pytest.raises(StorageError, match=f"{CLEAN_SHUTDOWN}: cannot delete it: .*errno 5"):
        r.create_topic("u")


def test_io_error_replacing_the_state_file_names_it(
    root: pylog.Root, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        if str(dst).endswith("pylog-topics.json"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        real_replace(src, dst)

    monkeypatch.setattr(local.os, "replace", replace)
    with pytest.raises(StorageError, match=r"pylog-topics\.json: cannot replace it.*errno 13"):
        root.create_topic("u")


# ============================================================================ the CLI


def test_produce_never_creates_a_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    missing = tmp_path / "typo"
    assert cli(["produce", str(missing), "t"], monkeypatch, '{"value": "a"}\n') == 1
    assert not missing.exists()  # a mistyped root is reported, not created
    assert "typo: no such directory (create-topic creates a root)" in capsys.readouterr().err
    assert cli(["create-topic", str(missing), "t"], monkeypatch) == 0
    assert missing.is_dir()


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (
            '{"value": "a", "timestamp": 1e30}',
            f"line 1: timestamp 1e+30 is not epoch milliseconds in {RANGE}",
        ),
        ('{"value": "a", "timestamp": "5"}', 'line 1: timestamp "5" is not'),
        ('{"value": "a", "partition": 0.5}', "line 1: partition 0.5 is not a partition number"),
        ('{"value": "a", "partition": "0"}', 'line 1: partition "0" is not a partition number'),
    ],
)
def test_produce_refuses_what_it_used_to_coerce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, line: str, named: str
) -> None:
    r = str(tmp_path / "r")
    assert cli(["create-topic", r, "t", "--partitions", "2"], monkeypatch) == 0
    assert cli(["produce", r, "t"], monkeypatch, line + "\n") == 1
    assert named in capsys.readouterr().err
    assert pylog.open(r, read_only=True).read_table("t").num_rows == 0


def test_produce_batch_zero_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    r = str(tmp_path / "r")
    assert cli(["create-topic", r, "t"], monkeypatch) == 0
    assert cli(["produce", r, "t", "--batch", "0"], monkeypatch, '{"value": "a"}\n') == 2
    assert "--batch: expected an integer of at least 1" in capsys.readouterr().err


def test_consume_offsets_as_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    r = str(tmp_path / "r")
    assert cli(["create-topic", r, "t"], monkeypatch) == 0
    assert cli(["produce", r, "t"], monkeypatch, '{"value": "a"}\n{"value": "b"}\n') == 0
    capsys.readouterr()
    assert cli(["consume", r, "t", "--offset", "999"], monkeypatch) == 1  # not: nothing, exit 0
    out = capsys.readouterr()
    assert out.out == ""
    assert "--offset 999 is out of range for 't' (beyond the log end offset): partition 0: [0, 2]" in out.err
    with pytest.raises(pylog.OffsetOutOfRangeError):  # what the API does
        pylog.open(r, read_only=True).read_table("t", start_offset=999)
    assert cli(["consume", r, "t", "--offset", "-5"], monkeypatch) == 1  # not: from the start
    assert "--offset -5: an offset is never negative" in capsys.readouterr().err
    assert cli(["consume", r, "t", "--offset", "2"], monkeypatch) == 0  # the end: nothing yet
    assert cli(["consume", r, "t", "--offset", "1"], monkeypatch) == 0
    assert [json.loads(x)["offset"] for x in capsys.readouterr().out.splitlines()] == [1]


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["consume", "{r}", "t", "--offset", "999", "--json"], "OffsetOutOfRangeError"),
        (["consume", "{r}", "nope", "--json"], "UnknownTopicError"),
        (["describe", "{r}/missing", "--json"], "StorageError"),
        (["verify", "{r}/missing", "--json"], "StorageError"),
        (["produce", "{r}", "nope", "--json"], "UnknownTopicError"),
        (["create-topic", "{r}", "t", "--json"], "TopicExistsError"),
        (["recover", "{r}/missing", "--json"], "StorageError"),
        (["retain", "{r}/missing", "--json"], "UsageError"),
    ],
)
def test_json_commands_print_errors_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, argv: list[str], kind: str
) -> None:
    r = str(tmp_path / "r")
    assert cli(["create-topic", r, "t"], monkeypatch) == 0
    capsys.readouterr()
    assert cli([a.format(r=r) for a in argv], monkeypatch) == 1
    out = capsys.readouterr().out
    error = json.loads(out)["error"]  # on stdout as JSON, not only a line on stderr
    assert error["type"] == kind and error["command"] == argv[0] and error["message"]


def test_unknown_storage_option_names_it_without_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("PYLOG_STORAGE_OPTIONS", json.dumps({"bogus_option": "1", "secret": "hunter2"}))
    assert cli(["describe", "s3://no-such-bucket/p"], monkeypatch) == 1  # an error, not a traceback
    err = capsys.readouterr().err
    assert "s3://no-such-bucket/p: cannot open the object-store root" in err
    assert "bogus_option" in err and "hunter2" not in err


def test_missing_bucket_is_an_error_naming_the_url(
    s3_server, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("PYLOG_STORAGE_OPTIONS", json.dumps(s3_server.options))
    code = cli(["describe", "s3://pylog-no-such-bucket/p", "--json"], monkeypatch)
    out = capsys.readouterr().out
    assert code == 1
    error = json.loads(out)["error"]
    assert "pylog-no-such-bucket" in error["message"]
    assert s3_server.options["secret"] not in out


def test_io_error_truncating_past_the_high_watermark_names_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pylog.open(tmp_path) as r:
        r.create_topic("t")
        r.append("t", [b"a"])
        r.append("t", [b"b"])
    state = tmp_path / "pylog-state.json"
    doc = json.loads(state.read_text())
    doc["high_watermarks"]["t"]["0"] = 1  # offset 1 was never acknowledged: the writer truncates it
    state.write_text(json.dumps(doc))
    real_open = open

    def failing_open(path: object, mode: str = "r", *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if str(path).endswith(".log") and mode == "r+b":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_open(path, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(local, "open", failing_open, raising=False)
    r = pylog.open(tmp_path)
    with pytest.raises(StorageError, match=r"t-0/00000000000000000000\.log.*errno 5"):
        r.append("t", [b"c"])
    monkeypatch.undo()
    r.close()
    with pylog.open(tmp_path) as again:  # nothing was lost: the truncation happens once the disk works
        again.append("t", [b"c"])
        t = again.read_table("t")
        assert t.column("value").to_pylist() == [b"a", b"c"]


# ============================================================================ the sink's kafka.* options


def test_sink_refuses_kafka_options_that_change_what_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pylog.connector.sink_options import parse_sink_options

    base = {"path": str(tmp_path), "topic": "t"}
    for name, advice in [
        ("kafka.compression.type", 'use the option "compression.type"'),
        ("kafka.partitioner.class", "which partition each record goes to"),
        ("kafka.value.serializer", "binary"),
        ("kafka.interceptor.classes", "interceptors"),
    ]:
        with pytest.raises(ConfigError, match=f"option {name}: .*{advice}"):  # refused, not only warned about
            parse_sink_options({**base, name: "x"}, streaming=False)
    with caplog.at_level("WARNING"):  # harmless producer settings of a migrated job: a warning
        got = parse_sink_options({**base, "kafka.acks": "all", "kafka.linger.ms": "5"}, streaming=False)
    assert got.topic == "t"
    assert "kafka.acks" in caplog.text and "kafka.linger.ms" in caplog.text


def test_a_directory_named_like_a_segment_is_named(tmp_path: Path) -> None:
    with pylog.open(tmp_path) as r:
        r.create_topic("t")
        r.append("t", [b"a"])
    (tmp_path / "t-0" / "00000000000000000005.log").mkdir()
    reader = pylog.open(tmp_path, read_only=True)
    with pytest.raises(StorageError, match=r"t-0/00000000000000000005\.log: Is a directory \(errno 21\)"):
        reader.read_table("t")  # named as such, not as files changing under the reader
    with (
        pylog.open(tmp_path) as w,
        pytest.raises(StorageError, match=r"00000000000000000005\.log: Is a directory"),
    ):
        w.append("t", [b"b"])
