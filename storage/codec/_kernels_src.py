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

import struct

from pylog.storage.codec.legacy import RECORD_OVERHEAD_V0, RECORD_OVERHEAD_V1

# RecordBatch v2 header fields in order, with their ``struct`` codes (the byte table is in
# batch.py).  Every offset below is computed from this list, so the struct, the numpy view of
# many headers (batch.py) and the kernels agree by construction.  The compiled copy reads the
# ``AT_*`` ints as constants.
HEADER_FIELDS = (
    ("base_offset", "q"),
    ("batch_length", "i"),
    ("partition_leader_epoch", "i"),
    ("magic", "b"),
    ("crc", "I"),
    ("attributes", "h"),
    ("last_offset_delta", "i"),
    ("base_timestamp", "q"),
    ("max_timestamp", "q"),
    ("producer_id", "q"),
    ("producer_epoch", "h"),
    ("base_sequence", "i"),
    ("records_count", "i"),
)
HEADER = struct.Struct(">" + "".join(code for _, code in HEADER_FIELDS))
HEADER_SIZE = HEADER.size  # 61: where the records section starts
HEADER_AT = {
    name: struct.calcsize(">" + "".join(code for _, code in HEADER_FIELDS[:k]))
    for k, (name, _) in enumerate(HEADER_FIELDS)
}
"""Byte offset of each header field inside a batch."""
AT_BASE_OFFSET = HEADER_AT["base_offset"]
AT_LENGTH = HEADER_AT["batch_length"]
AT_LEADER_EPOCH = HEADER_AT["partition_leader_epoch"]
AT_MAGIC = HEADER_AT["magic"]
AT_CRC = HEADER_AT["crc"]
AT_ATTRIBUTES = HEADER_AT["attributes"]
AT_LAST_DELTA = HEADER_AT["last_offset_delta"]
AT_BASE_TIMESTAMP = HEADER_AT["base_timestamp"]
AT_MAX_TIMESTAMP = HEADER_AT["max_timestamp"]
AT_PRODUCER_ID = HEADER_AT["producer_id"]
AT_PRODUCER_EPOCH = HEADER_AT["producer_epoch"]
AT_BASE_SEQUENCE = HEADER_AT["base_sequence"]
AT_COUNT = HEADER_AT["records_count"]
LOG_OVERHEAD = AT_LEADER_EPOCH  # 12: every log entry starts ``offset int64 | size int32``
CRC_FROM = AT_ATTRIBUTES  # the CRC-32C covers [attributes, end of batch)
ENTRY_PREFIX = AT_MAGIC + 1  # 17: enough of any entry, whatever its magic, to read its magic
MIN_BODY_V2 = HEADER_SIZE - LOG_OVERHEAD  # 49: smallest legal size field of a v2 batch
MIN_BODY_V1 = RECORD_OVERHEAD_V1  # legacy message: crc, magic, attributes, timestamp, 2 lengths
MIN_BODY_V0 = RECORD_OVERHEAD_V0  # ... without the timestamp

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
    if p + 1 < end:  # fast paths: one or two bytes (most lengths, deltas and counts)
        b = int(data[p])
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), p + 1
        b1 = int(data[p + 1])
        if b1 < 0x80:
            b = (b & 0x7F) | (b1 << 7)
            return (b >> 1) ^ -(b & 1), p + 2
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


def min_body(magic):  # type: ignore[no-untyped-def]
    """The smallest legal size field of a log entry with this magic."""
    if magic >= 2:
        return MIN_BODY_V2
    return MIN_BODY_V1 if magic == 1 else MIN_BODY_V0


