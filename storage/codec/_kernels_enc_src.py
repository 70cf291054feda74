"""The RecordBatch v2 encoder's inner loops: batches planned and written from Arrow columns,
and batches rebuilt from records kept by the cleaner.

Loaded by :mod:`pylog.storage.codec._kernels` into the same namespace as ``_kernels_src`` (plain
Python and numba-compiled, under the same rules: numpy arrays and ints only, no indexing outside
an array), whose constants and helpers it uses.  The import below is for linters only: importing
them at run time would bind the plain module's functions, which the compiled copy could not
call.  (numba's on-disk cache of these kernels is keyed on this file only, though they compile
in helpers of ``_kernels_src``: after changing one, touch this file.)

The batch header and record layouts written here are in ``_kernels_src`` and ``batch.py``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pylog.storage.codec._kernels_src import (
        AT_ATTRIBUTES,
        AT_BASE_OFFSET,
        AT_BASE_SEQUENCE,
        AT_BASE_TIMESTAMP,
        AT_COUNT,
        AT_CRC,
        AT_LAST_DELTA,
        AT_LEADER_EPOCH,
        AT_LENGTH,
        AT_MAGIC,
        AT_MAX_TIMESTAMP,
        AT_PRODUCER_EPOCH,
        AT_PRODUCER_ID,
        HEADER_SIZE,
        LOG_OVERHEAD,
        copy_bytes,
        put_be,
        varint_size,
        wrap64,
        write_varint,
    )


def write_header(  # type: ignore[no-untyped-def]
    out,
    pos,
    nbytes,
    base_offset,
    last_delta,
    count,
    base_ts,
    max_ts,
    attributes,
    leader_epoch,
    producer_id,
    producer_epoch,
    base_sequence,
):
    """The v2 header of a batch of ``nbytes`` bytes at ``out[pos]``, CRC left 0 (it covers the
    records, which come after); returns the position of the records section."""
    put_be(out, pos + AT_BASE_OFFSET, base_offset, 8)
    put_be(out, pos + AT_LENGTH, nbytes - LOG_OVERHEAD, 4)
    put_be(out, pos + AT_LEADER_EPOCH, leader_epoch, 4)
    out[pos + AT_MAGIC] = 2
    put_be(out, pos + AT_CRC, 0, 4)
    put_be(out, pos + AT_ATTRIBUTES, attributes, 2)
    put_be(out, pos + AT_LAST_DELTA, last_delta, 4)
    put_be(out, pos + AT_BASE_TIMESTAMP, base_ts, 8)
    put_be(out, pos + AT_MAX_TIMESTAMP, max_ts, 8)
    put_be(out, pos + AT_PRODUCER_ID, producer_id, 8)
    put_be(out, pos + AT_PRODUCER_EPOCH, producer_epoch, 2)
    put_be(out, pos + AT_BASE_SEQUENCE, base_sequence, 4)
    put_be(out, pos + AT_COUNT, count, 4)
    return pos + HEADER_SIZE


def plan_batches(  # type: ignore[no-untyped-def]
    klen,
    vlen,
    hcnt,
    hsize,
    ts,
    target_bytes,
    max_records,
    out_first,
    out_bytes,
    out_body,
):
    """Greedy split of records into batches of at most ``target_bytes`` (a record larger
    than that gets a batch of its own) and at most ``max_records``; returns the count.

    ``out_body[i]`` receives record i's body length (the value of its length varint)."""
    n = klen.shape[0]
    nb = 0
    first = 0
    size = HEADER_SIZE
    cnt = 0
    base_ts = 0
    for i in range(n):
        fixed = varint_size(klen[i]) + max(klen[i], 0) + varint_size(vlen[i]) + max(vlen[i], 0)
        fixed += varint_size(hcnt[i]) + hsize[i]
        body = 0
        rec = 0
        if cnt > 0:  # does the record fit the open batch?
            body = 1 + varint_size(wrap64(ts[i] - base_ts)) + varint_size(cnt) + fixed
            rec = varint_size(body) + body
            if size + rec > target_bytes or cnt >= max_records:
                out_first[nb] = first
                out_bytes[nb] = size
                nb += 1
                cnt = 0
        if cnt == 0:  # a new batch, opened by this record
            first = i
            size = HEADER_SIZE
            base_ts = ts[i]
            body = 3 + fixed  # attributes, timestamp delta 0, offset delta 0
            rec = varint_size(body) + body
        out_body[i] = body
        size += rec
        cnt += 1
    if cnt > 0:
        out_first[nb] = first
        out_bytes[nb] = size
        nb += 1
    return nb


