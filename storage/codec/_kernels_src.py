"""The sequential inner loops of the RecordBatch v2 codec.

This file is loaded twice by :mod:`pylog.storage.codec._kernels`: once as plain Python (the
fallback, and the bounds-checked oracle the tests run) and once with every function compiled
by numba.  The code is therefore written in the subset both understand: numpy arrays, ints,
tuples, no Python objects.  Helpers whose Python and compiled semantics differ (64-bit
wraparound) are replaced in the compiled copy, see ``JIT_OVERRIDES`` in ``_kernels``.

Record layout walked here (Kafka ``DefaultRecord``; all varints are zigzag):

    +-----------------+--------------------------------------------------------------+
    | length          | varint, bytes of everything below                            |
    | attributes      | int8 (unused)                                                |
    | timestampDelta  | varlong, relative to the batch's baseTimestamp               |
    | offsetDelta     | varint, relative to the batch's baseOffset                   |
    | keyLength, key  | varint (-1 = null), bytes                                    |
    | valueLength,val | varint (-1 = null), bytes                                    |
    | headerCount     | varint >= 0                                                  |
    | headers[]       | keyLength varint >= 0, key utf-8, valueLength varint, value  |
    +-----------------+--------------------------------------------------------------+

No function here may index outside its arrays: the compiled copy has no bounds checks, so
every length read from input is checked against the end of its record first.  Errors are
reported through a ``status`` array (code, batch, byte position, record) rather than raised.
"""

# Error codes written to status[0]; messages live in records.py.
E_OK = 0
E_TRUNCATED = 1  # a varint or field runs past the end of its record / batch
E_VARINT_TOO_LONG = 2
E_RECORD_LENGTH = 3
E_KEY_LENGTH = 4
E_VALUE_LENGTH = 5
E_HEADER_COUNT = 6
E_HEADER_KEY_LENGTH = 7
E_HEADER_VALUE_LENGTH = 8
E_RECORD_SIZE_MISMATCH = 9
E_TRAILING_BYTES = 10
E_ENTRY_SIZE = 11
E_TORN_ENTRY = 12

INT32_MAX = 2147483647
MASK57 = 0x01FFFFFFFFFFFFFF
MASK63 = 0x7FFFFFFFFFFFFFFF


def wrap64(x):  # type: ignore[no-untyped-def]
    """Two's-complement 64-bit wraparound (the compiled copy is the identity)."""
    if x > 9223372036854775807 or x < -9223372036854775808:
        x = ((x + 9223372036854775808) % 18446744073709551616) - 9223372036854775808
    return x


def read_varint(data, p, end, max_bytes):  # type: ignore[no-untyped-def]
    """Zigzag varint at ``data[p:end]``: (value, next position); next < 0 on error."""
    u = 0
    shift = 0
    n = 0
    while True:
        if p >= end:
            return 0, -E_TRUNCATED
        if n >= max_bytes:
            return 0, -E_VARINT_TOO_LONG
        b = int(data[p])
        p += 1
        n += 1
        u |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    u = wrap64(u)
    return ((u >> 1) & MASK63) ^ -(u & 1), p


def varint_size(v):  # type: ignore[no-untyped-def]
    u = wrap64((v << 1) ^ (v >> 63))
    n = 1
    u = (u >> 7) & MASK57
    while u != 0:
        n += 1
        u = (u >> 7) & MASK57
    return n


def write_varint(out, p, v):  # type: ignore[no-untyped-def]
    u = wrap64((v << 1) ^ (v >> 63))
    while True:
        rest = (u >> 7) & MASK57
        if rest == 0:
            out[p] = u & 0x7F
            return p + 1
        out[p] = (u & 0x7F) | 0x80
        p += 1
        u = rest


def copy_bytes(dst, doff, src, soff, n):  # type: ignore[no-untyped-def]
    """dst[doff:doff+n] = src[soff:soff+n] (the compiled copy is an LLVM memcpy)."""
    dst[doff : doff + n] = src[soff : soff + n]


def put_be(out, p, v, nbytes):  # type: ignore[no-untyped-def]
    for k in range(nbytes):
        out[p + nbytes - 1 - k] = v & 0xFF
        v >>= 8


