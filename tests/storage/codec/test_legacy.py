"""Legacy (magic 0/1) message decoding: real broker fixtures, kafka-python interop, bad input."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import kafka.codec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

from pylog.storage.codec.legacy import (
    CODEC_NAMES,
    LegacyEntry,
    LegacyRecord,
    decode_legacy_entry,
)
from pylog.storage.errors import CorruptRecordError
from tests.kafka_fixtures import ROOT as FIXTURES

INVALID_CRC = "kafka-rust/fetch2.mytopic.nocompression.invalid_crc.kafka.0900"

LOGS = sorted(FIXTURES.rglob("*.log")) if FIXTURES.is_dir() else []

ENTRY = struct.Struct(">qi")


def _ids(value: object) -> str | None:
    """Test ids: the expected message for bad-input cases, not the bytes."""
    return "" if isinstance(value, bytes) else None


def _need_fixtures() -> None:
    if not LOGS:
        pytest.skip(f"../shared/fixtures not present: {FIXTURES}")


# ---------------------------------------------------------------------------- message builder


def make_message(
    *,
    offset: int = 0,
    magic: int = 1,
    attributes: int = 0,
    timestamp: int = 1_600_000_000_000,
    key: bytes | None = None,
    value: bytes | None = b"v",
    crc: int | None = None,
    extra: bytes = b"",
) -> bytes:
    """One legacy entry, written independently of the decoder (``extra`` lands after the value)."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    body += extra
    if crc is None:
        crc = zlib.crc32(body)
    return ENTRY.pack(offset, 4 + len(body)) + struct.pack(">I", crc) + body


def make_wrapper(
    inner: bytes,
    *,
    offset: int,
    magic: int = 1,
    codec: int = 1,
    timestamp: int = 1_600_000_000_000,
    append_time: bool = False,
) -> bytes:
    assert codec == 1, "the hand-built wrappers use gzip"
    attributes = codec | (0x08 if append_time else 0)
    return make_message(
        offset=offset,
        magic=magic,
        attributes=attributes,
        timestamp=timestamp,
        value=gzip.compress(inner),
    )


def walk(data: bytes) -> list[tuple[int, int]]:
    """(position, magic) of every entry of a log."""
    out = []
    pos = 0
    while pos + 17 <= len(data):
        size = ENTRY.unpack_from(data, pos)[1]
        out.append((pos, data[pos + 16]))
        pos += 12 + size
    assert pos == len(data), "the fixtures have no torn tails"
    return out


# ---------------------------------------------------------------------------- fixtures


def _manifest() -> dict[str, Any]:
    return {m["log"]: m for m in json.loads((FIXTURES / "MANIFEST.json").read_text())["logs"]}


