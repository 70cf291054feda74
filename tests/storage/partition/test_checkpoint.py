"""Kafka offset checkpoint files: exact format, Kafka's reading rules, strict errors with line
numbers, and atomic replacement."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.storage.backends.local import LocalStorage
from pylog.storage.errors import ConfigError, CorruptCheckpointError, InvalidOffsetError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.partition.checkpoint import format_offsets, parse_offsets, read_offsets, write_offsets

KAFKA_EXAMPLE = b"0\n2\nmytopic 0 1234\nmytopic 1 99\n"  # kafka-format.md §4

topics = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", min_size=1, max_size=249
).filter(lambda t: t not in (".", ".."))
partitions = st.integers(0, 2**31 - 1)
offsets = st.integers(-(2**63), 2**63 - 1)
entry_maps = st.dictionaries(st.tuples(topics, partitions), offsets, max_size=30)


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path)


# --- format -------------------------------------------------------------------------------------


def test_file_names_are_kafkas() -> None:
    assert ckpt.RECOVERY_POINT == "recovery-point-offset-checkpoint"
    assert ckpt.LOG_START_OFFSET == "log-start-offset-checkpoint"
    assert ckpt.CLEANER_OFFSET == "cleaner-offset-checkpoint"


def test_kafka_example_parses_exactly() -> None:
    assert parse_offsets(KAFKA_EXAMPLE) == {("mytopic", 0): 1234, ("mytopic", 1): 99}


def test_format_is_kafkas_byte_for_byte() -> None:
    assert format_offsets({("mytopic", 1): 99, ("mytopic", 0): 1234}) == KAFKA_EXAMPLE


def test_format_sorts_by_topic_then_partition_numerically() -> None:
    data = format_offsets({("b", 0): 1, ("a", 10): 2, ("a", 9): 3, ("a-x", 0): 4})
    assert data == b"0\n4\na 9 3\na 10 2\na-x 0 4\nb 0 1\n"


def test_format_empty() -> None:
    assert format_offsets({}) == b"0\n0\n"
    assert parse_offsets(b"0\n0\n") == {}


@settings(max_examples=150, deadline=None)
@given(entry_maps)
def test_round_trip(entries: dict[tuple[str, int], int]) -> None:
    data = format_offsets(entries)
    assert parse_offsets(data) == entries
    assert b"\r" not in data
    assert data.endswith(b"\n")


@settings(max_examples=50, deadline=None)
@given(entry_maps)
def test_round_trip_with_crlf_line_endings(entries: dict[tuple[str, int], int]) -> None:
    """Kafka on Windows writes the platform separator."""
    assert parse_offsets(format_offsets(entries).replace(b"\n", b"\r\n")) == entries


@pytest.mark.parametrize(
    ("key", "offset", "error"),
    [
        (("", 0), 1, ConfigError),
        (("a/b", 0), 1, ConfigError),
        ((".", 0), 1, ConfigError),
        (("t" * 250, 0), 1, ConfigError),
        (("t", -1), 1, ConfigError),
        (("t", 2**31), 1, ConfigError),
        (("t", True), 1, ConfigError),
        (("t",), 1, ConfigError),
        (("t", 0), 2**63, InvalidOffsetError),
        (("t", 0), -(2**63) - 1, InvalidOffsetError),
        (("t", 0), 1.0, InvalidOffsetError),
    ],
)
def test_format_rejects_invalid_entries(key: object, offset: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        format_offsets({key: offset})  # type: ignore[dict-item]


# --- Kafka's lenient cases ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", {}),  # empty file
        (b"0", {}),  # no 2nd line
        (b"0\n", {}),
        (b"0\r\n", {}),
        (b"0\n0", {}),
        (b"0\r\n1\r\nt 0 5\r\n", {("t", 0): 5}),
        (b"0\r1\rt 0 5\r", {("t", 0): 5}),  # BufferedReader.readLine also ends lines at a bare \r
        (b"0\n1\nt 0 5", {("t", 0): 5}),  # no final newline
        (b"0\n1\nt\t0   5 \n", {("t", 0): 5}),  # any whitespace between fields (\s+)
        (b"0\n1\nt 0 -1\n", {("t", 0): -1}),  # Kafka stores any long
        (b"0\n1\nt +3 +5\n", {("t", 3): 5}),  # Long.parseLong accepts a plus sign
        (b"+0\n1\nt 0 5\n", {("t", 0): 5}),
        (b"0\n1\nt 0 9223372036854775807\n", {("t", 0): 2**63 - 1}),
        (b"0\n1\nt 2147483647 -9223372036854775808\n", {("t", 2**31 - 1): -(2**63)}),
    ],
)
def test_parse_accepts(data: bytes, expected: dict[tuple[str, int], int]) -> None:
    assert parse_offsets(data) == expected


# --- strict errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "line", "fragment"),
    [
        (b"3\n0\n", 1, "unsupported checkpoint version 3 (expected 0)"),
        (b"1\n1\nt 0 5\n", 1, "unsupported checkpoint version 1"),
        (b"\n", 1, "version line '' is not an integer"),
        (b"x\n0\n", 1, "version line 'x' is not an integer"),
        (b" 0\n0\n", 1, "is not an integer"),  # Integer.parseInt does not trim
        (b"0.0\n0\n", 1, "is not an integer"),
        (b"\xef\xbb\xbf0\n0\n", 1, "is not an integer"),  # a BOM is not part of Kafka's format
        (b"99999999999999999999999\n0\n", 1, "unsupported checkpoint version"),
        (b"0\n\n", 2, "entry count is missing"),
        (b"0\n \nt 0 5\n", 2, "entry count is missing"),
        (b"0\nabc\n", 2, "entry count 'abc' is not an integer"),
        (b"0\n1.5\n", 2, "is not an integer"),
        (b"0\n-1\n", 2, "out of range"),
        (b"0\n2147483648\n", 2, "out of range"),
        (b"0\n5\na 0 1\nb 0 1\nc 0 1\nd 0 1\n", 2, "expected 5 entries, found 4"),
        (b"0\n1\na 0 1\nb 0 1\n", 2, "expected 1 entries, found 2"),
        (b"0\n1\n", 2, "expected 1 entries, found 0"),
        (b"0\n1\nt 0\n", 3, "expected 3 fields"),
        (b"0\n1\nt 0 5 6\n", 3, "found 4"),
        (b"0\n1\n\n", 3, "found 0"),
        (b"0\n2\na 0 1\n\nb 0 2\n", 4, "found 0"),  # a blank line is malformed, as in Kafka
        (b"0\n1\nt x 5\n", 3, "partition 'x' is not an integer"),
        (b"0\n1\nt 1.0 5\n", 3, "partition '1.0' is not an integer"),
        (b"0\n1\nt -1 5\n", 3, "partition -1 is negative"),
        (b"0\n1\nt 2147483648 5\n", 3, "partition '2147483648' is out of range"),
        (b"0\n1\nt 0 x\n", 3, "offset 'x' is not an integer"),
        (b"0\n1\nt 0 5.0\n", 3, "offset '5.0' is not an integer"),
        (b"0\n1\nt 0 9223372036854775808\n", 3, "out of the int64 range"),
        (b"0\n1\nt 0 -9223372036854775809\n", 3, "out of the int64 range"),
        (b"0\n1\nt 0 " + b"9" * 5000 + b"\n", 3, "out of the int64 range"),
        (b"0\n1\nt 0 \xd9\xa3\n", 3, "is not an integer"),  # Arabic-Indic digit: int() would take it
        (b"0\n1\na/b 0 5\n", 3, "topic name 'a/b' is illegal"),
        (b"0\n1\n.. 0 5\n", 3, "can't be '.' or '..'"),
        (b"0\n1\n" + b"t" * 250 + b" 0 5\n", 3, "longer than 249"),
        (b"0\n1\nt\x000 0 5\n", 3, "is illegal"),
        (b"0\n3\na 0 1\nb 0 1\na 0 2\n", 5, "duplicate entry for a-0 (first on line 3)"),
        (b"0\n2\na 0 1\na +0 2\n", 4, "duplicate entry"),
        (b"0\n1\nt\xff 0 5\n", 3, "invalid UTF-8 at byte 5"),
        (b"\xff\n", 1, "invalid UTF-8 at byte 0"),
        (b"0\r\n1\r\n\r\nt \xc3 0\r\n", 4, "invalid UTF-8"),
        (b"0\r1\rt \xc3 0\r", 3, "invalid UTF-8"),
    ],
)
def test_parse_rejects_with_line_number(data: bytes, line: int, fragment: str) -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        parse_offsets(data, path="recovery-point-offset-checkpoint")
    err = info.value
    assert err.line == line
    assert err.path == "recovery-point-offset-checkpoint"
    message = str(err)
    assert message.startswith(f"recovery-point-offset-checkpoint, line {line}: ")
    assert fragment in message


def test_parse_error_without_path() -> None:
    with pytest.raises(CorruptCheckpointError, match=r"^line 1: unsupported checkpoint version 7") as info:
        parse_offsets(b"7\n0\n")
    assert info.value.path is None


def test_invalid_utf8_chains_the_decode_error() -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        parse_offsets(b"0\n1\n\xfe 0 1\n")
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_long_malformed_lines_are_shortened_in_errors() -> None:
    with pytest.raises(CorruptCheckpointError) as info:
        parse_offsets(b"0\n1\n" + b"x" * 100_000 + b"\n")
    assert len(str(info.value)) < 300


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_parse_or_raise_corrupt_checkpoint(data: bytes) -> None:
    try:
        result = parse_offsets(data)
    except CorruptCheckpointError as e:
        assert e.line is not None and e.line >= 1
    else:
        assert isinstance(result, dict)


@settings(max_examples=100, deadline=None)
@given(entry_maps.filter(bool), st.data())
def test_truncation_or_byte_flip_never_raises_anything_else(
    entries: dict[tuple[str, int], int], data: st.DataObject
) -> None:
    good = format_offsets(entries)
    cut = data.draw(st.integers(0, len(good)))
    at = data.draw(st.integers(0, len(good) - 1))
    flipped = bytearray(good)
    flipped[at] ^= data.draw(st.integers(1, 255))
    for candidate in (good[:cut], bytes(flipped)):
        with contextlib.suppress(CorruptCheckpointError):
            parse_offsets(candidate)


# --- storage: read/write and atomicity ------------------------------------------------------------


def test_missing_file_reads_as_empty(storage: LocalStorage) -> None:
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {}


def test_write_then_read(storage: LocalStorage, tmp_path: Path) -> None:
    entries = {("mytopic", 0): 1234, ("mytopic", 1): 99}
    write_offsets(storage, ckpt.RECOVERY_POINT, entries)
    assert (tmp_path / ckpt.RECOVERY_POINT).read_bytes() == KAFKA_EXAMPLE
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == entries


def test_read_error_names_the_file(storage: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / ckpt.CLEANER_OFFSET).write_bytes(b"0\n2\nt 0 5\n")
    with pytest.raises(
        CorruptCheckpointError, match=r"cleaner-offset-checkpoint, line 2: expected 2 entries"
    ):
        read_offsets(storage, ckpt.CLEANER_OFFSET)


def test_overwrite_leaves_no_tmp(storage: LocalStorage, tmp_path: Path) -> None:
    write_offsets(storage, ckpt.LOG_START_OFFSET, {("t", 0): 1})
    write_offsets(storage, ckpt.LOG_START_OFFSET, {("t", 0): 2, ("t", 1): 3})
    assert sorted(os.listdir(tmp_path)) == [ckpt.LOG_START_OFFSET]
    assert read_offsets(storage, ckpt.LOG_START_OFFSET) == {("t", 0): 2, ("t", 1): 3}


def test_leftover_tmp_from_a_crash_is_ignored_and_replaced(storage: LocalStorage, tmp_path: Path) -> None:
    write_offsets(storage, ckpt.RECOVERY_POINT, {("t", 0): 7})
    tmp = tmp_path / (ckpt.RECOVERY_POINT + ".tmp")
    tmp.write_bytes(b"0\n3\nt 0 9\ngarbage")  # a crash in the middle of writing the next version
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {("t", 0): 7}
    write_offsets(storage, ckpt.RECOVERY_POINT, {("t", 0): 8})
    assert not tmp.exists()
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {("t", 0): 8}


def test_leftover_tmp_without_checkpoint_reads_as_empty(storage: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / (ckpt.RECOVERY_POINT + ".tmp")).write_bytes(b"0\n1\nt 0 9\n")
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {}


def test_crash_before_rename_keeps_previous_checkpoint(
    storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_offsets(storage, ckpt.RECOVERY_POINT, {("t", 0): 7})

    def crash(src: object, dst: object) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_offsets(storage, ckpt.RECOVERY_POINT, {("t", 0): 8})
    monkeypatch.undo()
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {("t", 0): 7}


def test_invalid_entries_are_rejected_before_touching_the_file(storage: LocalStorage, tmp_path: Path) -> None:
    write_offsets(storage, ckpt.RECOVERY_POINT, {("t", 0): 7})
    with pytest.raises(ConfigError):
        write_offsets(storage, ckpt.RECOVERY_POINT, {("bad topic", 0): 8})
    assert sorted(os.listdir(tmp_path)) == [ckpt.RECOVERY_POINT]
    assert read_offsets(storage, ckpt.RECOVERY_POINT) == {("t", 0): 7}


def test_checkpoint_in_a_subdirectory(storage: LocalStorage) -> None:
    """The same format serves pylog's per-query consumer offsets, kept below the root."""
    storage.makedirs("_queries/q1")
    write_offsets(storage, "_queries/q1/offsets", {("events", 3): 42})
    assert read_offsets(storage, "_queries/q1/offsets") == {("events", 3): 42}
