"""Record sets over the wire: the broker's checks of a produced set, and fetched bytes cut at a bound.

A produced record set is appended as its client encoded it (compressed batches stay compressed):
the server checks it as a Kafka broker does before anything is written —

    | check                                         | Kafka error                          |
    |-----------------------------------------------|--------------------------------------|
    | whole entries, sizes, magic 0..2, CRC-32C     | CORRUPT_MESSAGE (2)                  |
    | magic 2 only (RecordBatch v2)                 | UNSUPPORTED_FOR_MESSAGE_FORMAT (43)  |
    | each batch within ``max.message.bytes``       | MESSAGE_TOO_LARGE (10)               |
    | each batch within ``segment.bytes``           | RECORD_LIST_TOO_LARGE (18)           |
    | no null key in a compacted topic              | INVALID_RECORD (87)                  |

and stamps the append time on a ``message.timestamp.type=LogAppendTime`` topic (attribute bit 3
and maxTimestamp set, CRC recomputed), as the broker does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.codec._kernels_src import AT_ATTRIBUTES, AT_MAX_TIMESTAMP
from pylog.storage.config import LogConfig
from pylog.storage.errors import CorruptRecordError, RecordSetError

CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
INVALID_RECORD = 87


@dataclass
class ProducedSet:
    """A checked record set and what the producer-state checks need of its batches."""

    data: bytes
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    offsets: int
    """Offsets the set spans (the sum of every batch's lastOffsetDelta + 1)."""
    max_timestamp: int
    log_append_time: int = -1


def check_produced(data: bytes, config: LogConfig, where: str, now: int) -> ProducedSet:
    """Check ``data`` as the broker does (see the module docstring); raises :class:`RecordSetError`."""
    buf = np.frombuffer(data, np.uint8)
    try:
        scan = B.scan_entries(buf, allow_torn_tail=False, path=where)
        if len(scan.position) == 0:
            raise CorruptRecordError("an empty record set", path=where, position=0)
        h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
        if (h.magic < 2).any():
            raise RecordSetError(
                UNSUPPORTED_FOR_MESSAGE_FORMAT, f"{where}: only RecordBatch v2 (magic 2) can be produced"
            )
        B.check_v2_headers(buf, h, path=where)
    except CorruptRecordError as e:
        raise RecordSetError(CORRUPT_MESSAGE, str(e)) from e
    too_big = np.nonzero(h.size > config.max_message_bytes)[0]
    if too_big.size:
        raise RecordSetError(
            MESSAGE_TOO_LARGE,
            f"{where}: a batch of {int(h.size[too_big[0]])} bytes exceeds max.message.bytes="
            f"{config.max_message_bytes}",
        )
    too_big = np.nonzero(h.size > config.segment_bytes)[0]
    if too_big.size:
        raise RecordSetError(
            RECORD_LIST_TOO_LARGE,
            f"{where}: a batch of {int(h.size[too_big[0]])} bytes exceeds "
            f"segment.bytes={config.segment_bytes}",
        )
    if config.compact:
        try:
            keys = records.decode(buf, path=where).records.column("key")
        except CorruptRecordError as e:
            raise RecordSetError(CORRUPT_MESSAGE, str(e)) from e
        if keys.null_count:
            raise RecordSetError(
                INVALID_RECORD,
                f"{where}: compacted topics refuse records without a key (cleanup.policy=compact)",
            )
    spans = h.last_offset_delta + 1
    out = ProducedSet(
        data,
        int(h.producer_id[0]),
        int(h.producer_epoch[0]),
        int(h.base_sequence[0]),
        int(h.base_sequence[-1] + h.last_offset_delta[-1]) if h.base_sequence[-1] >= 0 else -1,
        int(spans.sum()),
        int(h.max_timestamp.max()),
    )
    if config.message_timestamp_type == "LogAppendTime":
        out.data = _stamp_append_time(buf, h, now)
        out.log_append_time = now
        out.max_timestamp = now
    return out


def _stamp_append_time(buf: np.ndarray, h: B.BatchHeaders, now: int) -> bytes:
    out = buf.copy()
    attrs = (h.attributes | B.TIMESTAMP_TYPE_MASK).astype(">i2").view(np.uint8).reshape(-1, 2)
    out[h.position[:, None] + AT_ATTRIBUTES + np.arange(2)] = attrs
    ts = np.full(len(h), now, ">i8").view(np.uint8).reshape(-1, 8)
    out[h.position[:, None] + AT_MAX_TIMESTAMP + np.arange(8)] = ts
    B.write_crcs(out, h.position, h.size)
    return out.tobytes()


def offsets_spanned(data: bytes) -> int:
    """Offsets a checked record set spans."""
    buf = np.frombuffer(data, np.uint8)
    scan = B.scan_entries(buf, allow_torn_tail=False)
    h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
    return int((h.last_offset_delta + 1).sum())


def cut_below(data: memoryview, bound: int) -> memoryview:
    """The whole batches of fetched ``data`` whose base offset is below ``bound`` (the high
    watermark, or the last stable offset for read_committed): a fetch never returns what
    is not acknowledged."""
    if not len(data):
        return data
    buf = np.frombuffer(data, np.uint8)
    scan = B.scan_entries(buf, allow_torn_tail=True, raise_on_corrupt=False)
    if len(scan.position) == 0:
        return data[:0]
    h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
    keep = int((h.base_offset < bound).sum())
    if keep == 0:
        return data[:0]
    return data[: int(h.position[keep - 1] + h.size[keep - 1])]


_WARM_UP_BATCH = bytes.fromhex(
    "000000000000000000000039ffffffff02156266bb00000000000000000000000000010000000000000001"
    "ffffffffffffffffffffffffffff000000010e00000001027800"
)
"""A RecordBatch v2 of one record (value ``x``), its CRC right."""


def warm_up() -> None:
    """Load the codec's compiled kernels (numba: up to a second or two when first used), so that
    the first produce and fetch requests do not wait for them."""
    check_produced(_WARM_UP_BATCH, LogConfig(), "warm-up", 0)
    cut_below(memoryview(_WARM_UP_BATCH), 1)
