"""Kafka's default partitioner (murmur2): golden vectors, kafka-python agreement, array inputs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kp_murmur2

from pylog.storage.codec import _kernels
from pylog.storage.codec.partitioner import murmur2, murmur2_one, partition_for_keys
from pylog.storage.errors import ConfigError

# Java clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java testMurmur2 (signed).
JAVA_VECTORS: dict[bytes, int] = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# librdkafka src/rdmurmur2.c unittest_murmur2 (unsigned).
LIBRDKAFKA_VECTORS: dict[bytes, int] = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"": 0x106E08D9,
}

# kafka-python test/producer/test_partitioner.py test_murmur2_java_compatibility (1000 parts).
KAFKA_PYTHON_1000: dict[bytes, int] = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}

BINARY_TYPES = [pa.binary(), pa.large_binary()]


def signed(u: int) -> int:
    return u - (1 << 32) if u & 0x80000000 else u


def reference(keys: list[bytes | None]) -> np.ndarray:
    return np.array([0 if k is None else signed(kp_murmur2(k)) for k in keys], dtype=np.int32)


# ---------------------------------------------------------------------------- golden vectors


@pytest.mark.parametrize("typ", [None, *BINARY_TYPES])
def test_java_vectors(typ: pa.DataType | None) -> None:
    keys = list(JAVA_VECTORS)
    got = murmur2(keys if typ is None else pa.array(keys, type=typ))
    assert got.dtype == np.int32
    assert got.tolist() == list(JAVA_VECTORS.values())
    assert [murmur2_one(k) for k in keys] == list(JAVA_VECTORS.values())


@pytest.mark.parametrize("prefix", range(8))
def test_librdkafka_vectors_unaligned(prefix: int) -> None:
    # librdkafka also checks unaligned buffers: put each key behind `prefix` junk bytes, in
    # one data buffer, and slice the junk away.
    keys: list[bytes] = []
    for k in LIBRDKAFKA_VECTORS:
        keys += [b"\xff" * prefix, k]
    arr = pa.array(keys, type=pa.binary())
    got = murmur2(arr)[1::2].view(np.uint32)
    assert got.tolist() == list(LIBRDKAFKA_VECTORS.values())
    for k, u in LIBRDKAFKA_VECTORS.items():
        assert murmur2_one(k) == signed(u)
        assert murmur2_one(memoryview(b"\x00" * prefix + k)[prefix:]) == signed(u)


def test_kafka_python_1000_partitions() -> None:
    keys = list(KAFKA_PYTHON_1000)
    assert partition_for_keys(keys, 1000).tolist() == list(KAFKA_PYTHON_1000.values())
    got = partition_for_keys(pa.array(keys, type=pa.large_binary()), 1000)
    assert got.dtype == np.int32
    assert got.tolist() == list(KAFKA_PYTHON_1000.values())


# ---------------------------------------------------------------------------- agreement

keys_strategy = st.lists(
    st.one_of(st.binary(min_size=0, max_size=8), st.binary(min_size=1, max_size=200)),
    min_size=0,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(keys=keys_strategy, num_partitions=st.integers(1, 5000))
def test_agrees_with_kafka_python(keys: list[bytes], num_partitions: int) -> None:
    expected = reference(list(keys))
    assert murmur2(keys).tolist() == expected.tolist()
    for typ in BINARY_TYPES:
        assert murmur2(pa.array(keys, type=typ)).tolist() == expected.tolist()
    assert [murmur2_one(k) for k in keys] == expected.tolist()
    parts = [(kp_murmur2(k) & 0x7FFFFFFF) % num_partitions for k in keys]
    assert partition_for_keys(keys, num_partitions).tolist() == parts


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=40),
    data=st.data(),
)
def test_sliced_arrays_with_nulls(keys: list[bytes | None], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(keys)))
    stop = data.draw(st.integers(start, len(keys)))
    for typ in BINARY_TYPES:
        arr = pa.array(keys, type=typ)[start:stop]
        sub = keys[start:stop]
        assert murmur2(arr).tolist() == reference(sub).tolist()
        parts = partition_for_keys(arr, 7).tolist()
        assert parts == [-1 if k is None else (kp_murmur2(k) & 0x7FFFFFFF) % 7 for k in sub]


def test_mixed_lengths_including_outliers() -> None:
    rng = np.random.default_rng(7)
    lengths = [*rng.integers(0, 12, 3000).tolist(), 100, 1001, 4096, 65_537, 200_003, 3]
    keys = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    expected = [murmur2_one(k) for k in keys]
    assert murmur2(keys).tolist() == expected
    assert murmur2(pa.array(keys, type=pa.large_binary())).tolist() == expected
    # Spot-check the scalar helper itself on the outliers against kafka-python.
    for k in keys[-6:-1]:
        assert murmur2_one(k) == signed(kp_murmur2(k))


@pytest.mark.parametrize("n_long", [1, 2, 8, 9, 20])
def test_few_long_keys_scalar_tail(n_long: int) -> None:
    # Exercises the switch from the numpy block loop to the scalar tail at every count.
    rng = np.random.default_rng(n_long)
    keys = [rng.integers(0, 256, 500 + 37 * i, dtype=np.uint8).tobytes() for i in range(n_long)]
    keys += [b"short", b"", b"abcd"]
    assert murmur2(keys).tolist() == reference(list(keys)).tolist()


@pytest.mark.parametrize("kind", ["jit", "python"])
def test_both_kernel_copies_hash_a_sliced_array(kind: str) -> None:
    # the compiled kernel and its plain-Python copy (PYLOG_NO_JIT), keys read from an offset slice
    rng = np.random.default_rng(7)
    keys = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in rng.integers(0, 90, 400)]
    keys[10:10] = [b"", b"", b"abc", b"x" * 1000]
    arr = pa.array([*keys, None], type=pa.binary())[3:]
    previous = _kernels.use(kind)
    try:
        assert murmur2(arr).tolist() == reference([*keys[3:], None]).tolist()
    finally:
        _kernels.restore(previous)


# ---------------------------------------------------------------------------- nulls


def test_null_keys() -> None:
    keys = [b"abc", None, b"", None, b"21"]
    assert murmur2(keys).tolist() == [479470107, 0, signed(0x106E08D9), 0, -973932308]
    assert partition_for_keys(keys, 1000).tolist() == [
        107,
        -1,
        681,
        -1,
        (-973932308 & 0x7FFFFFFF) % 1000,
    ]
    assert partition_for_keys([None, None], 3).tolist() == [-1, -1]
    assert partition_for_keys(pa.nulls(3), 3).tolist() == [-1, -1, -1]


def test_null_slot_with_nonzero_length() -> None:
    # Arrow allows a null slot to span bytes of the data buffer; they must not be hashed.
    offsets = np.array([0, 3, 8, 10], dtype=np.int32)
    validity = pa.py_buffer(bytes([0b101]))
    arr = pa.Array.from_buffers(
        pa.binary(), 3, [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"abcXXXXX21")]
    )
    assert arr.to_pylist() == [b"abc", None, b"21"]
    assert murmur2(arr).tolist() == [479470107, 0, -973932308]
    assert partition_for_keys(arr, 10).tolist()[1] == -1


# ---------------------------------------------------------------------------- other inputs


def test_string_and_other_arrow_types() -> None:
    strings = ["21", "foobar", None, "abc"]
    expected = [-973932308, -790332482, 0, 479470107]
    for typ in [pa.string(), pa.large_string(), pa.string_view(), pa.binary_view()]:
        assert murmur2(pa.array(strings, type=typ)).tolist() == expected
    assert murmur2(pa.array(strings).dictionary_encode()).tolist() == expected
    assert murmur2(pa.chunked_array([["21"], [], ["foobar", None, "abc"]])).tolist() == expected
    fixed = pa.array([b"abc", b"xyz", None, b"foo"], type=pa.binary(3))[1:]
    assert murmur2(fixed).tolist() == [murmur2_one(b"xyz"), 0, murmur2_one(b"foo")]


def test_sequence_inputs() -> None:
    keys = [b"abc", bytearray(b"21"), memoryview(b"foobar")]
    assert murmur2(keys).tolist() == [479470107, -973932308, -790332482]
    assert murmur2(tuple(keys)).tolist() == [479470107, -973932308, -790332482]
    assert murmur2(k for k in [b"abc"]).tolist() == [479470107]  # type: ignore[arg-type]


def test_empty_inputs() -> None:
    empty: list[bytes] = []
    for keys in (empty, pa.array([], type=pa.binary()), pa.chunked_array([], type=pa.binary())):
        for got in (murmur2(keys), partition_for_keys(keys, 3)):
            assert got.dtype == np.int32
            assert len(got) == 0


def test_bad_inputs() -> None:
    with pytest.raises(TypeError):
        murmur2(b"abc")
    with pytest.raises(TypeError):
        murmur2(pa.array([1, 2, 3]))


@pytest.mark.parametrize("n", [0, -1, 2**31, True, 1.5, "3"])
def test_num_partitions_validated(n: object) -> None:
    with pytest.raises(ConfigError):
        partition_for_keys([b"a"], n)  # type: ignore[arg-type]


def test_one_partition_and_max_partitions() -> None:
    keys = [b"a", b"bb", None]
    assert partition_for_keys(keys, 1).tolist() == [0, 0, -1]
    big = 2**31 - 1
    expected = [(kp_murmur2(k) & 0x7FFFFFFF) % big for k in keys[:2]]
    assert partition_for_keys(keys, big).tolist() == [*expected, -1]
    assert partition_for_keys(keys, np.int64(5)).tolist()[2] == -1
