"""The log cleaner's offset map: key -> latest offset in bounded memory (Kafka's ``SkimpyOffsetMap``).

Layout: one ``slots x 3`` int64 array of ``(h1, h2, offset + 1)``, 24 bytes a slot (the size of
a slot in Kafka's map: 16-byte MD5 + 8-byte offset), plus the slot number of every key (8 bytes
a key), so the map can list its offsets without scanning its table.  Both fit in
``log.cleaner.dedupe.buffer.size``: ``slots = memory // (24 + 8 * load factor)`` and the map
holds ``int(slots * log.cleaner.io.buffer.load.factor)`` keys (about 77% of what Kafka's map
holds in the same memory at the default load factor 0.9).  The table starts at 64 Ki slots and
grows 4-fold whenever it is 45% full until it reaches its final size, so a pass over few keys works
in a table that fits the CPU caches; a zero slot is empty, so the tables are lazily zeroed
allocations and memory is committed as slots are touched, never beyond the buffer.

Hash: MurmurHash3_x64_128 (seed 0) of the key bytes, computed for whole arrays of keys by a
compiled kernel (``_kernels_src.hash_keys``).  The map compares the full 128 bits, so two keys
are confused only if their 128-bit hashes are equal: the expected number of colliding pairs
among ``n`` distinct keys is about ``n**2 / 2**129`` (below 1e-20 for a billion keys), the same
bound as Kafka's MD5.  Should it happen, the two keys behave as one key: the older one's
records below the newer one's latest offset are removed, exactly as Kafka's map would do.
MurmurHash3 is not a cryptographic hash; keys chosen by an adversary to collide could make one
key's records disappear, as they could in Kafka by finding MD5 collisions.

Probing is linear from ``h1 mod slots``.  At the default load factor 0.9 a lookup of a present
key costs about 5.5 probes on average and of an absent key about 50 (Knuth), each in a
contiguous run of 24-byte slots.
"""

from __future__ import annotations

import numpy as np

from pylog.storage.codec import _kernels
from pylog.storage.errors import ConfigError

SLOT_BYTES = 24
KEY_BYTES = 8  # the slot list: one int64 per key
SEED = 0
INITIAL_SLOTS = 1 << 16
"""The smallest table (1.5 MiB): the table grows 4-fold whenever 45% full, through sizes that
end exactly at the buffer's, so a cleaning pass over few keys stays in the CPU caches."""
GROW_AT = 0.45
GROWTH = 4


