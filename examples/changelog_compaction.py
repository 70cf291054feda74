"""A keyed changelog on a compacted topic: overwrites, tombstones, and the log cleaner.

A topic with ``cleanup.policy=compact`` keeps, for every key, at least its latest record (a
table's current state, as Kafka's compacted topics do).  This example:

1. creates ``customers`` (2 partitions, compacted, small segments so there is something to
   clean), writes 10 versions of 200 customer records and deletes 20 customers with tombstones
   (a null value);
2. runs the log cleaner through the maintenance API (``pylog.storage.maintenance.runner.maintain``)
   and shows the size before and after: only the latest record per key stays, at its original
   offset, and the tombstones stay too (until ``delete.retention.ms`` has passed, so that
   readers catch up with the deletes);
3. writes one more version, closes the root, and runs the operator command ``pylog compact``:
   the tombstones, now past their delete horizon, are gone; ``pylog verify`` checks every file.

No Spark needed:

    .venv/bin/python examples/changelog_compaction.py [DIR]    # default: demo-data/changelog
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from _common import demo_dir

import pylog
from pylog.storage.maintenance.runner import maintain

TOPIC = "customers"
CUSTOMERS = 200
DELETED = range(0, CUSTOMERS, 10)  # every tenth customer closes their account


def version(v: int, customers: list[int]) -> pa.Table:
    """Version ``v`` of each customer's record, keyed by the customer."""
    keys = [b"customer-%03d" % c for c in customers]
    values = [json.dumps({"id": c, "version": v, "tier": ("free", "pro")[(c + v) % 2]}) for c in customers]
    return pa.table({"key": keys, "value": [v.encode() for v in values]})


def current_state(table: pa.Table) -> dict[bytes, bytes | None]:
    """The latest value per key: what a consumer rebuilding the table from the log ends with."""
    state: dict[bytes, bytes | None] = {}
    order = pc.sort_indices(table, [("offset", "ascending")])
    keys, values = table.column("key").take(order), table.column("value").take(order)
    for k, v in zip(keys.to_pylist(), values.to_pylist(), strict=True):
        state[k] = v
    return state


def sizes(root: pylog.Root) -> str:
    parts = [root.log(TOPIC, p) for p in range(root.partitions(TOPIC))]
    table = root.read_table(TOPIC)
    tombstones = pc.sum(pc.is_null(table.column("value"))).as_py() or 0
    return (
        f"{sum(lg.size for lg in parts):>7,} bytes in {sum(len(lg.segments) for lg in parts):>2} segments, "
        f"{table.num_rows:>5} records ({tombstones} tombstones), log end offsets "
        f"{[lg.log_end_offset for lg in parts]}"
    )


def pylog_cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pylog", *args], capture_output=True, text=True, check=True)
    return out.stdout


def main() -> None:
    root_dir: Path = demo_dir("changelog", __doc__) / "pylog-root"
    everyone = list(range(CUSTOMERS))
    remaining = [c for c in everyone if c not in DELETED]
    gone = [b"customer-%03d" % c for c in DELETED]
    with pylog.open(root_dir) as root:
        root.create_topic(
            TOPIC,
            partitions=2,
            config={
                "cleanup.policy": "compact",
                "segment.bytes": 8192,  # small segments: the active (last) one is never cleaned
                "min.cleanable.dirty.ratio": 0.2,  # clean once 20% of the log is dirty (Kafka: 0.5)
                "delete.retention.ms": 0,  # tombstones go at the first pass after they were kept once
            },
        )
        for v in range(10):
            root.append(TOPIC, version(v, everyone))
        root.append(TOPIC, pa.table({"key": gone, "value": pa.array([None] * len(gone), pa.binary())}))
        root.append(TOPIC, version(10, remaining))  # so the tombstones are in a cleanable segment
        before = current_state(root.read_table(TOPIC))
        print(f"before compaction:   {sizes(root)}")

        report = maintain(root, now=int(time.time() * 1000))  # what `pylog compact` runs
        print(report.summary())
        print(f"after compaction:    {sizes(root)}")
        assert current_state(root.read_table(TOPIC)) == before, "compaction keeps every key's latest value"
        p0 = root.read_table(TOPIC, [0])
        offsets = p0.column("offset").to_pylist()
        print(
            f"  partition 0: {len(offsets)} records kept at their offsets {offsets[0]}..{offsets[-1]} "
            f"(log end {root.log(TOPIC, 0).log_end_offset}); the gaps are what was compacted away"
        )
        row = p0.slice(0, 1).to_pylist()[0]
        print(f"  e.g. offset {row['offset']}: {row['key'].decode()} = {row['value'].decode()}")
        print("  the tombstones stay for one pass, so consumers see the deletes")

        root.append(TOPIC, version(11, remaining))  # more changes: the log gets dirty again
    print("\none more version written and the root closed; now the operator command:")
    print("$ pylog compact", root_dir)
    print(pylog_cli("compact", str(root_dir)).rstrip())
    with pylog.open(root_dir, read_only=True) as root:
        print(f"after pylog compact: {sizes(root)}")
        state = current_state(root.read_table(TOPIC))
        assert len(state) == len(remaining) and None not in state.values(), "the tombstones are gone"
    print("$ pylog verify", root_dir)
    print(pylog_cli("verify", str(root_dir)).rstrip())


if __name__ == "__main__":
    main()