def get_be(data, p, nbytes):  # type: ignore[no-untyped-def]
    """Signed big-endian integer of 4 or 8 bytes."""
    v = 0
    for k in range(nbytes):
        v = (v << 8) | int(data[p + k])
    if nbytes == 4 and v >= 2147483648:
        v -= 4294967296
    return wrap64(v)


def _fail(status, code, batch, pos, rec):  # type: ignore[no-untyped-def]
    status[0] = code
    status[1] = batch
    status[2] = pos
    status[3] = rec
    return -1


# --------------------------------------------------------------------------- scanning


def scan_entries(data, start, end, out_pos, out_size, out_magic, status):  # type: ignore[no-untyped-def]
    """Walk log entries ``offset int64 | size int32 | body``; returns how many are complete.

    Stops at a torn tail (status code E_TORN_ENTRY with its position) or at an entry whose
    size is below the smallest legal body (E_ENTRY_SIZE).
    """
    p = start
    k = 0
    while p < end:
        if end - p < 17:
            _fail(status, E_TORN_ENTRY, k, p, end - p)
            return k
        size = get_be(data, p + 8, 4)
        magic = int(data[p + 16])
        minimum = 49 if magic >= 2 else (22 if magic == 1 else 14)
        if size < minimum:
            _fail(status, E_ENTRY_SIZE, k, p, size)
            return k
        if end - p - 12 < size:
            _fail(status, E_TORN_ENTRY, k, p, size)
            return k
        if k >= out_pos.shape[0]:
            return k
        out_pos[k] = p
        out_size[k] = size + 12
        out_magic[k] = magic
        k += 1
        p += size + 12
    return k


# --------------------------------------------------------------------------- decoding


