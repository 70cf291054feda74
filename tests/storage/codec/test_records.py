"""RecordBatch v2 codec: golden bytes, broker fixtures, kafka-python interop, properties."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pylog.storage.codec import batch as B
from pylog.storage.codec import compression, records
from pylog.storage.errors import CorruptRecordError
from tests.kafka_fixtures import b64, expected_records, manifest_logs, require_fixtures

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def split_batches(data: bytes) -> list[bytes]:
    out, p = [], 0
    while p < len(data):
        size = struct.unpack_from(">i", data, p + 8)[0] + 12
        out.append(data[p : p + size])
        p += size
    return out


def kafka_python_decode(data: bytes) -> list[tuple]:
    rows = []
    for raw in split_batches(data):
        b = DefaultRecordBatch(raw)
        assert b.validate_crc(), "kafka-python rejects the CRC of a batch pylog wrote"
        rows.extend((r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in b)
    return rows


def pylog_rows(rs: records.RecordSet) -> list[tuple]:
    t = rs.records.to_pydict()
    return [
        (o, ts, k, v, [(h["key"], h["value"]) for h in hs])
        for o, ts, k, v, hs in zip(
            t["offset"], t["timestamp"], t["key"], t["value"], t["headers"], strict=True
        )
    ]


# --------------------------------------------------------------------------- golden bytes


def test_commit_marker_is_byte_exact() -> None:
    # kafka-format.md §1.3: COMMIT marker, baseOffset 10, PLE 3, pid 1000, epoch 5,
    # ts 1700000000000, coordinatorEpoch 7
    expected = bytes.fromhex(
        "000000000000000a00000042000000030240d514e90030000000000000018bcfe568000000018bcfe568"
        "0000000000000003e80005ffffffff000000012000000008000000010c00000000000700"
    )
    got = records.control_batch(
        B.COMMIT,
        offset=10,
        producer_id=1000,
        producer_epoch=5,
        coordinator_epoch=7,
        timestamp=1700000000000,
        partition_leader_epoch=3,
    )
    assert got == expected
    rs = records.decode(got)
    assert rs.batches.is_control.tolist() == [True] and rs.batches.is_transactional.tolist() == [True]
    assert B.control_type(rs.records.column("key")[0].as_py()) == B.COMMIT
    assert B.end_txn_marker(rs.records.column("value")[0].as_py()) == (0, 7)
    assert rs.data_records().num_rows == 0


def test_aiokafka_builder_crc_vector() -> None:
    # aiokafka tests/record/test_default_records.py: uncompressed builder CRC 3950153926
    enc = records.encode(
        [b"Super"] * 10,
        [b"test"] * 10,
        np.arange(10) + 9999999,
        [[("header1", b"aaa"), ("header2", b"bbb")]] * 10,
        producer_id=123456,
        producer_epoch=123,
        base_sequence=9999,
        is_transactional=True,
    )
    assert enc.batches.crc.tolist() == [3950153926]


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (-65, "8101"),
        (8191, "fe7f"),
        (8192, "808001"),
        (2**31 - 1, "feffffff0f"),
        (-(2**31), "ffffffff0f"),
    ],
)
def test_varint_golden_vectors(kernels: str, value: int, encoded: str) -> None:
    from pylog.storage.codec import _kernels

    k = _kernels.active()
    out = np.zeros(10, np.uint8)
    end = k.write_varint(out, 0, value)
    assert out[:end].tobytes().hex() == encoded
    assert k.varint_size(value) == len(encoded) // 2
    got, p = k.read_varint(np.frombuffer(bytes.fromhex(encoded), np.uint8), 0, len(encoded) // 2, 10)
    assert (got, p) == (value, len(encoded) // 2)


def test_vectorized_varint_sizes_match_kernel() -> None:
    from pylog.storage.codec import _kernels
    from pylog.storage.codec.columns import varint_sizes

    vals = np.array([0, 1, -1, 63, -64, 64, 2**31 - 1, -(2**31), INT64_MAX, INT64_MIN, 2**56, -(2**56)])
    assert varint_sizes(vals).tolist() == [_kernels.python.varint_size(int(v)) for v in vals]


# --------------------------------------------------------------------------- fixtures

LOGS = manifest_logs()


@pytest.mark.parametrize("entry", LOGS or [None], ids=[e["log"] for e in LOGS] or ["absent"])
def test_broker_fixture_decodes_to_expected(entry: dict | None, kernels: str) -> None:
    root = require_fixtures()
    assert entry is not None
    data = (root / entry["log"]).read_bytes()
    if entry["expected_corrupt"]:
        with pytest.raises(CorruptRecordError) as ei:
            records.decode(data, path=entry["log"])
        assert ei.value.position == 0 and "CRC mismatch" in str(ei.value)
        assert "0x58585858" in str(ei.value) and "0x7e196bb4" in str(ei.value)
        data_rs = records.decode(data, verify_crc=False)
    else:
        data_rs = records.decode(data, path=entry["log"])
    assert data_rs.end == len(data) and data_rs.torn_bytes == 0
    expected = expected_records(entry)
    got = data_rs.records.to_pylist()
    assert len(got) == len(expected) == entry["records"]
    for g, e, bi in zip(got, expected, data_rs.batch_index.tolist(), strict=True):
        assert g["offset"] == e["offset"]
        assert g["timestamp"] == e["timestamp"]
        assert g["timestampType"] == e["timestamp_type"]
        assert g["key"] == b64(e["key_b64"])
        assert g["value"] == b64(e["value_b64"])
        assert [(h["key"], h["value"]) for h in g["headers"]] == [(k, b64(v)) for k, v in e["headers"]]
        assert int(data_rs.batches.magic[bi]) == e["magic"]
        assert compression.CODEC_NAMES[int(data_rs.batches.codec[bi])] == e["codec"]
        if e["magic"] == 2:
            assert int(data_rs.batches.base_offset[bi]) == e["batch_base_offset"]
        else:
            assert int(data_rs.batches.last_offset[bi]) == e["batch_base_offset"]


# --------------------------------------------------------------------------- interop

keys = st.one_of(st.none(), st.binary(max_size=40))
values = st.one_of(st.none(), st.binary(max_size=300))
header_lists = st.lists(
    st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
)
timestamps = st.integers(min_value=0, max_value=2**41)
record_lists = st.lists(st.tuples(keys, values, timestamps, header_lists), min_size=1, max_size=40)


def _kafka_python_codec(name: str) -> int:
    import kafka.codec as kc

    have = {"none": True, "gzip": True, "snappy": kc.has_snappy(), "lz4": kc.has_lz4(), "zstd": kc.has_zstd()}
    if not have[name]:
        pytest.skip(f"kafka-python lacks {name} support in this environment (install its codec extra)")
    return compression.codec_id(name)


@pytest.mark.parametrize("codec", CODECS)
@SETTINGS
@given(recs=record_lists, base=st.integers(0, 2**40))
def test_pylog_batches_decode_in_kafka_python(codec: str, recs: list, base: int) -> None:
    _kafka_python_codec(codec)
    ks, vs, ts, hs = zip(*recs, strict=True)
    enc = records.encode(
        list(vs), list(ks), np.array(ts), list(hs), base_offset=base, codec=codec, batch_bytes=512
    )
    got = kafka_python_decode(enc.tobytes())
    want = [(base + i, t, k, v, h) for i, (k, v, t, h) in enumerate(recs)]
    assert got == want


@pytest.mark.parametrize("codec", CODECS)
@SETTINGS
@given(recs=record_lists, base=st.integers(0, 2**40))
def test_kafka_python_batches_decode_in_pylog(codec: str, recs: list, base: int) -> None:
    cid = _kafka_python_codec(codec)
    builder = DefaultRecordBatchBuilder(2, cid, False, -1, -1, -1, 1 << 30)
    for i, (k, v, t, h) in enumerate(recs):
        assert builder.append(i, t, k, v, h) is not None
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)  # kafka-python always writes base offset 0
    rs = records.decode(bytes(raw))
    assert pylog_rows(rs) == [(base + i, t, k, v, h) for i, (k, v, t, h) in enumerate(recs)]
    # kafka-python stores a batch uncompressed when compressing does not make it smaller
    assert rs.batches.codec.tolist()[0] in (cid, 0)


# --------------------------------------------------------------------------- properties

any_ts = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


@pytest.mark.parametrize("codec", CODECS)
@SETTINGS
@given(
    recs=st.lists(st.tuples(keys, values, any_ts, header_lists), min_size=1, max_size=30),
    batch_bytes=st.integers(68, 4096),
    base=st.integers(0, 2**62),
)
def test_encode_decode_identity(kernels: str, codec: str, recs: list, batch_bytes: int, base: int) -> None:
    ks, vs, ts, hs = zip(*recs, strict=True)
    enc = records.encode(
        list(vs),
        list(ks),
        np.array(ts, dtype=np.int64),
        list(hs),
        base_offset=base,
        codec=codec,
        batch_bytes=batch_bytes,
    )
    rs = records.decode(enc.buffer)
    assert pylog_rows(rs) == [(base + i, t, k, v, h) for i, (k, v, t, h) in enumerate(recs)]
    assert rs.end == len(enc)
    # batch facts agree with what the encoder reported
    assert rs.batches.base_offset.tolist() == enc.batches.base_offset.tolist()
    assert rs.batches.size.tolist() == enc.batches.size.tolist()
    assert rs.batches.max_timestamp.tolist() == [
        max(ts[i] for i in range(len(recs)) if rs.batch_index[i] == b) for b in range(len(rs.batches))
    ]
    assert int(rs.batches.last_offset[-1]) == base + len(recs) - 1


def test_arrow_inputs_sliced_and_chunked(kernels: str) -> None:
    vals = pa.array([b"a", None, b"ccc", b"dddd", b""], pa.binary()).slice(1, 4)
    ks = pa.chunked_array([pa.array(["x", "y"]), pa.array([None, "z"])])
    hs = pa.array(
        [[{"key": "k", "value": b"v"}], None, [], [{"key": "é", "value": None}]],
        pa.list_(records.HEADER_TYPE),
    ).slice(0, 4)
    ts = pa.array([1, 2, 3, 4], pa.timestamp("ms"))
    rs = records.decode(records.encode(vals, ks, ts, hs).buffer)
    t = rs.records.to_pydict()
    assert t["value"] == [None, b"ccc", b"dddd", b""]
    assert t["key"] == [b"x", b"y", None, b"z"]
    assert t["timestamp"] == [1, 2, 3, 4]
    assert t["headers"] == [[{"key": "k", "value": b"v"}], [], [], [{"key": "é", "value": None}]]


@pytest.mark.parametrize("shape", ["big keys, null values", "small keys, big values"])
def test_decoded_columns_hold_about_their_own_bytes(kernels: str, shape: str) -> None:
    """Keys and values are copied out while the records are walked, into buffers bounded by
    the records' size: a column that uses little of its bound must not keep the rest."""
    n = 3000
    big = [bytes([i % 251]) * 700 for i in range(n)]
    small = [i.to_bytes(4, "big") for i in range(n)]
    ks, vs = (big, [None] * n) if shape == "big keys, null values" else (small, big)
    rs = records.decode(records.encode(vs, ks).buffer)
    t = rs.records
    assert t.column("key").to_pylist() == ks
    assert t.column("value").to_pylist() == vs
    for name, want in (("key", ks), ("value", vs)):
        used = sum(len(x) for x in want if x is not None)
        data = t.column(name).chunk(0).buffers()[2]
        assert data.size <= 2 * used + (1 << 20), f"{name}: {data.size} bytes held for {used}"


