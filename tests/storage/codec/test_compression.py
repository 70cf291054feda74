"""Kafka compression codecs: round trips, exact framing, kafka-python interop, real snappy-java
data, zstd streams without content size, corruption handling and decompression bounds."""

from __future__ import annotations

import gzip
import io
import random
import tracemalloc
import zlib
from collections.abc import Callable

import cramjam
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka import codec as kc

from pylog.storage.codec import compression
from pylog.storage.codec.compression import (
    CODEC_NAMES,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    codec_id,
    compress,
    decompress,
)
from pylog.storage.errors import ConfigError, CorruptRecordError
from tests.kafka_fixtures import ROOT as FIXTURES

lz4_frame = pytest.importorskip("lz4.frame", reason="python-lz4 (test-only peer) not installed")
zstandard = pytest.importorskip("zstandard", reason="zstandard (test-only peer) not installed")

SNAPPY_JAVA_STREAM = FIXTURES / "kafka-rust" / "snappy-java-stream" / "fetch1.snappy.chunked.4k"

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSED_CODECS = [GZIP, SNAPPY, LZ4, ZSTD]

_rng = random.Random(20240521)
RANDOM_100K = _rng.randbytes(100_000)  # incompressible: lz4 blocks are stored uncompressed
TEXT_300K = b"".join(
    b"offset=%d key=user-%d value={'clicks': %d, 'page': '/p/%d'}\n"
    % (i, _rng.randrange(500), _rng.randrange(100), _rng.randrange(50))
    for i in range(5000)
)[:300_000]
# Compressible and longer than one xerial chunk (32 KiB) and one lz4 block (64 KiB), yet its
# compressed forms are small enough to truncate at every position.
MULTI_BLOCK = (b"kafka record " + bytes(range(256))) * 300
SMALL = b"a small Kafka records section \x00\x01\x02" * 8

payloads = st.one_of(
    st.binary(max_size=2000),
    st.builds(lambda u, r: u * r, st.binary(min_size=1, max_size=64), st.integers(1, 5000)),
    st.lists(
        st.one_of(
            st.binary(max_size=3000),
            st.builds(lambda u, r: u * r, st.binary(min_size=1, max_size=16), st.integers(1, 8000)),
        ),
        max_size=6,
    ).map(b"".join),
)


def _zstd_stream_writer(data: bytes, chunk: int = 50_000) -> bytes:
    buf = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(buf, closefd=False) as writer:
        for i in range(0, len(data), chunk):
            writer.write(data[i : i + chunk])
    return buf.getvalue()


def _zstd_compressobj(data: bytes) -> bytes:
    cobj = zstandard.ZstdCompressor(level=5).compressobj()
    return cobj.compress(data) + cobj.flush()


def _expect_corrupt(codec: int, data: bytes, **kwargs: int) -> CorruptRecordError:
    with pytest.raises(CorruptRecordError) as info:
        decompress(codec, data, **kwargs)
    err = info.value
    assert err.position is not None and 0 <= err.position <= len(data), err
    return err


# --- round trips and API ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS, ids=CODEC_NAMES.get)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=payloads)
@example(data=b"")
@example(data=b"x")
@example(data=RANDOM_100K)
@example(data=TEXT_300K)
@example(data=RANDOM_100K[:40_000] + bytes(100_000) + RANDOM_100K)
def test_round_trip(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    assert isinstance(packed, bytes)
    assert decompress(codec, packed) == data
    assert decompress(codec, bytearray(packed), max_size=len(data)) == data
    assert decompress(codec, memoryview(b"??" + packed)[2:], magic=2) == data


@pytest.mark.parametrize("codec", ALL_CODECS, ids=CODEC_NAMES.get)
def test_accepts_every_buffer_kind(codec: int) -> None:
    arr = np.frombuffer(b"\xff" * 7 + TEXT_300K, dtype=np.uint8)
    packed = compress(codec, arr.data[7:])
    assert decompress(codec, np.frombuffer(packed, dtype=np.uint8).data) == TEXT_300K
    strided = memoryview(TEXT_300K)[::3]  # not contiguous
    assert decompress(codec, compress(codec, strided)) == TEXT_300K[::3]


def test_none_returns_bytes_unchanged() -> None:
    for value in (SMALL, bytearray(SMALL), memoryview(SMALL)):
        for out in (compress(NONE, value), decompress(NONE, value)):
            assert type(out) is bytes
            assert out == SMALL


def test_codec_constants_and_names() -> None:
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)
    assert CODEC_NAMES == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    for cid, name in CODEC_NAMES.items():
        assert codec_id(name) == cid
        assert codec_id(name.upper()) == cid
        assert codec_id(cid) == cid
    assert codec_id("Uncompressed") == NONE
    assert codec_id("LZ4") == LZ4
    assert codec_id(" zstd ") == ZSTD
    assert codec_id(np.int8(2)) == SNAPPY  # type: ignore[arg-type]
    for bad in ("brotli", "", 5, -1, "producer", True, 2.0, None):
        with pytest.raises(ConfigError) as info:
            codec_id(bad)  # type: ignore[arg-type]
        for name in ("none", "gzip", "snappy", "lz4", "zstd"):
            assert name in str(info.value)


