"""Fuzz targets: pylog's parsers of untrusted bytes, with the oracle of TESTING.md §5.

Each target takes arbitrary bytes and must return normally or raise one of pylog's own errors
(``PylogError`` subclasses: ``CorruptRecordError``, ``CorruptIndexError``,
``CorruptCheckpointError``, ...), never ``IndexError``, ``ValueError``, ``KeyError``, ... ,
never hang, never allocate much more than its input.  :func:`run_one` raises
:class:`UnexpectedError` otherwise.  :func:`seeds` gives valid inputs to mutate, :func:`mutate`
the mutations (bit flips, byte overwrites with interesting values, truncation, insertion,
deletion, duplication, splicing), and :func:`fuzz_for` a seeded, time-bounded mutation loop
(used when atheris is missing, and by the Hypothesis tests).

Targets: ``decode`` (``records.decode``, RecordBatch v2 and legacy, with and without CRC
checks), ``index`` (``.index``/``.timeindex``/``.txnindex`` files: load, sanity check,
lookups, truncation), ``checkpoint`` (``checkpoint.parse_offsets``), ``state``
(``pylog-state.json``, ``publish.PublishState.from_json``) and ``offsets`` (the source's
offset JSON, ``connector.offsets.from_json``).
"""

from __future__ import annotations

import contextlib
import json
import random
import struct
import time
from collections.abc import Callable

import numpy as np

from pylog.connector import offsets as source_offsets
from pylog.storage.codec import records
from pylog.storage.errors import PylogError
from pylog.storage.partition import checkpoint
from pylog.storage.partition.index import OffsetIndex, TimeIndex
from pylog.storage.partition.txnindex import TxnIndex
from pylog.storage.root import publish as pub
from tests.reliability.memfs import MemStorage


class UnexpectedError(AssertionError):
    """A target raised something other than a pylog error, or took too long."""


def t_decode(data: bytes) -> None:
    verify = not (data[:1] and data[0] & 1)  # half of the inputs skip CRC checks, reaching deeper
    rs = records.decode(data, verify_crc=verify, path="fuzz.log", allow_torn_tail=bool(data[-1:] == b"\x00"))
    rs.records.validate()


def t_index(data: bytes) -> None:
    st = MemStorage("fuzz")
    base = int.from_bytes(data[:2], "big") if data else 0
    for kind, cls in (("index", OffsetIndex), ("timeindex", TimeIndex), ("txnindex", TxnIndex)):
        path = f"{kind}.file"
        st.write_atomic(path, data)
        idx = cls(st, path, base)  # type: ignore[abstract]
        with contextlib.suppress(PylogError):
            idx.sanity_check()
        probe = int.from_bytes(data[-4:], "big", signed=True) if len(data) >= 4 else 0
        if isinstance(idx, OffsetIndex):
            idx.lookup(probe)
            idx.lookup_many(np.array([probe, base, 2**63 - 1], dtype=np.int64))
            idx.entries()
            idx.truncate_to(base + abs(probe) % 100)
        elif isinstance(idx, TimeIndex):
            idx.lookup(probe)
            idx.lookup_many(np.array([probe, -1], dtype=np.int64))
            idx.last_entry  # noqa: B018
            idx.truncate_to(base + abs(probe) % 100)
        else:
            idx.aborted_in_range(probe, probe + 1000)
            idx.entries()
            idx.truncate_to(probe)


def t_checkpoint(data: bytes) -> None:
    checkpoint.parse_offsets(data, path="fuzz-checkpoint")


def t_state(data: bytes) -> None:
    pub.PublishState.from_json(data, "fuzz/pylog-state.json")


def t_offsets(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    source_offsets.from_json(text)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "decode": t_decode,
    "index": t_index,
    "checkpoint": t_checkpoint,
    "state": t_state,
    "offsets": t_offsets,
}


