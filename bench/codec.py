"""Codec benchmark: pylog vs kafka-python encoding and decoding the same records.

    python bench/codec.py [--quick]

For each case (value size x codec) both implementations encode the same records into
RecordBatch v2 batches of about 1 MiB and decode them back (kafka-python: iterate the records
reading offset, timestamp, key, value and headers, as a consumer does; pylog: decode into an
Arrow table holding the same fields).  Each measurement is the median of several runs on one
core.  Prints a table, then as its last line a JSON object with every figure and
``encode_ratio`` / ``decode_ratio`` (pylog / kafka-python, uncompressed 100-byte records).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pylog.storage.codec import compression, records

BATCH_BYTES = 1 << 20


def make_records(n: int, value_size: int, seed: int = 7) -> tuple[pa.Array, pa.Array, np.ndarray]:
    rng = np.random.default_rng(seed)
    # half random, half repeated bytes: compressible like real payloads, not trivially so
    raw = rng.integers(0, 256, size=(n, value_size), dtype=np.uint8)
    raw[:, value_size // 2 :] = ord("a")
    values = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * value_size), pa.py_buffer(raw.reshape(-1))],
    )
    keys = pa.array([b"key-%012d" % (i % 100_000) for i in range(n)], pa.binary())  # 16 bytes
    ts = 1_700_000_000_000 + np.arange(n, dtype=np.int64)
    return keys, values, ts


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm up (JIT load, allocator)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kp_encode(keys: list[bytes], values: list[bytes], ts: list[int], codec: int) -> list[bytes]:
    out = []
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, BATCH_BYTES)
    base = 0
    for i in range(len(values)):
        if builder.append(i - base, ts[i], keys[i], values[i], []) is None:
            out.append(bytes(builder.build()))
            builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, BATCH_BYTES)
            base = i
            builder.append(0, ts[i], keys[i], values[i], [])
    out.append(bytes(builder.build()))
    return out


def kp_decode(batches: list[bytes]) -> int:
    n = 0
    for raw in batches:
        for r in DefaultRecordBatch(raw):
            _ = (r.offset, r.timestamp, r.key, r.value, r.headers)
            n += 1
    return n


def run_case(n: int, value_size: int, codec: str, repeat: int) -> dict[str, float]:
    keys, values, ts = make_records(n, value_size)
    cid = compression.codec_id(codec)
    kl, vl, tl = keys.to_pylist(), values.to_pylist(), ts.tolist()
    enc = records.encode(values, keys, ts, codec=codec, batch_bytes=BATCH_BYTES)
    kp_batches = kp_encode(kl, vl, tl, cid)
    assert (
        kp_decode(
            [
                enc.tobytes()[int(p) : int(p + s)]
                for p, s in zip(enc.batches.position, enc.batches.size, strict=True)
            ]
        )
        == n
    )
    assert len(records.decode(b"".join(kp_batches))) == n
    raw_mb = n * (value_size + 16) / 1e6
    t = {
        "pylog_encode": timed(
            lambda: records.encode(values, keys, ts, codec=codec, batch_bytes=BATCH_BYTES), repeat
        ),
        "pylog_decode": timed(lambda: records.decode(enc.buffer), repeat),
        "kafka_python_encode": timed(lambda: kp_encode(kl, vl, tl, cid), max(1, repeat // 3)),
        "kafka_python_decode": timed(lambda: kp_decode(kp_batches), max(1, repeat // 3)),
    }
    out: dict[str, float] = {}
    for name, secs in t.items():
        out[f"{name}_records_per_s"] = n / secs
        out[f"{name}_mb_per_s"] = raw_mb / secs
    out["encode_ratio"] = t["kafka_python_encode"] / t["pylog_encode"]
    out["decode_ratio"] = t["kafka_python_decode"] / t["pylog_decode"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer records and repeats (about 30 s)")
    args = ap.parse_args()
    n = 50_000 if args.quick else 300_000
    repeat = 3 if args.quick else 7
    cases = [(100, "none"), (1024, "none"), (100, "lz4"), (1024, "lz4"), (100, "zstd")]
    results: dict[str, Any] = {"records": n, "batch_bytes": BATCH_BYTES}
    print(f"{n:,} records per case, 16-byte keys, ~{BATCH_BYTES >> 20} MiB batches, median of {repeat} runs")
    print(
        f"{'value':>6} {'codec':6} | {'pylog enc':>18} {'pylog dec':>18} | "
        f"{'kafka-py enc':>12} {'kafka-py dec':>12} | {'enc x':>6} {'dec x':>6}"
    )
    for size, codec in cases:
        r = run_case(n, size, codec, repeat)
        results[f"{size}B_{codec}"] = r
        print(
            f"{size:>6} {codec:6} | "
            f"{r['pylog_encode_records_per_s'] / 1e6:6.2f} M/s {r['pylog_encode_mb_per_s']:6.0f} MB/s "
            f"{r['pylog_decode_records_per_s'] / 1e6:6.2f} M/s {r['pylog_decode_mb_per_s']:6.0f} MB/s | "
            f"{r['kafka_python_encode_records_per_s'] / 1e6:8.3f} M/s "
            f"{r['kafka_python_decode_records_per_s'] / 1e6:8.3f} M/s | "
            f"{r['encode_ratio']:6.1f} {r['decode_ratio']:6.1f}",
            flush=True,
        )
    base = results["100B_none"]
    results["encode_ratio"] = base["encode_ratio"]
    results["decode_ratio"] = base["decode_ratio"]
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