@pytest.mark.parametrize("cid", [5, 6, 7])
def test_unknown_codec_ids_are_corrupt(cid: int) -> None:
    err = _expect_corrupt(cid, SMALL)
    assert f"unknown compression codec id {cid}" in str(err)


def test_compress_rejects_unknown_codec_and_bad_levels() -> None:
    with pytest.raises(ConfigError):
        compress(5, SMALL)
    for codec, bad in ((GZIP, 0), (GZIP, 10), (LZ4, 0), (LZ4, 18), (ZSTD, 23)):
        with pytest.raises(ConfigError):
            compress(codec, SMALL, bad)


@pytest.mark.parametrize(
    ("codec", "level"),
    [
        (GZIP, 1),
        (GZIP, 9),
        (GZIP, -1),
        (LZ4, 1),
        (LZ4, 17),
        (ZSTD, -5),
        (ZSTD, 1),
        (ZSTD, 19),
        (SNAPPY, 7),
        (NONE, 3),
    ],
)
def test_levels(codec: int, level: int) -> None:
    assert decompress(codec, compress(codec, TEXT_300K, level)) == TEXT_300K


@pytest.mark.parametrize("magic", [0, 1])
def test_zstd_is_illegal_before_magic_2(magic: int) -> None:
    packed = compress(ZSTD, SMALL)
    err = _expect_corrupt(ZSTD, packed, magic=magic)
    assert "zstd" in str(err) and "magic" in str(err)
    assert decompress(ZSTD, packed, magic=2) == SMALL


# --- exact framing ----------------------------------------------------------------------------


def test_xerial_snappy_layout() -> None:
    data = TEXT_300K[:100_000]
    packed = compress(SNAPPY, data)
    assert packed[:16] == bytes.fromhex("82534e41505059000000000100000001")
    assert compress(SNAPPY, b"") == packed[:16]  # snappy-java writes the header eagerly
    pos, sizes = 16, []
    while pos < len(packed):
        n = int.from_bytes(packed[pos : pos + 4], "big")
        block = packed[pos + 4 : pos + 4 + n]
        assert len(block) == n
        sizes.append(cramjam.snappy.decompress_raw_len(block))
        pos += 4 + n
    assert pos == len(packed)
    assert sizes == [32768, 32768, 32768, 100_000 - 3 * 32768]


def test_lz4_kafka_frame_layout() -> None:
    # compressible block, incompressible block (stored), short compressible last block
    data = TEXT_300K[:65536] + RANDOM_100K[:65536] + TEXT_300K[:1000]
    packed = compress(LZ4, data)
    assert packed[:7] == bytes.fromhex("04224d18604082")
    assert compression._lz4_header_checksum(b"\x60\x40") == 0x82
    assert compress(LZ4, b"") == bytes.fromhex("04224d18604082 00000000")
    pos, out, stored = 7, bytearray(), []
    scratch = bytearray(65536)
    while True:
        word = int.from_bytes(packed[pos : pos + 4], "little")
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        block = packed[pos : pos + size]
        pos += size
        stored.append(bool(word & 0x80000000))
        if word & 0x80000000:
            out += block
        else:
            out += scratch[: cramjam.lz4.decompress_block_into(block, scratch)]
    assert pos == len(packed)  # the end mark is last: no content checksum
    assert stored == [False, True, False]
    assert out == data
    info = lz4_frame.get_frame_info(packed)
    assert info["block_linked"] is False
    assert info["block_size"] == 65536
    assert info["content_checksum"] is False
    assert info["block_checksum"] is False
    assert lz4_frame.decompress(packed) == data


def test_gzip_writes_one_member() -> None:
    packed = compress(GZIP, TEXT_300K)
    assert packed[:3] == b"\x1f\x8b\x08"
    d = zlib.decompressobj(wbits=31)
    assert d.decompress(packed) == TEXT_300K
    assert d.eof and d.unused_data == b""