def seeds(target: str) -> list[bytes]:
    """Valid inputs of the target, the starting corpus."""
    if target == "decode":
        out = []
        for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
            enc = records.encode(
                [b"value-%d" % i for i in range(5)],
                key=[b"k%d" % i if i % 2 else None for i in range(5)],
                timestamp=np.arange(1_700_000_000_000, 1_700_000_000_005),
                headers=[[("h", b"x")]] * 5,
                codec=codec,
                batch_bytes=150,
            )
            out.append(enc.tobytes())
        out.append(bytes(records.control_batch(0, offset=7, producer_id=3, producer_epoch=1, timestamp=5)))
        return out
    if target == "index":
        off = b"".join(struct.pack(">ii", i * 3, i * 100) for i in range(6))
        ts = b"".join(struct.pack(">qi", 1000 + i, i * 3) for i in range(6))
        txn = b"".join(struct.pack(">hqqqq", 0, 7, i * 10, i * 10 + 5, i * 10) for i in range(3))
        return [off, ts, txn, b""]
    if target == "checkpoint":
        return [checkpoint.format_offsets({("t", 0): 5, ("topic.a", 12): 2**40}), b"0\n0\n", b""]
    if target == "state":
        s = pub.PublishState({("t", 0): 5, ("u", 3): 9}, {"q1": pub.QueryRecord(4, 1_700_000_000_000)})
        return [s.to_json(), b'{"version": 1, "high_watermarks": {}, "sinks": {}}']
    if target == "offsets":
        return [json.dumps({"t": {"0": 5, "1": -2}, "u": {"3": "timestamp:1700000000000"}}).encode(), b"{}"]
    raise KeyError(target)


INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFE]
INTERESTING_WIDE = [0, 1, -1, 2**31 - 1, -(2**31), 2**15, 61, 12, 2**30]


def mutate(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """One to four random mutations of ``data``."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        if op == 0 and b:  # bit flip
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # interesting byte
            b[rng.randrange(len(b))] = rng.choice(INTERESTING)
        elif op == 2 and len(b) >= 4:  # interesting int32 (lengths, counts)
            i = rng.randrange(len(b) - 3)
            b[i : i + 4] = struct.pack(">i", rng.choice(INTERESTING_WIDE))
        elif op == 3 and b:  # truncate
            del b[rng.randrange(len(b)) :]
        elif op == 4:  # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 5 and b:  # delete a range
            i = rng.randrange(len(b))
            del b[i : i + rng.randint(1, 16)]
        elif op == 6 and b:  # duplicate a range
            i = rng.randrange(len(b))
            b[i:i] = b[i : i + rng.randint(1, 64)]
        elif op == 7:  # splice with another input
            other = rng.choice(corpus)
            i, j = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
            b = b[:i] + bytearray(other[j:])
        elif op == 8 and b:  # overwrite with ASCII (text formats)
            i = rng.randrange(len(b))
            b[i] = rng.choice(b'0123456789-+ \n\r{}[]":,.ae')
    return bytes(b)


def run_one(target: str, data: bytes, *, max_seconds: float = 5.0) -> None:
    """Run ``target`` on ``data`` with the oracle: a pylog error or nothing, within
    ``max_seconds`` of this process's CPU time (a target is CPU-bound: a loop that never ends
    spends CPU, while a busy machine only stretches the wall clock)."""
    fn = TARGETS[target]
    t0 = time.process_time()
    try:
        fn(data)
    except PylogError:
        pass
    except Exception as e:  # the oracle: anything else is a bug
        raise UnexpectedError(
            f"{target}: {type(e).__name__}: {e} on input {data[:200]!r} ({len(data)} bytes)"
        ) from e
    elapsed = time.process_time() - t0
    if elapsed > max_seconds:
        raise UnexpectedError(
            f"{target}: took {elapsed:.1f}s of CPU on input {data[:200]!r} ({len(data)} bytes)"
        )


def fuzz_for(target: str, seconds: float, *, seed: int = 0, max_execs: int | None = None) -> int:
    """Seeded mutation fuzzing of ``target`` for ``seconds``; returns the number of executions."""
    rng = random.Random(seed)
    corpus = seeds(target)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and (max_execs is None or n < max_execs):
        data = mutate(rng.choice(corpus), rng, corpus)
        run_one(target, data)
        n += 1
        if rng.random() < 0.05 and len(corpus) < 200 and len(data) < 4096:
            corpus.append(data)  # keep some mutants: mutations of mutations reach further
    return n


__all__ = ["TARGETS", "UnexpectedError", "fuzz_for", "mutate", "run_one", "seeds"]