@pytest.mark.parametrize(
    "log", LOGS or [None], ids=[str(p.relative_to(FIXTURES)) for p in LOGS] or ["missing"]
)
def test_fixture_legacy_entries(log: Path | None) -> None:
    _need_fixtures()
    assert log is not None
    data = log.read_bytes()
    rel = str(log.relative_to(FIXTURES))
    crc_failures = {f["entry_pos"] for f in _manifest()[rel]["crc_failures"]}
    expected_lines = [
        json.loads(line)
        for line in log.with_name(log.name[: -len(".log")] + ".expected.jsonl").read_text().splitlines()
    ]
    expected = [e for e in expected_lines if e["magic"] in (0, 1)]

    got: list[tuple[LegacyEntry, LegacyRecord]] = []
    for pos, magic in walk(data):
        if magic not in (0, 1):
            continue
        if pos in crc_failures:
            with pytest.raises(CorruptRecordError, match="CRC mismatch") as info:
                decode_legacy_entry(data, pos)
            assert info.value.position == pos
            entry = decode_legacy_entry(data, pos, verify_crc=False)
            assert not entry.crc_valid
        else:
            entry = decode_legacy_entry(data, pos)
            assert entry.crc_valid
        assert entry.position == pos
        assert entry.size == 12 + ENTRY.unpack_from(data, pos)[1]
        assert entry.magic == magic
        assert entry.offset == ENTRY.unpack_from(data, pos)[0]
        assert len(entry.records) >= 1
        if entry.codec == 0:
            assert entry.records[0].offset == entry.offset
            rec = entry.records[0]
            assert entry.key_size == (-1 if rec.key is None else len(rec.key))
            assert entry.value_size == (-1 if rec.value is None else len(rec.value))
        got += [(entry, r) for r in entry.records]

    assert len(got) == len(expected)
    if any(e["magic"] in (0, 1) for e in expected_lines):
        assert got, "legacy records expected"
    for (entry, rec), exp in zip(got, expected, strict=True):
        assert rec.offset == exp["offset"]
        assert rec.timestamp == exp["timestamp"]
        assert rec.timestamp_type == exp["timestamp_type"]
        assert rec.key == (None if exp["key_b64"] is None else base64.b64decode(exp["key_b64"]))
        assert rec.value == (None if exp["value_b64"] is None else base64.b64decode(exp["value_b64"]))
        assert exp["headers"] == []
        assert entry.magic == exp["magic"]
        assert CODEC_NAMES[entry.codec] == exp["codec"]
        assert entry.offset == exp["batch_base_offset"]
        if entry.magic == 0:
            assert entry.timestamp == -1
            assert entry.timestamp_type == -1


def test_invalid_crc_fixture() -> None:
    _need_fixtures()
    path = FIXTURES / INVALID_CRC / "my-topic-0" / "00000000000000000000.log"
    data = path.read_bytes()
    with pytest.raises(CorruptRecordError) as info:
        decode_legacy_entry(data, 0)
    assert info.value.position == 0
    assert "CRC mismatch: stored 0x58585858, computed 0x7e196bb4" in str(info.value)
    entry = decode_legacy_entry(data, 0, verify_crc=False)
    assert entry.crc == 0x58585858
    assert entry.crc_valid is False
    assert len(entry.records) == 1
    assert entry.records[0].value is not None
    assert entry.records[0].value.startswith(b'01."Well, Prince')
    # The same bytes behind a prefix: the error is anchored at the entry's own position.
    with pytest.raises(CorruptRecordError) as info:
        decode_legacy_entry(memoryview(b"\x00" * 7 + data), 7)
    assert info.value.position == 7


def test_fixture_wrappers_inner_offsets() -> None:
    _need_fixtures()
    # v0 gzip/snappy wrappers at offset 41 whose 42 inner offsets are absolute 0..41.
    for name in ("gzip.kafka.0821", "snappy.kafka.0821", "snappy.kafka.0822"):
        path = FIXTURES / f"kafka-rust/fetch1.mytopic.1p.{name}/my-topic-0/00000000000000000000.log"
        data = path.read_bytes()
        entry = decode_legacy_entry(data, 0)
        assert entry.size == len(data)
        assert (entry.magic, entry.offset, entry.key_size) == (0, 41, -1)
        assert [r.offset for r in entry.records] == list(range(42))
        plain = (
            FIXTURES
            / "kafka-rust/fetch1.mytopic.1p.nocompression.kafka.0821/my-topic-0"
            / "00000000000000000000.log"
        ).read_bytes()
        values = [decode_legacy_entry(plain, p).records[0].value for p, _ in walk(plain)]
        assert [r.value for r in entry.records] == values


# ---------------------------------------------------------------------------- kafka-python

LEGACY_CODECS = [0, 1] + [2] * kafka.codec.has_snappy() + [3] * kafka.codec.has_lz4()
# kafka-python writes magic-0 lz4 (with the broken header checksum) only with xxhash installed.
BUILDABLE = [
    (magic, codec)
    for magic in (0, 1)
    for codec in LEGACY_CODECS
    if not (magic == 0 and codec == 3 and getattr(kafka.codec, "xxhash", None) is None)
]