def test_zstd_writes_one_frame() -> None:
    packed = compress(ZSTD, TEXT_300K)
    assert packed[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(packed) == TEXT_300K


# --- interoperability -------------------------------------------------------------------------


Codec = Callable[[bytes], bytes]
INTEROP: dict[int, tuple[Callable[[], bool], Codec, Codec]] = {
    GZIP: (kc.has_gzip, kc.gzip_encode, kc.gzip_decode),
    SNAPPY: (kc.has_snappy, kc.snappy_encode, kc.snappy_decode),
    LZ4: (kc.has_lz4, lambda b: kc.lz4_encode(b), lambda b: kc.lz4_decode(b)),
    ZSTD: (kc.has_zstd, kc.zstd_encode, kc.zstd_decode),
}


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=CODEC_NAMES.get)
@pytest.mark.parametrize(
    "data", [b"", SMALL, TEXT_300K, RANDOM_100K], ids=["empty", "small", "text", "random"]
)
def test_kafka_python_interop(codec: int, data: bytes) -> None:
    has, encode, decode = INTEROP[codec]
    if not has():
        pytest.skip(f"kafka-python reports no {CODEC_NAMES[codec]} support (kafka.codec.has_*)")
    assert decompress(codec, encode(data)) == data
    if codec == SNAPPY and not data:
        # snappy-java writes just the 16-byte header for an empty stream; kafka-python only
        # detects xerial framing when the input is longer than 16 bytes, so it cannot read it.
        return
    assert decode(compress(codec, data)) == data


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"store_size": False},
        {"block_checksum": True},
        {"content_checksum": True},
        {"block_checksum": True, "content_checksum": True, "store_size": True},
        {"block_size": lz4_frame.BLOCKSIZE_MAX256KB},
        {"block_size": lz4_frame.BLOCKSIZE_MAX1MB, "block_checksum": True},
        {"block_size": lz4_frame.BLOCKSIZE_MAX4MB},
    ],
)
def test_lz4_frames_from_python_lz4(kwargs: dict[str, object]) -> None:
    data = TEXT_300K + RANDOM_100K + bytes(300_000)
    frame = lz4_frame.compress(data, block_linked=False, **kwargs)
    assert decompress(LZ4, frame) == data
    assert decompress(LZ4, frame, magic=1, max_size=len(data)) == data


def test_xxh32_vectors() -> None:
    vectors = {
        b"": 0x02CC5D05,
        b"a": 0x550D7456,
        b"abc": 0x32D153FF,
        b"Nobody inspects the spammish repetition": 0xE2293B2F,
    }
    for data, want in vectors.items():
        assert compression._xxh32(data) == want


def test_lz4_block_checksum_mismatch() -> None:
    frame = bytearray(lz4_frame.compress(TEXT_300K, block_linked=False, block_checksum=True))
    # The first block's checksum sits right before the second block's size field; flip the
    # last byte of the first block's checksum by locating it from the first block's size.
    first = int.from_bytes(frame[15:19], "little") & 0x7FFFFFFF  # header is 15 bytes (+size)
    frame[19 + first + 3] ^= 0x01
    err = _expect_corrupt(LZ4, bytes(frame))
    assert "checksum" in str(err)


def test_lz4_rejects_dependent_blocks() -> None:
    frame = lz4_frame.compress(TEXT_300K, block_linked=True)
    err = _expect_corrupt(LZ4, frame)
    assert "dependent" in str(err)
    assert err.position == 4


# --- real snappy-java data and other snappy forms ---------------------------------------------


def test_snappy_java_stream_fixture() -> None:
    if not SNAPPY_JAVA_STREAM.exists():
        pytest.skip(f"../shared/fixtures not present: {SNAPPY_JAVA_STREAM}")
    stream = SNAPPY_JAVA_STREAM.read_bytes()
    expected = SNAPPY_JAVA_STREAM.with_name(SNAPPY_JAVA_STREAM.name + ".decompressed").read_bytes()
    assert len(expected) == 11528
    assert decompress(SNAPPY, stream) == expected
    assert decompress(SNAPPY, stream, max_size=len(expected)) == expected
    _expect_corrupt(SNAPPY, stream, max_size=len(expected) - 1)
    for cut in (len(stream) - 1, len(stream) - 3000, 17):
        _expect_corrupt(SNAPPY, stream[:cut])


def test_raw_snappy_decodes() -> None:
    for data in (b"", SMALL, TEXT_300K):
        assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
        if kc.has_snappy():
            assert decompress(SNAPPY, kc.snappy_encode(data, xerial_compatible=False)) == data


