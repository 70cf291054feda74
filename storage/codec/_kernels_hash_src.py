"""The log cleaner's hashing kernels: MurmurHash3 of record keys and the offset map.

Loaded by :mod:`pylog.storage.codec._kernels` into the same namespace as ``_kernels_src`` (plain
Python and numba-compiled, under the same rules: numpy arrays, ints, no Python objects, no
index outside its arrays).  The import below is for linters and for importing this file on its
own; in the loaded copies the names it binds are replaced by that copy's own.  (numba's on-disk
cache of these functions is keyed on this file only: after changing ``wrap64`` or ``MASK63``,
touch this file too.)
"""

from pylog.storage.codec._kernels_src import MASK63, wrap64

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


# Kafka's murmur2 (the default partitioner's hash) constants; 32-bit arithmetic done in int64:
# every product is of a value below 2**32 and M2 (below 2**31), so it never leaves int64.
M2 = 0x5BD1E995
M2_SEED = 0x9747B28C
MASK32 = 0xFFFFFFFF


def murmur2_keys(data, starts, lengths, out):  # type: ignore[no-untyped-def]
    """Java's ``Utils.murmur2`` of each ``data[starts[i]:starts[i]+lengths[i]]`` (checked by
    the caller against the buffer), as the unsigned 32-bit pattern, into ``out`` (int64)."""
    for i in range(starts.shape[0]):
        p = int(starts[i])
        n = int(lengths[i])
        h = (M2_SEED ^ n) & MASK32
        for b in range(n >> 2):
            q = p + 4 * b
            k = int(data[q]) | (int(data[q + 1]) << 8) | (int(data[q + 2]) << 16) | (int(data[q + 3]) << 24)
            k = (k * M2) & MASK32
            k ^= k >> 24
            k = (k * M2) & MASK32
            h = ((h * M2) & MASK32) ^ k
        tail = p + (n & ~3)
        rem = n & 3
        if rem == 3:
            h ^= int(data[tail + 2]) << 16
        if rem >= 2:
            h ^= int(data[tail + 1]) << 8
        if rem >= 1:
            h ^= int(data[tail])
            h = (h * M2) & MASK32
        h ^= h >> 13
        h = (h * M2) & MASK32
        h ^= h >> 15
        out[i] = h
