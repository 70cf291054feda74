"""Encoding the rows of one input into the batches of many partitions, in one pass over the rows.

Loaded by :mod:`pylog.storage.codec._kernels` into the same namespace as ``_kernels_src`` (plain
Python and numba-compiled, under the same rules), whose helpers it calls.  The import below is
for linters only: importing them at run time would bind the plain module's functions, which the
compiled copy could not call.  (numba's on-disk cache of these kernels is keyed on this file
only, though they compile in helpers of ``_kernels_src``: after changing one, touch this file.)

A sink task gets Arrow batches whose rows go to many partitions.  Encoding each partition's rows
separately reads the input once per partition, in strides; here the rows are read once, in
their order, and each record is written to the batch its partition is filling.  The batches
are the same, byte for byte, as :func:`plan_batches`/:func:`write_batches` make of each
partition's rows in their order (the tests hold the two to that).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pylog.storage.codec._kernels_enc_src import write_header
    from pylog.storage.codec._kernels_src import HEADER_SIZE, copy_bytes, varint_size, wrap64, write_varint


def plan_partitioned(  # type: ignore[no-untyped-def]
    klen,
    vlen,
    hcnt,
    hsize,
    ts,
    parts,
    target_bytes,
    max_records,
    state,
    out_body,
    out_batch,
    b_part,
    b_bytes,
    b_count,
    b_base_ts,
    b_max_ts,
):
    """:func:`plan_batches` of every partition at once; returns the number of batches.

    Row ``r`` goes to partition ``parts[r]`` (< 0: not encoded); ``state`` holds one column per
    partition (the batch it fills, -1 before its first row; that batch's size and count).  Row
    ``r`` gets its body length in ``out_body[r]`` and its batch in ``out_batch[r]`` (-1: none);
    batches are numbered in the order they are opened, each with its partition, size in bytes,
    record count, base (first) and largest timestamp."""
    nb = 0
    for r in range(parts.shape[0]):
        p = parts[r]
        if p < 0:
            out_batch[r] = -1
            continue
        fixed = varint_size(klen[r]) + max(klen[r], 0) + varint_size(vlen[r]) + max(vlen[r], 0)
        fixed += varint_size(hcnt[r]) + hsize[r]
        b = state[0, p]
        cnt = 0
        body = 0
        rec = 0
        if b >= 0:  # the batch partition p fills: does the record fit?
            cnt = state[2, p]
            body = 1 + varint_size(wrap64(ts[r] - b_base_ts[b])) + varint_size(cnt) + fixed
            rec = varint_size(body) + body
            if state[1, p] + rec > target_bytes or cnt >= max_records:
                b_bytes[b] = state[1, p]
                b_count[b] = cnt
                b = -1
        if b < 0:  # a new batch, opened by this record
            b = nb
            nb += 1
            b_part[b] = p
            b_base_ts[b] = ts[r]
            b_max_ts[b] = ts[r]
            state[0, p] = b
            state[1, p] = HEADER_SIZE
            cnt = 0
            body = 3 + fixed  # attributes, timestamp delta 0, offset delta 0
            rec = varint_size(body) + body
        if ts[r] > b_max_ts[b]:
            b_max_ts[b] = ts[r]
        out_body[r] = body
        out_batch[r] = b
        state[1, p] += rec
        state[2, p] = cnt + 1
    for p in range(state.shape[1]):
        b = state[0, p]
        if b >= 0:
            b_bytes[b] = state[1, p]
            b_count[b] = state[2, p]
    return nb


def write_partitioned(  # type: ignore[no-untyped-def]
    out,
    b_pos,
    b_bytes,
    b_count,
    b_base_offset,
    b_base_ts,
    b_max_ts,
    out_batch,
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
    attributes,
    cursor,
    filled,
):
    """Write the batches :func:`plan_partitioned` planned at ``out[b_pos[b]]`` (CRC left 0):
    the headers, then every row, in input order, at the end of its batch so far."""
    for b in range(b_pos.shape[0]):
        cursor[b] = write_header(
            out,
            b_pos[b],
            b_bytes[b],
            b_base_offset[b],
            b_count[b] - 1,
            b_count[b],
            b_base_ts[b],
            b_max_ts[b],
            attributes,
            -1,
            -1,
            -1,
            -1,
        )
        filled[b] = 0
    for r in range(out_batch.shape[0]):
        b = out_batch[r]
        if b < 0:
            continue
        # the record as write_batches writes it, kept inline: a helper taking these 12 arrays
        # made both kernels 9x slower in numba (163 against 19 ns/row; even inlined, each call
        # still updates each array's reference count)
        p = write_varint(out, cursor[b], body[r])
        out[p] = 0
        p += 1
        p = write_varint(out, p, wrap64(ts[r] - b_base_ts[b]))
        p = write_varint(out, p, filled[b])
        p = write_varint(out, p, klen[r])
        if klen[r] > 0:
            copy_bytes(out, p, kdata, koff[r], klen[r])
            p += klen[r]
        p = write_varint(out, p, vlen[r])
        if vlen[r] > 0:
            copy_bytes(out, p, vdata, voff[r], vlen[r])
            p += vlen[r]
        p = write_varint(out, p, hlist[r + 1] - hlist[r])
        for h in range(hlist[r], hlist[r + 1]):
            kl = hkoff[h + 1] - hkoff[h]
            p = write_varint(out, p, kl)
            if kl > 0:
                copy_bytes(out, p, hkdata, hkoff[h], kl)
                p += kl
            p = write_varint(out, p, hvlen[h])
            if hvlen[h] > 0:
                copy_bytes(out, p, hvdata, hvoff[h], hvlen[h])
                p += hvlen[h]
        cursor[b] = p
        filled[b] += 1