kv = st.one_of(st.none(), st.binary(max_size=64))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    magic_codec=st.sampled_from(BUILDABLE),
    messages=st.lists(st.tuples(kv, kv, st.integers(0, 2**48)), min_size=1, max_size=12),
    base=st.integers(0, 2**40),
)
def test_kafka_python_builder_interop(
    magic_codec: tuple[int, int],
    messages: list[tuple[bytes | None, bytes | None, int]],
    base: int,
) -> None:
    magic, codec = magic_codec
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 30)
    for i, (key, value, ts) in enumerate(messages):
        assert builder.append(i, timestamp=ts, key=key, value=value) is not None
    buf = bytes(builder.build())
    n = len(messages)

    if codec == 0:
        positions = walk(buf)
        assert len(positions) == n
        entries = [decode_legacy_entry(buf, p) for p, _ in positions]
        records = [e.records[0] for e in entries]
        assert [r.offset for r in records] == list(range(n))
    else:
        (entry,) = [decode_legacy_entry(buf, p) for p, _ in walk(buf)]
        assert entry.codec == codec
        assert entry.key_size == -1
        records = list(entry.records)
        # kafka-python writes wrapper offset 0 (like librdkafka): inner offsets kept as they are
        assert [r.offset for r in records] == list(range(n))
        # A broker-assigned wrapper offset (not covered by the CRC) makes them absolute (v1).
        last = base + n - 1
        patched = struct.pack(">q", last) + buf[8:]
        moved = decode_legacy_entry(patched, 0).records
        expected = list(range(base, last + 1)) if magic == 1 else list(range(n))
        assert [r.offset for r in moved] == expected

    assert [(r.key, r.value) for r in records] == [(k, v) for k, v, _ in messages]
    if magic == 0:
        assert all(r.timestamp == -1 and r.timestamp_type == -1 for r in records)
    else:
        assert [r.timestamp for r in records] == [ts for _, _, ts in messages]
        assert all(r.timestamp_type == 0 for r in records)

    # kafka-python's own reader agrees.
    theirs = []
    for p, _ in walk(buf):
        size = 12 + ENTRY.unpack_from(buf, p)[1]
        theirs += list(LegacyRecordBatch(buf[p : p + size], magic))
    assert [(r.offset, r.key, r.value) for r in theirs] == [(r.offset, r.key, r.value) for r in records]


@pytest.mark.parametrize("codec", LEGACY_CODECS[1:])
def test_log_append_time_wrapper(codec: int) -> None:
    builder = LegacyRecordBatchBuilder(1, codec, 1 << 30)
    for i in range(3):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"v")
    buf = bytearray(builder.build())
    # What a broker does for LogAppendTime: set the wrapper's timestamp type and timestamp,
    # its offset, and recompute the wrapper's CRC.
    struct.pack_into(">q", buf, 0, 500)
    buf[17] |= 0x08
    struct.pack_into(">q", buf, 18, 1_700_000_000_123)
    struct.pack_into(">I", buf, 12, zlib.crc32(buf[16:]))
    entry = decode_legacy_entry(buf, 0)
    assert (entry.timestamp_type, entry.timestamp) == (1, 1_700_000_000_123)
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in entry.records] == [
        (498, 1_700_000_000_123, 1),
        (499, 1_700_000_000_123, 1),
        (500, 1_700_000_000_123, 1),
    ]


