"""pylog's main demo, on a local directory (default ./demo-data): a Kafka-format log with no
broker.  Creates a topic with 4 partitions, appends keyed events (Kafka's murmur2 partitioner
places them), reads them back as an Arrow table with Spark's Kafka columns, looks an offset up
by timestamp, closes cleanly, and shows the files: a real Kafka log directory.

    make demo                       # or: .venv/bin/python examples/demo.py [DIR]
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import pylog
from pylog.storage import records

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-data")


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    n = 500_000
    start = 1_700_000_000_000
    events = pa.table(
        {
            "key": pa.array([b"user-%d" % (i % 1000) for i in range(n)]),
            "value": pa.array([b'{"event": "click", "n": %d}' % i for i in range(n)]),
            "timestamp": pa.array(start + np.arange(n, dtype=np.int64), pa.timestamp("ms")),
        }
    )
    with pylog.open(ROOT) as root:
        root.create_topic(
            "events", partitions=4, config={"segment.bytes": 8 << 20, "compression.type": "lz4"}
        )
        t0 = time.perf_counter()
        written = root.append("events", events)
        t1 = time.perf_counter()
        print(
            f"appended {n:,} events in {t1 - t0:.2f} s ({n / (t1 - t0) / 1e6:.1f} M records/s), "
            f"lz4-compressed, across partitions:"
        )
        for p, info in sorted(written.items()):
            print(
                f"  partition {p}: offsets {info.first_offset}..{info.last_offset} "
                f"({info.num_batches} batches, {info.num_bytes:,} bytes)"
            )
        t0 = time.perf_counter()
        table = root.read_table("events")
        t1 = time.perf_counter()
        print(f"read back {table.num_rows:,} records in {t1 - t0:.2f} s; columns: {table.column_names}")
        log = root.log("events", 0)
        hit = log.offset_for_timestamp(start + n // 2)
        found = hit.offset if hit else None
        print(f"first record at or after t={start + n // 2} in partition 0: offset {found}")
        print(table.slice(0, 3).select(["key", "value", "partition", "offset", "timestamp"]).to_pylist())
    # the root is a Kafka log directory: checkpoints, clean-shutdown marker, partition dirs
    print(f"\n{ROOT}/")
    for path in sorted(ROOT.rglob("*"))[:16]:
        print(
            f"  {path.relative_to(ROOT)}" + (f"  ({path.stat().st_size:,} bytes)" if path.is_file() else "/")
        )
    seg = next((ROOT / "events-0").glob("*.log"))
    rs = records.decode(seg.read_bytes(), path=str(seg))
    print(
        f"\n{seg}: {len(rs.batches)} batches, codec {int(rs.batches.codec[0])} (lz4), "
        f"offsets {int(rs.batches.base_offset[0])}..{int(rs.batches.last_offset[-1])}"
    )
    print(f"inspect it like kafka-dump-log.sh:  .venv/bin/pylog dump --files {seg} | head")


if __name__ == "__main__":
    main()