def test_threads_decoding_at_once_get_their_own_records(kernels: str) -> None:
    """Keys pass through a per-thread scratch buffer: concurrent decodes must not mix them."""
    from concurrent.futures import ThreadPoolExecutor

    bufs = [
        records.encode(
            [b"v%d" % j for j in range(2000)], [bytes([t]) * (1 + j % 40) for j in range(2000)]
        ).buffer
        for t in range(4)
    ]

    def keys(t: int) -> bool:
        return all(
            records.decode(bufs[t]).records.column("key").to_pylist()
            == [bytes([t]) * (1 + j % 40) for j in range(2000)]
            for _ in range(20)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(keys, range(4)))


def test_log_append_time_uses_max_timestamp() -> None:
    enc = records.encode([b"a", b"b"], timestamp=np.array([5, 9]), timestamp_type=1)
    rs = records.decode(enc.buffer)
    assert rs.records.column("timestamp").to_pylist() == [9, 9]
    assert rs.records.column("timestampType").to_pylist() == [1, 1]


def test_batches_split_at_target_size_and_record_limit() -> None:
    enc = records.encode([b"x" * 100] * 50, timestamp=0, batch_bytes=1000)
    assert (enc.batches.size <= 1000).all() and len(enc.batches) > 1
    assert int(enc.batches.records_count.sum()) == 50
    big = records.encode([b"x" * 5000, b"y"], timestamp=0, batch_bytes=1000)
    assert big.batches.records_count.tolist() == [1, 1]
    capped = records.encode([b"x"] * 10, timestamp=0, max_records=3)
    assert capped.batches.records_count.tolist() == [3, 3, 3, 1]