def write_batches(  # type: ignore[no-untyped-def]
    out,
    first,
    nbytes,
    body,
    koff,
    kdata,
    klen,
    voff,
    vdata,
    vlen,
    ts,
    hlist,
    hkoff,
    hkdata,
    hvoff,
    hvdata,
    hvlen,
    base_offset,
    attributes,
    leader_epoch,
    producer_id,
    producer_epoch,
    base_sequence,
    out_pos,
):
    """Write the planned batches (CRC left 0 for the caller); returns bytes written."""
    nb = first.shape[0]
    n = klen.shape[0]
    pos = 0
    for b in range(nb):
        lo = first[b]
        hi = first[b + 1] if b + 1 < nb else n
        out_pos[b] = pos
        base_ts = ts[lo]
        max_t = ts[lo]
        for i in range(lo, hi):
            if ts[i] > max_t:
                max_t = ts[i]
        seq = base_sequence
        if seq >= 0:
            seq = (base_sequence + lo) % 2147483648
        p = write_header(
            out,
            pos,
            nbytes[b],
            base_offset + lo,
            hi - lo - 1,
            hi - lo,
            base_ts,
            max_t,
            attributes,
            leader_epoch,
            producer_id,
            producer_epoch,
            seq,
        )
        for i in range(lo, hi):
            p = write_varint(out, p, body[i])
            out[p] = 0
            p += 1
            p = write_varint(out, p, wrap64(ts[i] - base_ts))
            p = write_varint(out, p, i - lo)
            p = write_varint(out, p, klen[i])
            if klen[i] > 0:
                copy_bytes(out, p, kdata, koff[i], klen[i])
                p += klen[i]
            p = write_varint(out, p, vlen[i])
            if vlen[i] > 0:
                copy_bytes(out, p, vdata, voff[i], vlen[i])
                p += vlen[i]
            p = write_varint(out, p, hlist[i + 1] - hlist[i])
            for h in range(hlist[i], hlist[i + 1]):
                kl = hkoff[h + 1] - hkoff[h]
                p = write_varint(out, p, kl)
                if kl > 0:
                    copy_bytes(out, p, hkdata, hkoff[h], kl)
                    p += kl
                p = write_varint(out, p, hvlen[h])
                if hvlen[h] > 0:
                    copy_bytes(out, p, hvdata, hvoff[h], hvlen[h])
                    p += hvlen[h]
        pos += nbytes[b]
    return pos


# --------------------------------------------------------------------------- compaction
#
# The cleaner (rewrite.py) locates records with walk_records (tail_pos/end_pos) and writes the
# batches it rebuilds from the retained ones here; its key hashing and offset map kernels are in
# _kernels_hash_src.py.


def write_rebuilt(  # type: ignore[no-untyped-def]
    out,
    src,
    first,
    nbytes,
    body,
    tail_pos,
    tail_len,
    ts_delta,
    off_delta,
    b_base_offset,
    b_last_delta,
    b_base_ts,
    b_max_ts,
    b_attributes,
    b_leader_epoch,
    b_producer_id,
    b_producer_epoch,
    b_base_sequence,
    out_pos,
):
    """Write uncompressed v2 batches whose header fields are given per batch and whose
    records ``first[b]..first[b+1]-1`` are given as spans of ``src`` (the cleaner keeps each
    retained record's offset delta; a batch without records is Kafka's empty batch).  CRC is
    left 0 for the caller; ``nbytes``/``body`` were sized by the caller.  Returns bytes written."""
    nb = first.shape[0] - 1
    pos = 0
    for b in range(nb):
        out_pos[b] = pos
        lo = first[b]
        hi = first[b + 1]
        p = write_header(
            out,
            pos,
            nbytes[b],
            b_base_offset[b],
            b_last_delta[b],
            hi - lo,
            b_base_ts[b],
            b_max_ts[b],
            b_attributes[b],
            b_leader_epoch[b],
            b_producer_id[b],
            b_producer_epoch[b],
            b_base_sequence[b],
        )
        for i in range(lo, hi):
            p = write_varint(out, p, body[i])
            out[p] = 0
            p += 1
            p = write_varint(out, p, ts_delta[i])
            p = write_varint(out, p, off_delta[i])
            if tail_len[i] > 0:
                copy_bytes(out, p, src, tail_pos[i], tail_len[i])
                p += tail_len[i]
        pos += nbytes[b]
    return pos
