"""A tour of pylog's Python API, with no broker and no Spark.  Creates a topic with 4
partitions, appends 500,000 keyed events (Kafka's murmur2 partitioner places them), reads them
back as an Arrow table with Spark's Kafka columns, looks an offset up by timestamp, closes
cleanly, and shows the files: a real Kafka log directory.

    .venv/bin/python examples/api_tour.py [DIR]

The root is ``DIR/pylog-root`` (default ``demo-data/api-tour/pylog-root``); a re-run starts over.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
from _common import demo_dir, pylog_command, shown

import pylog
from pylog.storage.codec import records


def main() -> None:
    root_dir = demo_dir("api-tour", __doc__) / "pylog-root"
    n = 500_000
    start = 1_700_000_000_000
    events = pa.table(
        {
            "key": pa.array([b"user-%d" % (i % 1000) for i in range(n)]),
            "value": pa.array([b'{"event": "click", "n": %d}' % i for i in range(n)]),
            "timestamp": pa.array(start + np.arange(n, dtype=np.int64), pa.timestamp("ms")),
        }
    )
    with pylog.open(root_dir) as root:
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
    print(f"\n{root_dir}/")
    for path in sorted(root_dir.rglob("*"))[:16]:
        size = f"  ({path.stat().st_size:,} bytes)" if path.is_file() else "/"
        print(f"  {path.relative_to(root_dir)}{size}")
    seg = next((root_dir / "events-0").glob("*.log"))
    rs = records.decode(seg.read_bytes(), path=str(seg))
    print(
        f"\n{seg}: {len(rs.batches)} batches, codec {int(rs.batches.codec[0])} (lz4), "
        f"offsets {int(rs.batches.base_offset[0])}..{int(rs.batches.last_offset[-1])}"
    )
    print(f"inspect it like kafka-dump-log.sh:  {pylog_command()} dump --files {shown(seg)} | head")
    print(
        "\nnext: examples/demo.py (make demo: the Spark streaming pipeline), duckdb_analytics.py, "
        "changelog_compaction.py, kafka_interop.py and the notebook examples/analyst.ipynb (see README.md)"
    )


if __name__ == "__main__":
    main()