def hash_spans(data: np.ndarray, pos: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MurmurHash3_x64_128 of each ``data[pos[i]:pos[i]+length[i]]`` as two int64 arrays.

    Every span must lie inside ``data`` (the compiled kernel does not check bounds)."""
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    length = np.ascontiguousarray(length, dtype=np.int64)
    if pos.shape[0] and ((length < 0).any() or (pos < 0).any() or (pos + length > data.shape[0]).any()):
        raise ValueError("key spans must be non-negative and inside the buffer")
    h1 = np.empty(pos.shape[0], np.int64)
    h2 = np.empty(pos.shape[0], np.int64)
    _kernels.active().hash_keys(data, pos, length, SEED, h1, h2)
    return h1, h2


def hash_keys(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hash_spans` of a list of byte strings (tests and tools)."""
    lengths = np.array([len(k) for k in keys], dtype=np.int64)
    pos = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if keys else lengths
    data = np.frombuffer(b"".join(keys) + b"\0", dtype=np.uint8)
    return hash_spans(data, pos, lengths)


class OffsetMap:
    """Key hash -> latest offset, at most ``capacity`` keys in ``memory`` bytes.

    ``latest_offset`` is the offset up to which the map is known to be complete (every keyed
    record at or below it and at or above the cleaning start was put); the cleaner sets it."""

    def __init__(self, memory: int, load_factor: float = 0.9):
        if not 0.0 < load_factor <= 1.0:
            raise ConfigError(f"offset map load factor must be in (0, 1], got {load_factor}")
        slots = int(int(memory) // (SLOT_BYTES + KEY_BYTES * load_factor))
        capacity = min(int(slots * load_factor), slots - 1)
        if capacity < 1:
            raise ConfigError(
                f"log.cleaner.dedupe.buffer.size={memory} with load factor {load_factor} holds no key: "
                f"the offset map needs at least {2 * (SLOT_BYTES + KEY_BYTES)} bytes ({SLOT_BYTES} per "
                f"slot, {KEY_BYTES} per key, and one slot always free)"
            )
        self.memory = int(memory)
        self.load_factor = float(load_factor)
        self.slots = slots  # the table's final size
        self.capacity = capacity
        self._state = np.zeros(1, np.int64)
        self._used = np.zeros(capacity, np.int64)
        self._frozen = False
        sizes = [slots]  # the table's sizes, each a quarter of the next, ending at ``slots``
        while sizes[-1] // GROWTH >= INITIAL_SLOTS:
            sizes.append(sizes[-1] // GROWTH)
        self._sizes = sizes[::-1]
        self.table = np.zeros((self._sizes[0], 3), np.int64)
        self.latest_offset = -1

    @property
    def size(self) -> int:
        """The number of distinct keys (hashes) in the map."""
        return int(self._state[0])

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def clear(self) -> None:
        self.table = np.zeros((self._sizes[0], 3), np.int64)  # fresh lazily zeroed pages
        self._used = np.zeros(self.capacity, np.int64)
        self._frozen = False
        self._state[0] = 0
        self.latest_offset = -1

    def put_hashes(self, h1: np.ndarray, h2: np.ndarray, offsets: np.ndarray) -> int:
        """Put pairs in order; stops before the first new key that does not fit.  Returns how
        many were put (``len(offsets)`` unless the map filled up)."""
        if self._frozen:
            raise ValueError("the offset map's offsets were listed: clear() it before putting keys again")
        n = h1.shape[0]
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        done = 0
        while done < n:
            final = self.table.shape[0] == self.slots
            limit = self.capacity if final else int(self.table.shape[0] * GROW_AT)
            done += int(
                _kernels.active().map_put(
                    self.table, self._used, h1[done:], h2[done:], offsets[done:], limit, self._state
                )
            )
            if done < n:
                if final:
                    break
                self._grow()
        return done

    def _grow(self) -> None:
        """Grow the table 4-fold (up to its final size).  The entries are copied out (24 bytes a
        key, while at most 45% of the old slots are used), the old table is freed, and the entries
        go into the new one: the table, the slot list and the copy stay within ``memory``."""
        n = self.size
        new_slots = self._sizes[self._sizes.index(self.table.shape[0]) + 1]
        used = self._used[:n]
        h1, h2, offsets = self.table[used, 0], self.table[used, 1], self.table[used, 2]  # 24 bytes a key
        offsets -= 1
        self.table = np.zeros((0, 3), np.int64)  # free the old table before the new one exists
        self.table = np.zeros((new_slots, 3), np.int64)
        self._state[0] = 0
        put = _kernels.active().map_put(self.table, self._used, h1, h2, offsets, n, self._state)
        assert put == n, "rehashing lost keys"

    def get_hashes(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """The latest offset of each hash, -1 for a key not in the map."""
        out = np.empty(h1.shape[0], np.int64)
        if h1.shape[0]:
            _kernels.active().map_get(self.table, h1, h2, out)
        return out

    def offsets(self) -> np.ndarray:
        """Every offset in the map, sorted: the slot list is overwritten with them (no memory
        beyond the buffer), so the map takes no more keys until :meth:`clear`; lookups still work."""
        n = self.size
        used = self._used[:n]
        if not self._frozen:
            column = self.table[:, 2]
            for i in range(0, n, 1 << 20):  # in place, a chunk at a time
                used[i : i + (1 << 20)] = column[used[i : i + (1 << 20)]]
            used -= 1
            used.sort()
            self._frozen = True
        return used

    def put(self, keys: list[bytes], offsets: list[int] | np.ndarray) -> int:
        h1, h2 = hash_keys(keys)
        return self.put_hashes(h1, h2, np.asarray(offsets, dtype=np.int64))

    def get(self, keys: list[bytes]) -> np.ndarray:
        h1, h2 = hash_keys(keys)
        return self.get_hashes(h1, h2)

    def __repr__(self) -> str:
        return (
            f"OffsetMap(slots={self.slots}, capacity={self.capacity}, size={self.size}, "
            f"latest_offset={self.latest_offset})"
        )
