"""Records as byte spans, and batches rebuilt from the records a filter keeps.

This is the machinery under the log cleaner (Kafka's ``MemoryRecords.filterTo``):

- :func:`walk` locates every record of a run of batches without copying keys or values: its
  offset, timestamp, key span, value length, and the span from its keyLength varint to its
  end (the *tail*: key, value and headers, bytes that do not depend on the batch's base
  timestamp).  Compressed batches are decompressed into a buffer appended after the input.
- :func:`rebuild` writes the output for a run of batches, each one either copied verbatim,
  rebuilt from its retained records, reduced to Kafka's 61-byte empty batch, or dropped.

A rebuilt batch keeps what Kafka's ``buildRetainedRecordsInto`` keeps: base offset, last
offset (``lastOffsetDelta``, so the producer's last sequence survives), each record's offset
and timestamp, producer id/epoch/base sequence, partition leader epoch, transactional/control
flags, timestamp type and codec (re-compressed at the codec's default level).  Its base
timestamp is the delete horizon when one is set (attribute bit 6, KIP-534; record timestamp
deltas are then relative to the horizon and may be negative), else its first record's
timestamp; its max timestamp is the retained records' maximum (LogAppendTime: the original).
An empty batch (``DefaultRecordBatch.writeEmptyHeader``) has no records, codec none, base
timestamp -1, the original max timestamp and no delete horizon.

Legacy (magic 0/1) entries kept whole are copied verbatim; one that loses some of its records
is rewritten as a v2 batch (Kafka would keep its magic; pylog has no legacy encoder, and every
Kafka reader since 0.11 reads v2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from pylog.storage.codec import _kernels, records
from pylog.storage.codec import batch as B
from pylog.storage.codec.columns import varint_sizes

COPY, REBUILD, EMPTY, DROP = 0, 1, 2, 3
"""What :func:`rebuild` does with each input batch."""

_KEEP_ATTRIBUTES = B.TIMESTAMP_TYPE_MASK | B.TRANSACTIONAL_MASK | B.CONTROL_MASK


@dataclass
class Spans:
    """Where the records of a run of batches are.  Positions index ``buffer``, which starts
    with the input bytes (so batch positions are input positions) followed by decompressed
    record sections.  Per batch ``first[b]:first[b+1]`` are its records."""

    buffer: np.ndarray
    headers: B.BatchHeaders
    first: np.ndarray
    offset: np.ndarray
    timestamp: np.ndarray
    tail: np.ndarray
    key_pos: np.ndarray
    key_len: np.ndarray
    val_len: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return int(self.offset.shape[0])

    @functools.cached_property
    def batch_index(self) -> np.ndarray:
        """For each record, the row of its batch."""
        return np.repeat(np.arange(len(self.headers), dtype=np.int64), np.diff(self.first))

    def keys(self) -> list[bytes | None]:
        """The record keys as Python bytes (tests and tools; not for hot paths)."""
        mv = self.buffer.data
        return [
            None if n < 0 else bytes(mv[p : p + n])
            for p, n in zip(self.key_pos.tolist(), self.key_len.tolist(), strict=True)
        ]


def walk(
    data: np.ndarray,
    headers: B.BatchHeaders,
    *,
    path: str | None = None,
    base_position: int = 0,
    trusted: tuple[int, int] | None = None,
) -> Spans:
    """Locate the records of the complete entries ``headers`` (positions relative to ``data``),
    verifying CRCs and every record's framing as :func:`records.decode` does.

    ``base_position`` is the file position of ``data[0]``, for error messages.  Batches lying
    within the file positions ``trusted = (start, end)`` (already verified by the caller in
    this pass) skip the CRC check."""
    h = headers.take(slice(None))
    check: bool | np.ndarray = True
    if trusted is not None:
        at = h.position + base_position
        check = ~((at >= trusted[0]) & (at + h.size <= trusted[1]))
    B.check_v2_headers(data, h, verify_crc=check, path=path, base_position=base_position)
    sec = records.record_sections(data, h, path=path, base_position=base_position)
    w = records.walk_spans(sec, error=lambda j, msg: B.batch_error(h, j, msg, path, base_position))
    return Spans(
        sec.buffer, h, sec.first, w.offset, w.timestamp, w.tail, w.key_pos, w.key_len, w.val_len, w.end
    )


def rebuild(
    spans: Spans, keep: np.ndarray, action: np.ndarray, horizon: np.ndarray
) -> tuple[np.ndarray, B.BatchHeaders]:
    """The output bytes for the batches of ``spans`` and their headers (positions relative to
    the output).  ``action[b]`` is COPY, REBUILD, EMPTY or DROP; ``keep`` marks the records a
    REBUILD batch retains; ``horizon[b] >= 0`` sets that batch's delete horizon (REBUILD only).
    A REBUILD batch must retain at least one record."""
    h = spans.headers
    data = spans.buffer
    out_rows = np.nonzero(action != DROP)[0]
    rb_rows = np.nonzero((action == REBUILD) | (action == EMPTY))[0]
    rb_buf, rb_pos, rb_size = _write_rebuilt(spans, keep, action, horizon, rb_rows)
    size = h.size.copy()
    src_pos = h.position.copy()
    size[rb_rows] = rb_size
    src_pos[rb_rows] = rb_pos
    size, src_pos = size[out_rows], src_pos[out_rows]
    offsets = np.zeros(out_rows.shape[0] + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    kern = _kernels.active()
    from_rb = np.isin(out_rows, rb_rows)
    if (~from_rb).any():
        kern.gather(data, src_pos[~from_rb], size[~from_rb], offsets[:-1][~from_rb], out)
    if from_rb.any():
        kern.gather(rb_buf, src_pos[from_rb], size[from_rb], offsets[:-1][from_rb], out)
    magic = np.where(from_rb, 2, h.magic[out_rows])
    return out, B.parse_headers(out, offsets[:-1], size, magic)


def _write_rebuilt(
    spans: Spans, keep: np.ndarray, action: np.ndarray, horizon: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rebuilt and empty batches for ``rows``, end to end: (buffer, positions, sizes)."""
    nb = rows.shape[0]
    if nb == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    h = spans.headers
    bidx = spans.batch_index
    rebuilt = np.zeros(len(h), bool)
    rebuilt[rows] = action[rows] == REBUILD
    sel = np.nonzero(keep & rebuilt[bidx])[0]
    cnt = np.bincount(bidx[sel], minlength=len(h))[rows]
    first = np.zeros(nb + 1, np.int64)
    np.cumsum(cnt, out=first[1:])
    is_empty = action[rows] == EMPTY
    if ((cnt == 0) & ~is_empty).any():
        raise ValueError("a rebuilt batch must retain at least one record")
    legacy = h.magic[rows] < 2
    ts = spans.timestamp[sel]
    off = spans.offset[sel]
    nonempty = cnt > 0
    starts = first[:-1][nonempty]
    first_ts = np.full(nb, -1, np.int64)
    first_off = h.base_offset[rows].copy()
    first_ts[nonempty] = ts[starts]
    first_off[nonempty] = off[starts]
    hz = np.where(is_empty, -1, horizon[rows])
    base_offset = np.where(legacy, first_off, h.base_offset[rows])
    last_offset = h.last_offset[rows]
    base_ts = np.where(is_empty, -1, np.where(hz >= 0, hz, first_ts))
    log_append = ((h.attributes[rows] >> 3) & 1) == 1
    max_ts = h.max_timestamp[rows].copy()
    if starts.size:  # CreateTime: the retained records' maximum
        seg_max = np.maximum.reduceat(ts, starts)
        fill = ~log_append[nonempty]
        max_ts[np.nonzero(nonempty)[0][fill]] = seg_max[fill]
    codec = np.where(is_empty, 0, h.codec[rows])
    attributes = (h.attributes[rows] & _KEEP_ATTRIBUTES) | codec | np.where(hz >= 0, B.DELETE_HORIZON_MASK, 0)
    attributes = np.where(legacy, (h.attributes[rows] & B.TIMESTAMP_TYPE_MASK) | codec, attributes)
    minus1 = np.full(nb, -1, np.int64)
    ple = np.where(legacy, minus1, h.partition_leader_epoch[rows])
    pid = np.where(legacy, minus1, h.producer_id[rows])
    epoch = np.where(legacy, minus1, h.producer_epoch[rows])
    seq = np.where(legacy, minus1, h.base_sequence[rows])
    rec_batch = np.repeat(np.arange(nb), cnt)
    ts_delta = ts - base_ts[rec_batch]  # int64 wraparound, undone by the reader's base + delta
    off_delta = off - base_offset[rec_batch]
    tail_pos = spans.tail[sel]
    tail_len = spans.end[sel] - tail_pos
    body = 1 + varint_sizes(ts_delta) + varint_sizes(off_delta) + tail_len
    rec_bytes = varint_sizes(body) + body
    csum = np.zeros(sel.shape[0] + 1, np.int64)
    np.cumsum(rec_bytes, out=csum[1:])
    nbytes = B.HEADER_SIZE + csum[first[1:]] - csum[first[:-1]]
    last_delta = last_offset - base_offset
    buf = np.empty(int(nbytes.sum()), np.uint8)
    pos = np.empty(nb, np.int64)
    header_fields = (base_offset, last_delta, base_ts, max_ts, attributes, ple, pid, epoch, seq)
    record_fields = (body, tail_pos, tail_len, ts_delta, off_delta)
    _kernels.active().write_rebuilt(buf, spans.buffer, first, nbytes, *record_fields, *header_fields, pos)
    if (codec != 0).any():
        buf, pos, nbytes = records.compress_batches(buf, pos, nbytes, codec)
    B.write_crcs(buf, pos, nbytes)
    return buf, pos, nbytes