# --------------------------------------------------------------------------- corruption


def _sample(codec: str = "none") -> bytes:
    return records.encode(
        [b"value-%d" % i for i in range(6)],
        [b"k%d" % i for i in range(6)],
        np.arange(6) * 7,
        [[("h", b"x")]] * 6,
        codec=codec,
        batch_bytes=200,
    ).tobytes()


@pytest.mark.parametrize("codec", ["none", "gzip", "lz4"])
def test_every_truncation_raises_corrupt(kernels: str, codec: str) -> None:
    data = _sample(codec)
    ends = set(records.decode(data).batches.position.tolist()[1:]) | {len(data)}
    for cut in range(len(data)):
        if cut in ends or cut == 0:
            assert len(records.decode(data[:cut])) >= 0
            continue
        with pytest.raises(CorruptRecordError) as ei:
            records.decode(data[:cut], path="seg.log")
        assert ei.value.position is not None and "seg.log" in str(ei.value)
        torn = records.decode(data[:cut], allow_torn_tail=True)
        assert torn.end + torn.torn_bytes == cut


@SETTINGS
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255), verify=st.booleans())
def test_single_byte_mutations_only_raise_corrupt(kernels: str, pos: int, byte: int, verify: bool) -> None:
    data = bytearray(_sample())
    pos %= len(data)
    data[pos] = byte
    try:
        records.decode(bytes(data), verify_crc=verify)
    except CorruptRecordError as e:
        assert e.position is not None
        return
    if verify and byte != _sample()[pos]:
        # a mutation that still decodes must be outside the CRC: baseOffset, batchLength and the
        # partition leader epoch (bytes 0-15 of a batch) are not covered by it
        starts = records.decode(_sample()).batches.position.tolist()
        assert any(s <= pos < s + 16 for s in starts)