def scan_entries(data, start, end, out_pos, out_size, out_magic, status):  # type: ignore[no-untyped-def]
    """Walk log entries ``offset int64 | size int32 | body``; returns how many are complete.

    Stops at a torn tail (status code E_TORN_ENTRY with its position) or at an entry whose
    size is below the smallest legal body (E_ENTRY_SIZE).
    """
    p = start
    k = 0
    while p < end:
        if end - p < ENTRY_PREFIX:
            _fail(status, E_TORN_ENTRY, k, p, end - p)
            return k
        size = get_be(data, p + AT_LENGTH, 4)
        magic = int(data[p + AT_MAGIC])
        if size < min_body(magic):
            _fail(status, E_ENTRY_SIZE, k, p, size)
            return k
        if end - p - LOG_OVERHEAD < size:
            _fail(status, E_TORN_ENTRY, k, p, size)
            return k
        if k >= out_pos.shape[0]:
            return k
        out_pos[k] = p
        out_size[k] = size + LOG_OVERHEAD
        out_magic[k] = magic
        k += 1
        p += size + LOG_OVERHEAD
    return k


# --------------------------------------------------------------------------- decoding


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
    key_pos,
    key_len,
    val_len,
    tail_pos,
    end_pos,
    rare,
    key_offs,
    key_data,
    val_offs,
    val_data,
    status,
):
    """Walk every record of every batch (``count[b]`` records in ``data[rec_start[b]:rec_end[b]]``),
    checking each length against the end of its record; returns the total number of headers,
    or -1 with the error in ``status``.

    Every record's offset and timestamp are recorded.  The other columns are recorded only
    when given (None: skipped; the compiled copy is specialized on which are None, so a
    skipped column costs nothing).  The cleaner takes ``key_len``/``val_len``, ``key_pos``
    (where the key starts), ``tail_pos`` (the keyLength varint) and ``end_pos`` (the record's
    end): the bytes from tail to end (key, value, headers) do not depend on the batch's base
    timestamp, so a rebuilt batch copies them.

    Decoding takes ``key_offs``/``key_data`` and ``val_offs``/``val_data``: each key and value
    is copied there as it is walked, while the record is in cache (Arrow binary layout: the
    caller sets ``*_offs[0]``, record n's end goes to ``*_offs[n + 1]``; every key (value) lies
    inside its records section, so the sections' total size bounds ``*_data``).  What most
    records lack goes to ``rare`` (5 rows of ``n``), as lists whose lengths are
    ``status[4:7]``: the records with a null key (row 0) and with a null value (row 1), and
    those with headers (row 2) with where their headers start and how many (rows 3, 4).
    Nothing is written per record that has no null and no header."""
    n = 0
    ko = 0
    vo = 0
    if key_offs is not None:
        ko = key_offs[0]
    if val_offs is not None:
        vo = val_offs[0]
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
            if tail_pos is not None:
                tail_pos[n] = p
            klen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if klen < -1 or klen > rend - p:
                return _fail(status, E_KEY_LENGTH, b, rec_pos, i)
            if key_pos is not None:
                key_pos[n] = p
            if key_len is not None:
                key_len[n] = klen
            if rare is not None and klen < 0:
                rare[0, status[4]] = n
                status[4] += 1
            if klen > 0:
                if key_data is not None:
                    copy_bytes(key_data, ko, data, p, klen)
                    ko += klen
                p += klen
            if key_offs is not None:
                key_offs[n + 1] = ko
            vlen, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if vlen < -1 or vlen > rend - p:
                return _fail(status, E_VALUE_LENGTH, b, rec_pos, i)
            if val_len is not None:
                val_len[n] = vlen
            if rare is not None and vlen < 0:
                rare[1, status[5]] = n
                status[5] += 1
            if vlen > 0:
                if val_data is not None:
                    copy_bytes(val_data, vo, data, p, vlen)
                    vo += vlen
                p += vlen
            if val_offs is not None:
                val_offs[n + 1] = vo
            hcount, p = read_varint(data, p, rend, 5)
            if p < 0:
                return _fail(status, -p, b, rec_pos, i)
            if hcount < 0 or hcount > (rend - p) // 2:
                return _fail(status, E_HEADER_COUNT, b, rec_pos, i)
            if rare is not None and hcount > 0:
                j = status[6]
                rare[2, j] = n
                rare[3, j] = p
                rare[4, j] = hcount
                status[6] = j + 1
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
            if end_pos is not None:
                end_pos[n] = rend
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
    """Second pass over records that have headers; bounds were checked by walk_records."""
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
