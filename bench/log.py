"""Log engine benchmark: append and read against a plain file, lookup cost vs segment count.

    python bench/log.py [--quick]

- append: records (16-byte keys, 100-byte and 1 KiB values) appended to a pylog log in chunks
  of 10,000, flushed (fsync) at the end; peer: a plain sequential file write (and fsync) of the
  same encoded bytes in the same chunks.
- read: the whole log read by offset into an Arrow table; peer: reading the same files' bytes
  sequentially into memory.  Both are warmed once first (page cache, allocator), as in a
  streaming reader's steady state.
- lookup: median latency of reading the batch holding a random offset (16 KiB batches, as
  Kafka's default producer batch.size), in a log of 10,000 segments and in a log of 10
  segments holding the same records.

Prints a table, then as its last line a JSON object with the figures, ``append_ratio`` and
``read_ratio`` (pylog / plain file, 1 KiB records) and ``lookup_us_10000_segments``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.config import LogConfig
from pylog.storage.partition import loader
from pylog.storage.partition.log import Log

CHUNK = 10_000
BATCH = 16384  # lookups: producer-sized batches (Kafka's default batch.size)


def make(n: int, value_size: int) -> tuple[pa.Array, pa.Array, np.ndarray]:
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(n, value_size), dtype=np.uint8)
    values = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * value_size), pa.py_buffer(raw.reshape(-1))],
    )
    keys = pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            None,
            pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 16),
            pa.py_buffer(rng.integers(0, 256, size=16 * n, dtype=np.uint8)),
        ],
    )
    return keys, values, 1_700_000_000_000 + np.arange(n, dtype=np.int64)


def open_log(root: Path, **cfg: Any) -> Log:
    return loader.open_log(LocalStorage(root), "bench-0", LogConfig.from_dict(cfg), had_clean_shutdown=True)


def bench_append_read(tmp: Path, n: int, value_size: int, repeat: int) -> dict[str, float]:
    keys, values, ts = make(n, value_size)
    chunks = [(keys[i : i + CHUNK], values[i : i + CHUNK], ts[i : i + CHUNK]) for i in range(0, n, CHUNK)]
    encoded = [records.encode(v, k, t).tobytes() for k, v, t in chunks]
    total = sum(len(e) for e in encoded)
    t_app, t_plain, t_read, t_pread = [], [], [], []
    for r in range(repeat):
        d = tmp / f"a{r}"
        t0 = time.perf_counter()
        lg = open_log(d)
        for k, v, t in chunks:
            lg.append(v, k, t)
        lg.flush()
        t_app.append(time.perf_counter() - t0)
        p = tmp / f"plain{r}.bin"
        t0 = time.perf_counter()
        with open(p, "wb", buffering=0) as f:
            for e in encoded:
                f.write(e)
            os.fsync(f.fileno())
        t_plain.append(time.perf_counter() - t0)

        paths = [d / seg.log_path for seg in lg.segments]

        def plain_read() -> None:
            for path in paths:  # noqa: B023 - called within this iteration only
                with open(path, "rb") as f:
                    f.read()

        # both readers warmed once (allocator pages, page cache), as a streaming reader runs
        assert lg.read_table().num_rows == n
        plain_read()
        t0 = time.perf_counter()
        table = lg.read_table()
        t_read.append(time.perf_counter() - t0)
        assert table.num_rows == n
        t0 = time.perf_counter()
        plain_read()
        t_pread.append(time.perf_counter() - t0)
        lg.close()
        shutil.rmtree(d)
        p.unlink()
    mb = total / 1e6
    a, pw, rd, pr = (statistics.median(x) for x in (t_app, t_plain, t_read, t_pread))
    return {
        "bytes": total,
        "append_mb_per_s": mb / a,
        "plain_write_mb_per_s": mb / pw,
        "read_mb_per_s": mb / rd,
        "plain_read_mb_per_s": mb / pr,
        "append_records_per_s": n / a,
        "read_records_per_s": n / rd,
        "append_ratio": pw / a,
        "read_ratio": pr / rd,
    }


def bench_lookup(tmp: Path, segments: int, records_per_segment: int, probes: int) -> dict[str, float]:
    n = segments * records_per_segment
    keys, values, ts = make(n, 100)
    one = records.encode(
        values[:records_per_segment], keys[:records_per_segment], ts[:records_per_segment], batch_bytes=BATCH
    )
    seg_bytes = len(one) + 1  # exactly one chunk of records fits per segment
    lg = open_log(tmp / f"lk{segments}", **{"segment.bytes": seg_bytes, "index.interval.bytes": 4096})
    for i in range(0, n, records_per_segment):
        lg.append(
            values[i : i + records_per_segment],
            keys[i : i + records_per_segment],
            ts[i : i + records_per_segment],
            batch_bytes=BATCH,
        )
    lg.flush()
    assert len(lg.segments) >= segments
    rng = np.random.default_rng(5)
    targets = rng.integers(0, n, size=probes)
    for t in targets[: min(probes, 2000)]:  # warm the lazily loaded indexes, as a running reader
        lg.read(int(t), max_bytes=1)
    lat = []
    for t in targets:
        t0 = time.perf_counter()
        _, data = lg.read(int(t), max_bytes=1)
        lat.append(time.perf_counter() - t0)
        assert data
    lg.close()
    return {
        "segments": len(lg.segments),
        "lookup_us_median": statistics.median(lat) * 1e6,
        "lookup_us_p99": float(np.percentile(lat, 99)) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller logs, fewer repeats")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    n_small, n_large = (200_000, 50_000) if args.quick else (1_000_000, 300_000)
    repeat = 2 if args.quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-", dir=args.dir))
    out: dict[str, Any] = {}
    try:
        print(f"{'case':22} {'pylog MB/s':>11} {'plain MB/s':>11} {'ratio':>6}")
        for size, n in ((100, n_small), (1024, n_large)):
            r = bench_append_read(tmp, n, size, repeat)
            out[f"{size}B"] = r
            print(
                f"{f'append {size}B':22} {r['append_mb_per_s']:11.0f} {r['plain_write_mb_per_s']:11.0f} "
                f"{r['append_ratio']:6.2f}"
            )
            print(
                f"{f'read {size}B -> Arrow':22} {r['read_mb_per_s']:11.0f} {r['plain_read_mb_per_s']:11.0f} "
                f"{r['read_ratio']:6.2f}"
            )
        per_seg = 10
        for segs in (10, 10_000):
            r = bench_lookup(
                tmp, segs, per_seg if segs == 10_000 else per_seg * 1000, 2000 if args.quick else 10_000
            )
            out[f"lookup_{segs}"] = r
            label = f"lookup, {r['segments']} segments"
            print(f"{label:22} median {r['lookup_us_median']:7.1f} us  p99 {r['lookup_us_p99']:7.1f} us")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["append_ratio"] = out["1024B"]["append_ratio"]
    out["read_ratio"] = out["1024B"]["read_ratio"]
    out["lookup_us_10000_segments"] = out["lookup_10000"]["lookup_us_median"]
    out["lookup_us_10_segments"] = out["lookup_10"]["lookup_us_median"]
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