def test_absurd_record_count_is_rejected_before_allocating() -> None:
    raw = bytearray(_sample())
    struct.pack_into(">i", raw, 57, 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="record count"):
        records.decode(bytes(raw), verify_crc=False)


def test_unknown_magic_and_codec() -> None:
    raw = bytearray(_sample())
    raw[16] = 7
    with pytest.raises(CorruptRecordError, match="unknown magic 7"):
        records.decode(bytes(raw))
    raw = bytearray(_sample())
    raw[22] |= 0x05
    with pytest.raises(CorruptRecordError, match="codec id 5"):
        records.decode(bytes(raw), verify_crc=False)


def test_invalid_utf8_header_key_is_corrupt() -> None:
    raw = bytearray(records.encode([b"v"], None, 0, [[("ab", b"x")]]).tobytes())
    i = raw.index(b"ab")
    raw[i] = 0xFF
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        records.decode(bytes(raw), verify_crc=False)


def test_header_layout_matches_kafka_python() -> None:
    """The header offsets derived from pylog's field list agree with an independent codec."""
    assert B.HEADER.format == DefaultRecordBatch.HEADER_STRUCT.format and B.HEADER_SIZE == 61
    assert B.HEADER_AT["crc"] == DefaultRecordBatch.CRC_OFFSET
    assert B.HEADER_AT["attributes"] == DefaultRecordBatch.ATTRIBUTES_OFFSET
    assert B.HEADER_AT["partition_leader_epoch"] == DefaultRecordBatch.AFTER_LEN_OFFSET == B.LOG_OVERHEAD
    enc = records.encode([b"a", b"bb"], [b"k", None], [5, 9], base_offset=40, producer_id=7, base_sequence=3)
    names = [name for name, _ in B.HEADER_FIELDS]
    fields = dict(zip(names, B.HEADER.unpack_from(enc.tobytes()), strict=True))
    kp = DefaultRecordBatch(enc.tobytes())
    assert (fields["base_offset"], fields["last_offset_delta"], fields["records_count"]) == (40, 1, 2)
    assert (fields["max_timestamp"], fields["producer_id"], fields["base_sequence"]) == (9, 7, 3)
    assert kp.validate_crc() and fields["crc"] == kp.crc


def test_cleaner_walk_and_decode_fail_alike(kernels: str) -> None:
    """The cleaner's record walk (rewrite.walk) and decoding share one walker: a corrupt
    records section (with a valid CRC) fails both with the same message, and a section that
    still walks yields the records decoding returns."""
    from pylog.storage.codec import rewrite

    enc = records.encode([b"val", None, b"v" * 20], [b"key", b"k2", None], 7, [[("h", b"x")], [], []])
    good = enc.tobytes()
    for pos in range(B.HEADER_SIZE, len(good)):
        for byte in (0x00, 0x05, 0x7F, 0xFF):
            data = np.frombuffer(good, np.uint8).copy()
            data[pos] = byte
            B.write_crcs(data, np.array([0]), np.array([len(good)]))
            headers = B.parse_headers(data, np.array([0]), np.array([len(good)]), np.array([2]))
            try:
                rs = records.decode(data)
            except CorruptRecordError as e:
                if "UTF-8" in str(e):  # header key text is checked by decoding only
                    continue
                with pytest.raises(CorruptRecordError) as walked:
                    rewrite.walk(data, headers)
                assert str(walked.value) == str(e)
                continue
            spans = rewrite.walk(data, headers)
            assert spans.keys() == rs.records.column("key").to_pylist()
            assert spans.offset.tolist() == rs.records.column("offset").to_pylist()
