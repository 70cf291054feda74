"""The broker's checks of produced record sets, the append-time stamp, and fetched bytes cut at a
bound (pylog.server.records)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")

from pylog.server import records as R
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.codec.encoding import encode
from pylog.storage.config import LogConfig


def batches(n: int = 3, *, keys: bool = True, codec: str = "none", **kw: object) -> bytes:
    values = [b"v%d" % i for i in range(n)]
    key = [b"k%d" % i for i in range(n)] if keys else None
    return bytes(encode(values, key, 1_000, codec=codec, batch_bytes=80, **kw).buffer)  # type: ignore[arg-type]


def test_a_valid_set_is_kept_as_sent_with_its_producer_fields() -> None:
    data = batches(5, codec="zstd", producer_id=7, producer_epoch=1, base_sequence=10)
    got = R.check_produced(data, LogConfig(), "t-0", now=5)
    assert got.data == data and got.offsets == 5
    assert (got.producer_id, got.producer_epoch, got.base_sequence) == (7, 1, 10)
    assert got.last_sequence == 14 and got.log_append_time == -1


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (lambda d: d[:-3], R.CORRUPT_MESSAGE),  # torn
        (lambda d: d[:30] + bytes([d[30] ^ 0xFF]) + d[31:], R.CORRUPT_MESSAGE),  # CRC
        (lambda d: b"", R.CORRUPT_MESSAGE),
    ],
)
def test_damaged_sets_are_refused_with_kafkas_code(damage, code) -> None:
    with pytest.raises(R.RecordSetError) as e:
        R.check_produced(damage(batches()), LogConfig(), "t-0", now=5)
    assert (e.value.code == code and "t-0" in str(e.value)) or e.value.code == code


def test_size_limit_and_null_keys_of_compacted_topics() -> None:
    big = bytes(encode([b"x" * 50] * 10, [b"k"] * 10, 1_000).buffer)  # one batch of ~700 bytes
    with pytest.raises(R.RecordSetError) as e:
        R.check_produced(big, LogConfig.from_dict({"max.message.bytes": 100}), "t-0", now=5)
    assert e.value.code == R.MESSAGE_TOO_LARGE and "max.message.bytes=100" in str(e.value)
    with pytest.raises(R.RecordSetError) as e:  # a batch no segment can hold
        R.check_produced(big, LogConfig.from_dict({"segment.bytes": 500}), "t-0", now=5)
    assert e.value.code == R.RECORD_LIST_TOO_LARGE and "segment.bytes=500" in str(e.value)
    compact = LogConfig.from_dict({"cleanup.policy": "compact"})
    with pytest.raises(R.RecordSetError) as e:
        R.check_produced(batches(keys=False), compact, "t-0", now=5)
    assert e.value.code == R.INVALID_RECORD
    assert R.check_produced(batches(), compact, "t-0", now=5).offsets == 3


def test_log_append_time_is_stamped_with_a_valid_crc() -> None:
    cfg = LogConfig.from_dict({"message.timestamp.type": "LogAppendTime"})
    got = R.check_produced(batches(4, codec="gzip"), cfg, "t-0", now=123_456)
    assert got.log_append_time == 123_456
    decoded = records.decode(got.data)  # checks every CRC
    h = decoded.batches
    assert (h.max_timestamp == 123_456).all() and (h.timestamp_type == B.LOG_APPEND_TIME).all()
    assert decoded.records.column("value").to_pylist() == [b"v0", b"v1", b"v2", b"v3"]


def test_fetched_bytes_are_cut_before_the_first_batch_at_the_bound() -> None:
    data = memoryview(batches(6))  # small batches: several per set
    buf = np.frombuffer(data, np.uint8)
    scan = B.scan_entries(buf)
    h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
    assert len(h) > 2
    bound = int(h.base_offset[2])
    cut = R.cut_below(data, bound)
    assert len(cut) == int(h.position[2])
    assert R.cut_below(data, 0).nbytes == 0 and len(R.cut_below(data, 10**9)) == len(data)
    assert R.offsets_spanned(bytes(data)) == 6