def test_concatenated_xerial_streams() -> None:
    """snappy-java's SnappyInputStream accepts a second header where a chunk length would be."""
    assert decompress(SNAPPY, compress(SNAPPY, SMALL) + compress(SNAPPY, TEXT_300K)) == (SMALL + TEXT_300K)
    assert decompress(SNAPPY, compress(SNAPPY, b"") + compress(SNAPPY, SMALL)) == SMALL


def test_xerial_chunk_errors() -> None:
    header = compress(SNAPPY, b"")
    err = _expect_corrupt(SNAPPY, header + b"\xff\xff\xff\xfe" + b"x" * 10)
    assert "negative" in str(err) and err.position == 16
    err = _expect_corrupt(SNAPPY, header + b"\x00\x00\x10\x00" + b"x" * 10)
    assert "past the end" in str(err) and err.position == 16
    err = _expect_corrupt(SNAPPY, header + b"\x00\x00")
    assert "truncated" in str(err) and err.position == 16
    # A block declaring far more output than snappy can encode is refused before allocating.
    err = _expect_corrupt(SNAPPY, header + b"\x00\x00\x00\x06\xff\xff\xff\xff\x0f\x00")
    assert "impossible" in str(err)


# --- gzip and zstd streams --------------------------------------------------------------------


def test_gzip_concatenated_members() -> None:
    packed = gzip.compress(SMALL) + gzip.compress(TEXT_300K, compresslevel=1)
    assert decompress(GZIP, packed) == SMALL + TEXT_300K
    assert decompress(GZIP, packed, max_size=len(SMALL) + len(TEXT_300K)) == SMALL + TEXT_300K


@pytest.mark.parametrize("data", [b"", SMALL, TEXT_300K, TEXT_300K * 5], ids=["0", "s", "m", "l"])
def test_zstd_frames_without_content_size(data: bytes) -> None:
    for frame in (_zstd_stream_writer(data), _zstd_compressobj(data)):
        if data:  # (for an empty input zstandard does record a content size of 0)
            params = zstandard.get_frame_parameters(frame)
            assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
        assert decompress(ZSTD, frame) == data
        assert decompress(ZSTD, frame, max_size=len(data)) == data
        if data:
            _expect_corrupt(ZSTD, frame, max_size=len(data) - 1)


def test_zstd_concatenated_frames() -> None:
    two = _zstd_stream_writer(TEXT_300K) + _zstd_compressobj(SMALL)
    assert decompress(ZSTD, two) == TEXT_300K + SMALL
    assert decompress(ZSTD, two, max_size=len(TEXT_300K) + len(SMALL)) == TEXT_300K + SMALL
    three = compress(ZSTD, SMALL) + _zstd_stream_writer(b"") + compress(ZSTD, RANDOM_100K)
    assert decompress(ZSTD, three) == SMALL + RANDOM_100K


# --- corruption -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=CODEC_NAMES.get)
@pytest.mark.parametrize("data", [SMALL, MULTI_BLOCK], ids=["one-block", "multi-block"])
def test_every_truncation_is_corrupt(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    for cut in range(len(packed)):
        if codec == SNAPPY:
            # xerial has no end marker: a cut at a chunk boundary is a valid shorter stream.
            try:
                out = decompress(SNAPPY, packed[:cut])
            except CorruptRecordError as err:
                assert err.position is not None and 0 <= err.position <= cut
            else:
                assert cut >= 16 and data.startswith(out)
        else:
            _expect_corrupt(codec, packed[:cut])


def _check_mutated(codec: int, original: bytes, mutated: bytes, magic: int = 2) -> None:
    limit = 4 * len(original) + 1024
    try:
        out = decompress(codec, mutated, magic=magic, max_size=limit)
    except CorruptRecordError as err:
        assert err.position is not None and 0 <= err.position <= len(mutated)
        assert CODEC_NAMES[codec] in err.reason
    else:
        assert isinstance(out, bytes) and len(out) <= limit


PACKED = {codec: {d: compress(codec, d) for d in (SMALL, MULTI_BLOCK)} for codec in ALL_CODECS}


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=CODEC_NAMES.get)
@settings(max_examples=150, deadline=None)
@given(
    which=st.sampled_from([SMALL, MULTI_BLOCK]),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    magic=st.sampled_from([0, 1, 2]),
)
def test_mutations_raise_only_corrupt_record_error(
    codec: int, which: bytes, edits: list[tuple[int, int]], magic: int
) -> None:
    packed = bytearray(PACKED[codec][which])
    for pos, value in edits:
        packed[pos % len(packed)] = value
    if codec == ZSTD and magic < 2:
        magic = 2
    _check_mutated(codec, which, bytes(packed), magic)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=CODEC_NAMES.get)
