"""pylog demo on a local directory (./demo-data): write Kafka-format record batches with every
codec, read them back into Arrow, and show Kafka's partitioner at work.

Run with ``make demo`` (creates .venv and installs pylog first).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pylog.storage import compression, records
from pylog.storage.partitioner import partition_for_keys

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-data")


def main() -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    n = 200_000
    keys = pa.array([f"user-{i % 1000}".encode() for i in range(n)])
    values = pa.array([b'{"event": "click", "n": %d}' % i for i in range(n)])
    now = int(time.time() * 1000)
    ts = now - np.arange(n, dtype=np.int64)[::-1]
    parts = partition_for_keys(keys, 4)
    print(
        f"{n} records; Kafka's murmur2 partitioner spreads their keys over 4 partitions: "
        f"{np.bincount(parts, minlength=4).tolist()}"
    )
    print(f"{'codec':8} {'segment bytes':>14} {'encode':>10} {'decode':>10}")
    for codec in compression.CODEC_NAMES.values():
        t0 = time.perf_counter()
        enc = records.encode(values, keys, ts, codec=codec, batch_bytes=256 * 1024)
        t1 = time.perf_counter()
        path = ROOT / f"events-{codec}-0" / "00000000000000000000.log"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(enc.tobytes())
        t2 = time.perf_counter()
        back = records.decode(path.read_bytes(), path=str(path))
        t3 = time.perf_counter()
        assert back.records.column("value").combine_chunks().equals(values)
        print(
            f"{codec:8} {path.stat().st_size:>14,} {n / (t1 - t0) / 1e6:>7.1f} M/s "
            f"{n / (t3 - t2) / 1e6:>7.1f} M/s"
        )
    table = back.records
    print(f"\nlast segment written: {path} ({len(back.batches)} batches)")
    print(
        table.slice(n - 3).select(["offset", "timestamp", "key", "value"]).to_pandas().to_string()
        if _has_pandas()
        else table.slice(n - 3).to_pylist()
    )


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