def decode_records(  # type: ignore[no-untyped-def]
    data,
    rec_start,
    rec_end,
    count,
    base_offset,
    base_ts,
    log_append,
    max_ts,
    out_off,
    out_ts,
    key_pos,
    key_len,
    val_pos,
    val_len,
    hdr_pos,
    hdr_cnt,
    status,
):
    """Walk every record of every batch; returns the total number of headers, or -1."""
    n = 0
    total_headers = 0
    for b in range(rec_start.shape[0]):
        p = rec_start[b]
        end = rec_end[b]
        for i in range(count[b]):
            rec_pos = p
            length, p = read_varint(data, p, end, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if length < 6 or length > end - p:
                return _fail(status, E_RECORD_LENGTH, b, rec_pos, i)
            rend = p + length
            p += 1  # attributes
            ts_delta, p = read_varint(data, p, rend, 10)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            off_delta, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            klen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if klen < -1 or klen > rend - p:
                return _fail(status, E_KEY_LENGTH, b, rec_pos, i)
            key_pos[n] = p
            key_len[n] = klen
            if klen > 0:
                p += klen
            vlen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if vlen < -1 or vlen > rend - p:
                return _fail(status, E_VALUE_LENGTH, b, rec_pos, i)
            val_pos[n] = p
            val_len[n] = vlen
            if vlen > 0:
                p += vlen
            hcount, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if hcount < 0 or hcount > (rend - p) // 2:
                return _fail(status, E_HEADER_COUNT, b, rec_pos, i)
            hdr_pos[n] = p
            hdr_cnt[n] = hcount
            for _h in range(hcount):
                hk, p = read_varint(data, p, rend, 5)
                if p < 0:
                    return _fail(status, -p, b, rec_pos, i)
                if hk < 0 or hk > rend - p:
                    return _fail(status, E_HEADER_KEY_LENGTH, b, rec_pos, i)
                p += hk
                hv, p = read_varint(data, p, rend, 5)
                if p < 0:
                    return _fail(status, -p, b, rec_pos, i)
                if hv < -1 or hv > rend - p:
                    return _fail(status, E_HEADER_VALUE_LENGTH, b, rec_pos, i)
                if hv > 0:
                    p += hv
            if p != rend:
                return _fail(status, E_RECORD_SIZE_MISMATCH, b, rec_pos, i)
            out_off[n] = wrap64(base_offset[b] + off_delta)
            if log_append[b]:
                out_ts[n] = max_ts[b]
            else:
                out_ts[n] = wrap64(base_ts[b] + ts_delta)
            total_headers += hcount
            n += 1
        if p != end:
            return _fail(status, E_TRAILING_BYTES, b, p, count[b])
    return total_headers


def decode_headers(data, hdr_pos, hdr_cnt, hk_pos, hk_len, hv_pos, hv_len):  # type: ignore[no-untyped-def]
    """Second pass over records that have headers; bounds were checked by decode_records."""
    j = 0
    for i in range(hdr_pos.shape[0]):
        p = hdr_pos[i]
        for _h in range(hdr_cnt[i]):
            hk, p = read_varint(data, p, data.shape[0], 5)
            hk_pos[j] = p
            hk_len[j] = hk
            p += hk
            hv, p = read_varint(data, p, data.shape[0], 5)
            hv_pos[j] = p
            hv_len[j] = hv
            if hv > 0:
                p += hv
            j += 1
    return j


def gather(data, pos, length, out_offsets, out):  # type: ignore[no-untyped-def]
    """Copy variable-length slices ``data[pos:pos+length]`` to ``out`` at ``out_offsets``."""
    for i in range(pos.shape[0]):
        n = length[i]
        if n > 0:
            copy_bytes(out, out_offsets[i], data, pos[i], n)


# --------------------------------------------------------------------------- encoding


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
    size = 61
    cnt = 0
    base_ts = 0
    for i in range(n):
        if cnt == 0:
            base_ts = ts[i]
        body = (
            1
            + varint_size(wrap64(ts[i] - base_ts))
            + varint_size(cnt)
            + varint_size(klen[i])
            + max(klen[i], 0)
            + varint_size(vlen[i])
            + max(vlen[i], 0)
            + varint_size(hcnt[i])
            + hsize[i]
        )
        rec = varint_size(body) + body
        if cnt > 0 and (size + rec > target_bytes or cnt >= max_records):
            out_first[nb] = first
            out_bytes[nb] = size
            nb += 1
            first = i
            size = 61
            cnt = 0
            base_ts = ts[i]
            body = (
                1
                + 1
                + 1
                + varint_size(klen[i])
                + max(klen[i], 0)
                + varint_size(vlen[i])
                + max(vlen[i], 0)
                + varint_size(hcnt[i])
                + hsize[i]
            )
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
        put_be(out, pos, base_offset + lo, 8)
        put_be(out, pos + 8, nbytes[b] - 12, 4)
        put_be(out, pos + 12, leader_epoch, 4)
        out[pos + 16] = 2
        put_be(out, pos + 17, 0, 4)
        put_be(out, pos + 21, attributes, 2)
        put_be(out, pos + 23, hi - lo - 1, 4)
        put_be(out, pos + 27, base_ts, 8)
        put_be(out, pos + 35, max_t, 8)
        put_be(out, pos + 43, producer_id, 8)
        put_be(out, pos + 51, producer_epoch, 2)
        seq = base_sequence
        if seq >= 0:
            seq = (base_sequence + lo) % 2147483648
        put_be(out, pos + 53, seq, 4)
        put_be(out, pos + 57, hi - lo, 4)
        p = pos + 61
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
# Kernels of the log cleaner (cleaner.py, offset_map.py, rewrite.py): walking records as byte
# spans (no copies), hashing keys, the open-addressing offset map, and writing batches rebuilt
# from retained records with their original offsets.

# MurmurHash3 x64_128 constants as signed int64 bit patterns (all arithmetic below is int64
# with wraparound: native in the compiled copy, ``wrap64`` in the Python copy).
M3_C1 = -8663945395140668459  # 0x87c37b91114253d5
M3_C2 = 5545529020109919103  # 0x4cf5ad432745937f
M3_F1 = -49064778989728563  # 0xff51afd7ed558ccd
M3_F2 = -4265267296055464877  # 0xc4ceb9fe1a85ec53
MASK31 = 0x7FFFFFFF  # low 31 bits: ``(k >> 33) & MASK31`` is a logical shift of an int64


def rotl64(x, r):  # type: ignore[no-untyped-def]
    """Rotate the 64-bit pattern ``x`` left by ``r`` (1..63) bits."""
    return wrap64((x << r) | ((x >> (64 - r)) & ((1 << r) - 1)))


def fmix64(k):  # type: ignore[no-untyped-def]
    k = k ^ ((k >> 33) & MASK31)
    k = wrap64(k * M3_F1)
    k = k ^ ((k >> 33) & MASK31)
    k = wrap64(k * M3_F2)
    return k ^ ((k >> 33) & MASK31)


def load_le64(data, p):  # type: ignore[no-untyped-def]
    v = 0
    for j in range(8):
        v |= int(data[p + j]) << (8 * j)
    return wrap64(v)


def hash_keys(data, pos, length, seed, out_h1, out_h2):  # type: ignore[no-untyped-def]
    """MurmurHash3_x64_128 of each ``data[pos[i]:pos[i]+length[i]]`` (length >= 0, checked
    by the caller against the buffer): (h1, h2) as int64 bit patterns.  One loop body, so the
    compiled copy keeps every intermediate in registers."""
    for i in range(pos.shape[0]):
        p = int(pos[i])
        n = int(length[i])
        h1 = int(seed)
        h2 = int(seed)
        nblocks = n // 16
        for b in range(nblocks):
            q = p + 16 * b
            k1 = load_le64(data, q)
            k2 = load_le64(data, q + 8)
            k1 = rotl64(wrap64(k1 * M3_C1), 31)
            h1 ^= wrap64(k1 * M3_C2)
            h1 = wrap64(wrap64(rotl64(h1, 27) + h2) * 5 + 1390208809)
            k2 = rotl64(wrap64(k2 * M3_C2), 33)
            h2 ^= wrap64(k2 * M3_C1)
            h2 = wrap64(wrap64(rotl64(h2, 31) + h1) * 5 + 944331445)
        tail = p + nblocks * 16
        rem = n & 15
        if rem > 8:
            k2 = 0
            for j in range(8, rem):
                k2 |= int(data[tail + j]) << (8 * (j - 8))
            h2 ^= wrap64(rotl64(wrap64(k2 * M3_C2), 33) * M3_C1)
        if rem > 0:
            k1 = 0
            for j in range(min(rem, 8)):
                k1 |= int(data[tail + j]) << (8 * j)
            h1 ^= wrap64(rotl64(wrap64(wrap64(k1) * M3_C1), 31) * M3_C2)
        h1 ^= n
        h2 ^= n
        h1 = wrap64(h1 + h2)
        h2 = wrap64(h2 + h1)
        h1 = fmix64(h1)
        h2 = fmix64(h2)
        h1 = wrap64(h1 + h2)
        out_h1[i] = h1
        out_h2[i] = wrap64(h2 + h1)


def map_put(table, used, h1, h2, offsets, capacity, state):  # type: ignore[no-untyped-def]
    """Insert (hash -> offset) pairs in order into ``table`` (slots x 3 int64: h1, h2,
    offset + 1; 0 marks an empty slot, so a freshly zeroed table is empty), linear probing from
    ``h1 mod slots``; ``used[k]`` records the slot of the k-th key.  An existing hash gets the
    new offset.  Stops before the first *new* hash once ``state[0]`` (the number of keys) has
    reached ``capacity`` (< slots and <= len(used), so a probe always ends at an empty slot);
    returns how many pairs were inserted."""
    slots = table.shape[0]
    size = state[0]
    n = h1.shape[0]
    for i in range(n):
        a = h1[i]
        b = h2[i]
        s = (a & MASK63) % slots
        while True:
            if table[s, 2] == 0:
                if size >= capacity:
                    state[0] = size
                    return i
                table[s, 0] = a
                table[s, 1] = b
                table[s, 2] = offsets[i] + 1
                used[size] = s
                size += 1
                break
            if table[s, 0] == a and table[s, 1] == b:
                table[s, 2] = offsets[i] + 1
                break
            s += 1
            if s == slots:
                s = 0
    state[0] = size
    return n


def map_get(table, h1, h2, out):  # type: ignore[no-untyped-def]
    """The offset stored for each hash, or -1."""
    slots = table.shape[0]
    for i in range(h1.shape[0]):
        a = h1[i]
        b = h2[i]
        s = (a & MASK63) % slots
        out[i] = -1
        while table[s, 2] != 0:
            if table[s, 0] == a and table[s, 1] == b:
                out[i] = table[s, 2] - 1
                break
            s += 1
            if s == slots:
                s = 0


def walk_records(  # type: ignore[no-untyped-def]
    data,
    rec_start,
    rec_end,
    count,
    base_offset,
    base_ts,
    log_append,
    max_ts,
    out_off,
    out_ts,
    out_tail,
    key_pos,
    key_len,
    val_len,
    out_end,
    status,
):
    """Walk every record like :func:`decode_records` (same checks, same status codes) but
    return spans instead of copies: ``out_tail`` is the position of the record's keyLength
    varint and ``out_end`` its end.  The bytes between them (key, value, headers) do not depend
    on the batch's base timestamp, so a rebuilt batch copies them verbatim.  Returns the
    number of records, or -1."""
    n = 0
    for b in range(rec_start.shape[0]):
        p = rec_start[b]
        end = rec_end[b]
        for i in range(count[b]):
            rec_pos = p
            length, p = read_varint(data, p, end, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if length < 6 or length > end - p:
                return _fail(status, E_RECORD_LENGTH, b, rec_pos, i)
            rend = p + length
            p += 1  # attributes
            ts_delta, p = read_varint(data, p, rend, 10)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            off_delta, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            out_tail[n] = p
            klen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if klen < -1 or klen > rend - p:
                return _fail(status, E_KEY_LENGTH, b, rec_pos, i)
            key_pos[n] = p
            key_len[n] = klen
            if klen > 0:
                p += klen
            vlen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if vlen < -1 or vlen > rend - p:
                return _fail(status, E_VALUE_LENGTH, b, rec_pos, i)
            val_len[n] = vlen
            if vlen > 0:
                p += vlen
            hcount, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if hcount < 0 or hcount > (rend - p) // 2:
                return _fail(status, E_HEADER_COUNT, b, rec_pos, i)
            for _h in range(hcount):
                hk, p = read_varint(data, p, rend, 5)
                if p < 0:
                    return _fail(status, -p, b, rec_pos, i)
                if hk < 0 or hk > rend - p:
                    return _fail(status, E_HEADER_KEY_LENGTH, b, rec_pos, i)
                p += hk
                hv, p = read_varint(data, p, rend, 5)
                if p < 0:
                    return _fail(status, -p, b, rec_pos, i)
                if hv < -1 or hv > rend - p:
                    return _fail(status, E_HEADER_VALUE_LENGTH, b, rec_pos, i)
                if hv > 0:
                    p += hv
            if p != rend:
                return _fail(status, E_RECORD_SIZE_MISMATCH, b, rec_pos, i)
            out_end[n] = rend
            out_off[n] = wrap64(base_offset[b] + off_delta)
            if log_append[b]:
                out_ts[n] = max_ts[b]
            else:
                out_ts[n] = wrap64(base_ts[b] + ts_delta)
            n += 1
        if p != end:
            return _fail(status, E_TRAILING_BYTES, b, p, count[b])
    return n


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
        put_be(out, pos, b_base_offset[b], 8)
        put_be(out, pos + 8, nbytes[b] - 12, 4)
        put_be(out, pos + 12, b_leader_epoch[b], 4)
        out[pos + 16] = 2
        put_be(out, pos + 17, 0, 4)
        put_be(out, pos + 21, b_attributes[b], 2)
        put_be(out, pos + 23, b_last_delta[b], 4)
        put_be(out, pos + 27, b_base_ts[b], 8)
        put_be(out, pos + 35, b_max_ts[b], 8)
        put_be(out, pos + 43, b_producer_id[b], 8)
        put_be(out, pos + 51, b_producer_epoch[b], 2)
        put_be(out, pos + 53, b_base_sequence[b], 4)
        put_be(out, pos + 57, hi - lo, 4)
        p = pos + 61
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