@settings(max_examples=100, deadline=None)
@given(tail=st.binary(max_size=200), prefix=st.sampled_from([0, 4, 7, 16]))
def test_garbage_raises_only_corrupt_record_error(codec: int, tail: bytes, prefix: int) -> None:
    # Keep a valid-looking start (magic / header) so the parsers get past their first checks.
    packed = PACKED[codec][SMALL]
    _check_mutated(codec, SMALL, packed[:prefix] + tail)


def test_lz4_frame_errors() -> None:
    good = PACKED[LZ4][MULTI_BLOCK]

    def patched(pos: int, value: int) -> bytes:
        b = bytearray(good)
        b[pos] = value
        return bytes(b)

    cases = [
        (b"\x05" + good[1:], "magic", 0),
        (patched(4, 0xA0), "version", 4),
        (patched(4, 0x61), "reserved", 4),
        (patched(5, 0x30), "block size id", 5),
        (patched(5, 0x41), "reserved", 5),
        (patched(6, 0x83), "checksum", 6),
        (good + b"\x00", "after the end mark", len(good)),
        (good[:7] + (0x10000 + 1).to_bytes(4, "little") + good[11:], "exceeds", 7),
        (good[:7] + (0x8000FFFF).to_bytes(4, "little") + good[11:], None, None),
    ]
    for data, words, pos in cases:
        err = _expect_corrupt(LZ4, data)
        assert str(err).startswith(f"byte {err.position}: lz4: ")
        if words is not None:
            assert words in err.reason, (words, err)
            assert err.position == pos, (words, err)


def test_native_errors_are_chained() -> None:
    for codec in (GZIP, ZSTD, SNAPPY, LZ4):
        bad = bytearray(PACKED[codec][SMALL])
        bad[len(bad) // 2 :] = b"\xff" * (len(bad) - len(bad) // 2)
        try:
            decompress(codec, bytes(bad))
        except CorruptRecordError as err:
            assert err.reason.startswith(CODEC_NAMES[codec] + ": ")
            if codec in (GZIP, ZSTD):
                assert err.position == 0
                assert err.__cause__ is not None


# --- decompression bounds ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS, ids=CODEC_NAMES.get)
def test_max_size(codec: int) -> None:
    data = TEXT_300K
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=len(data)) == data
    err = _expect_corrupt(codec, packed, max_size=len(data) - 1)
    assert "max_size" in str(err)
    assert decompress(codec, compress(codec, b""), max_size=0) == b""
    with pytest.raises(ConfigError):
        decompress(codec, packed, max_size=-1)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=CODEC_NAMES.get)
def test_decompression_bomb_stays_bounded(codec: int) -> None:
    bomb = compress(codec, bytes(32 * 1024 * 1024))
    assert len(bomb) < 2 * 1024 * 1024
    limit = 1024 * 1024
    tracemalloc.start()
    try:
        err = _expect_corrupt(codec, bomb, max_size=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "max_size" in str(err)
    assert peak < 4 * limit, peak


# --- legacy lz4 (magic 0) header checksum ------------------------------------------------------


def _with_broken_hc(frame: bytes) -> bytes:
    """What Kafka's magic-0 writer produced: HC computed over magic + FLG + BD (KAFKA-3160)."""
    hc_pos = 6 + 8 if frame[4] & 0x08 else 6
    broken = compression._lz4_header_checksum(frame[:hc_pos])
    assert broken != frame[hc_pos]
    return frame[:hc_pos] + bytes([broken]) + frame[hc_pos + 1 :]


@pytest.mark.parametrize(
    "frame",
    [compress(LZ4, MULTI_BLOCK), lz4_frame.compress(MULTI_BLOCK, block_linked=False)],
    ids=["kafka", "python-lz4-with-content-size"],
)
def test_lz4_magic0_broken_header_checksum(frame: bytes) -> None:
    legacy = _with_broken_hc(frame)
    assert decompress(LZ4, legacy, magic=0) == MULTI_BLOCK
    assert decompress(LZ4, frame, magic=0) == MULTI_BLOCK  # a correct HC is accepted too
    for magic in (1, 2):
        err = _expect_corrupt(LZ4, legacy, magic=magic)
        assert "checksum" in str(err)