def _xxh32_short(data: bytes) -> int:
    """xxHash32 with seed 0 of fewer than 16 bytes (enough for an LZ4 frame descriptor)."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    assert len(data) < 16
    h = (p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, i)
        h = (rotl((h + word * p3) & mask, 17) * p4) & mask
        i += 4
    for b in data[i:]:
        h = (rotl((h + b * p5) & mask, 11) * p1) & mask
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    return h ^ (h >> 16)


@pytest.mark.skipif(not kafka.codec.has_lz4(), reason="kafka-python has no lz4 support")
def test_lz4_header_checksum_by_magic() -> None:
    # Magic-0 writers computed the LZ4 frame header checksum over magic..BD instead of FLG..BD
    # (KAFKA-3160); that form is accepted for magic 0 only.
    assert (_xxh32_short(bytes([0x60, 0x40])) >> 8) & 0xFF == 0x82
    for magic in (0, 1):
        inner = b"".join(make_message(offset=i, magic=magic, value=b"x%d" % i) for i in range(3))
        frame = bytearray(kafka.codec.lz4_encode(inner))
        hc = 6 + (8 if frame[4] & 0x08 else 0)
        good = make_message(offset=2, magic=magic, attributes=3, value=bytes(frame))
        assert [r.value for r in decode_legacy_entry(good, 0).records] == [b"x0", b"x1", b"x2"]
        frame[hc] = (_xxh32_short(bytes(frame[:hc])) >> 8) & 0xFF
        broken = make_message(offset=2, magic=magic, attributes=3, value=bytes(frame))
        if magic == 0:
            assert len(decode_legacy_entry(broken, 0).records) == 3
        else:
            with pytest.raises(CorruptRecordError, match="cannot decompress the lz4") as info:
                decode_legacy_entry(broken, 0)
            assert info.value.position == 0


# ---------------------------------------------------------------------------- hand-built


def test_plain_messages() -> None:
    m0 = make_message(offset=7, magic=0, key=None, value=b"hello")
    e0 = decode_legacy_entry(m0, 0)
    assert (e0.magic, e0.codec, e0.offset, e0.size) == (0, 0, 7, len(m0))
    assert (e0.timestamp, e0.timestamp_type, e0.key_size, e0.value_size) == (-1, -1, -1, 5)
    assert e0.records == (LegacyRecord(7, -1, -1, None, b"hello"),)
    m1 = make_message(offset=8, magic=1, attributes=0x08, timestamp=42, key=b"", value=None)
    e1 = decode_legacy_entry(bytearray(m0 + m1), len(m0))
    assert (e1.position, e1.timestamp, e1.timestamp_type, e1.key_size, e1.value_size) == (
        len(m0),
        42,
        1,
        0,
        -1,
    )
    assert e1.records == (LegacyRecord(8, 42, 1, b"", None),)
    assert e1.crc == struct.unpack_from(">I", m1, 12)[0]
    # Attribute bit 3 means nothing for magic 0.
    e = decode_legacy_entry(make_message(magic=0, attributes=0x08), 0)
    assert (e.timestamp, e.timestamp_type) == (-1, -1)


def test_v1_wrapper_relative_offsets() -> None:
    inner = b"".join(
        make_message(offset=i, magic=1, timestamp=100 + i, key=b"k", value=b"%d" % i) for i in range(4)
    )
    entry = decode_legacy_entry(make_wrapper(inner, offset=1003), 0)
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in entry.records] == [
        (1000, 100, 0),
        (1001, 101, 0),
        (1002, 102, 0),
        (1003, 103, 0),
    ]
    # v0 wrappers keep the inner offsets as written (absolute).
    inner0 = b"".join(make_message(offset=50 + i, magic=0, value=b"x") for i in range(3))
    entry = decode_legacy_entry(make_wrapper(inner0, offset=52, magic=0), 0)
    assert [r.offset for r in entry.records] == [50, 51, 52]
    assert all(r.timestamp == -1 and r.timestamp_type == -1 for r in entry.records)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (ENTRY.pack(0, 13) + b"\x00" * 13, "messageSize 13 is below the minimum"),
        (ENTRY.pack(0, -1) + b"\x00" * 20, "messageSize -1 is below the minimum"),
        (ENTRY.pack(0, 2**31 - 1) + b"\x00" * 20, "extends beyond the buffer"),
        (make_message()[:-1], "extends beyond the buffer: only 34 bytes left"),
        (b"\x00" * 11, "entry header needs 12 bytes"),
        (b"", "entry header needs 12 bytes"),
        (make_message(magic=0, extra=b"\0" * 4), "4 bytes left over inside the message"),
        (make_message(magic=2), "bad magic 2: expected 0 or 1"),
        (make_message(magic=-1), "bad magic -1"),
        (
            ENTRY.pack(0, 21) + b"\0" * 4 + b"\x01" + b"\0" * 16,
            "for magic 1: expected at least 22",
        ),
        (make_message(crc=0x58585858), "CRC mismatch: stored 0x58585858, computed 0x"),
        (make_message(attributes=4, value=b"x"), "zstd"),
        (make_message(attributes=5, value=b"x"), "unknown codec 5"),
        (make_message(attributes=1, value=None), "null value"),
        (make_message(extra=b"abc"), "3 bytes left over inside the message"),
        (make_message(key=b"k", extra=b"\x00\x00\x00\x01"), "4 bytes left over"),
    ],
    ids=_ids,
)
def test_bad_messages(message: bytes, match: str) -> None:
    for prefix in (b"", b"\xee" * 5):
        with pytest.raises(CorruptRecordError, match=match) as info:
            decode_legacy_entry(prefix + message, len(prefix))
        assert info.value.position == len(prefix)


def _with_crc(body: bytes, offset: int = 0) -> bytes:
    return ENTRY.pack(offset, 4 + len(body)) + struct.pack(">I", zlib.crc32(body)) + body


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (struct.pack(">bbi", 0, 0, -2) + struct.pack(">i", 1) + b"x", "key length -2"),
        (struct.pack(">bbi", 0, 0, 100) + struct.pack(">i", 1) + b"x", "key length 100 extends"),
        (struct.pack(">bbi", 0, 0, 3) + b"abc" + struct.pack(">i", -7), "value length -7"),
        (struct.pack(">bbi", 0, 0, 3) + b"abc" + struct.pack(">i", 2) + b"x", "value length 2"),
        (struct.pack(">bbqi", 1, 0, 5, 2) + b"ab" + struct.pack(">i", 2**31 - 1), "value length"),
        # The key length leaves no room for the value length field.
        (struct.pack(">bbi", 0, 0, 6) + b"abc" + struct.pack(">i", 0), "key length 6 extends"),
    ],
    ids=_ids,
)
def test_bad_lengths(body: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match) as info:
        decode_legacy_entry(_with_crc(body), 0)
    assert info.value.position == 0


@pytest.mark.parametrize(
    ("inner", "match"),
    [
        (b"", "holds no messages"),
        (make_message(offset=0, value=b"a")[:-2], "inner message at byte 0 .* extends beyond"),
        (make_message(offset=0) + b"\x00\x01", "inner message at byte 35 .* header needs 12"),
        (
            make_message(offset=0, crc=1),
            "inner message at byte 0 .*CRC mismatch: stored 0x00000001",
        ),
        (
            make_message(offset=0, attributes=1, value=gzip.compress(make_message())),
            "itself compressed",
        ),
        (make_message(offset=0, magic=2), "bad magic 2"),
    ],
    ids=_ids,
)
def test_bad_inner_messages(inner: bytes, match: str) -> None:
    wrapper = make_wrapper(inner, offset=9)
    with pytest.raises(CorruptRecordError, match=match) as info:
        decode_legacy_entry(b"\x00" * 3 + wrapper, 3)
    assert info.value.position == 3


def test_inner_crc_not_verified() -> None:
    inner = make_message(offset=0, value=b"a") + make_message(offset=1, value=b"b", crc=5)
    wrapper = make_wrapper(inner, offset=1)
    with pytest.raises(CorruptRecordError, match="inner message at byte 35"):
        decode_legacy_entry(wrapper, 0)
    entry = decode_legacy_entry(wrapper, 0, verify_crc=False)
    assert entry.crc_valid is False  # the wrapper's own CRC is fine, an inner one is not
    assert [r.value for r in entry.records] == [b"a", b"b"]


def test_bad_compressed_value() -> None:
    wrapper = make_message(attributes=1, value=b"definitely not gzip")
    with pytest.raises(CorruptRecordError, match="cannot decompress the gzip wrapper") as info:
        decode_legacy_entry(b"\x01" + wrapper, 1)
    assert info.value.position == 1


def test_decompressed_size_is_bounded() -> None:
    inner = make_message(offset=0, magic=1, value=b"\x00" * 100_000)
    wrapper = make_wrapper(inner, offset=0)
    assert len(wrapper) < 1000
    assert decode_legacy_entry(wrapper, 0).records[0].value == b"\x00" * 100_000
    with pytest.raises(CorruptRecordError) as info:
        decode_legacy_entry(wrapper, 0, max_decompressed_size=50_000)
    assert info.value.position == 0


def test_negative_position_rejected() -> None:
    with pytest.raises(ValueError):
        decode_legacy_entry(make_message(), -1)


# ---------------------------------------------------------------------------- robustness


def _samples() -> list[bytes]:
    inner = b"".join(
        make_message(offset=i, magic=1, key=b"key%d" % i, value=b"value %d" % i) for i in range(3)
    )
    out = [
        make_message(offset=3, magic=0, key=b"k", value=b"value"),
        make_message(offset=4, magic=1, key=None, value=b"value"),
        make_wrapper(inner, offset=12),
    ]
    for magic, codec in BUILDABLE:
        if codec:
            builder = LegacyRecordBatchBuilder(magic, codec, 1 << 30)
            for i in range(3):
                builder.append(i, timestamp=i, key=b"k", value=b"value %d" % i)
            out.append(bytes(builder.build()))
    return out


SAMPLES = _samples()


@pytest.mark.parametrize("sample", range(len(SAMPLES)))
def test_every_truncation_raises_corrupt(sample: int) -> None:
    data = SAMPLES[sample]
    assert len(decode_legacy_entry(data, 0).records) >= 1
    for cut in range(len(data)):
        for verify in (True, False):
            with pytest.raises(CorruptRecordError) as info:
                decode_legacy_entry(b"\xab\xcd" + data[:cut], 2, verify_crc=verify)
            assert info.value.position == 2


def _mutate(data: bytes, edits: list[tuple[int, int]], fix_crc: bool) -> bytes:
    buf = bytearray(data)
    for index, byte in edits:
        buf[index % len(buf)] = byte
    if fix_crc and len(buf) >= 16:
        # Recompute the CRC so the mutation reaches the structure and the decompressor.
        struct.pack_into(">I", buf, 12, zlib.crc32(buf[16:]))
    return bytes(buf)


@settings(max_examples=400, deadline=None)
@given(
    sample=st.sampled_from(range(len(SAMPLES))),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    fix_crc=st.booleans(),
    verify=st.booleans(),
)
def test_random_mutations_only_raise_corrupt(
    sample: int, edits: list[tuple[int, int]], fix_crc: bool, verify: bool
) -> None:
    data = _mutate(SAMPLES[sample], edits, fix_crc)
    try:
        entry = decode_legacy_entry(data, 0, verify_crc=verify)
    except CorruptRecordError as exc:
        assert exc.position == 0
        return
    assert entry.size <= len(data)
    assert len(entry.records) >= 1
    if verify:
        assert entry.crc_valid


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), verify=st.booleans())
def test_random_bytes_only_raise_corrupt(data: bytes, verify: bool) -> None:
    try:
        decode_legacy_entry(data, 0, verify_crc=verify)
    except CorruptRecordError as exc:
        assert exc.position == 0
