"""Compile the codec's kernels into numba's on-disk cache: once per installation.

    python -m pylog.tools.warm_kernels

``make`` runs this after installing pylog, so that no query, worker or command of a new
installation compiles anything: it runs, with the compiled kernels selected, the storage paths
that call them (appends of binary and string keys, with and without headers; reads of every
record and of an offset range; the cleaner on a compacted topic; Kafka's partitioner) on a
small root in a temporary directory, so that every kernel signature those paths use is
compiled and cached.  Run again, it loads them from the cache in about a second.  Prints where
the cache is and how long it took; exits 1 when numba is unavailable (``PYLOG_NO_JIT`` set or
numba missing: nothing to warm).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pylog.storage.codec import _kernels, partitioner, records
from pylog.storage.codec.columns import timestamps_ms
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root.opening import open_root


def _rows(n: int, start: int) -> pa.Table:
    seq = range(start, start + n)
    return pa.table(
        {
            "key": pa.array([f"key-{s % 97:04d}".encode() for s in seq], pa.binary()),
            "value": pa.array([f"value {s} ".encode() * 3 for s in seq], pa.binary()),
        }
    )


def _read_only(table: pa.Table) -> pa.Table:
    """``table`` through Arrow's IPC format: its buffers become read-only, as the batches a
    Spark task receives."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return pa.ipc.open_stream(pa.py_buffer(sink.getvalue().to_pybytes())).read_all()


def run(where: Path) -> None:
    """The storage paths that call the kernels, on a new root under ``where``."""
    with open_root(where / "root") as root:
        root.create_topic("plain", partitions=4)
        compact = {"cleanup.policy": "compact", "segment.bytes": 8192}
        root.create_topic("compacted", partitions=2, config=compact)
        for i in range(3):
            root.append("plain", _rows(300, i * 300))
        for i in range(30):  # several segments of each partition, every key written again and again
            root.append("compacted", _rows(40, i * 40))
        strings = _rows(100, 0).cast(pa.schema([("key", pa.string()), ("value", pa.string())]))
        root.append("plain", strings)
        headers: pa.Array = pa.array(
            [[("h", b"v")]] * 100, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        )
        root.append("plain", _rows(100, 0).column("value"), key=_rows(100, 0).column("key"), headers=headers)
        root.append("plain", [b"no key"] * 10, timestamp=np.arange(10, dtype=np.int64))
        root.read_table("plain")
        root.read_table("plain", partitions=[0], start_offset=5, end_offset=50, include_headers=False)
        sum(b.num_rows for b in root.read_batches("compacted"))
        maintain(root, now=int(time.time() * 1000), force=True)
        root.read_table("compacted")
    # the Spark sink's path: every partition's batches in one pass over an Arrow batch's rows,
    # whose buffers are writable (built here) or read-only (received over IPC, as from Spark):
    # numba compiles each kind of array separately
    rows = _rows(100, 0).append_column("headers", headers)
    now = int(time.time() * 1000)
    string_values = rows.set_column(1, "value", rows["value"].cast(pa.string()))
    for table in (rows, _read_only(rows), _read_only(string_values)):
        value, key = table.column("value").chunk(0), table.column("key").chunk(0)  # as a task's batch
        for k in (key, None):
            for hdrs in (None, table.column("headers").chunk(0)):
                inp = records.EncodeInput.of(value, k, timestamps_ms(None, 100, now_ms=now), hdrs)
                encoded = records.encode_partitioned(inp, np.arange(100) % 4, np.zeros(4, np.int64))
        partitioner.partition_for_keys(key, 4)
        for enc in encoded.values():  # decoding a writable buffer and read-only bytes
            records.decode(np.array(enc.buffer, np.uint8))
            records.decode(bytes(enc.buffer))
    partitioner.partition_for_keys(pa.array([b"a", None, b"bc"]), 4)
    partitioner.partition_for_keys(pa.array(["a", None, "bc"], pa.large_string()), 4)


def main() -> int:
    t0 = time.perf_counter()
    jit = _kernels.compiled()
    if jit is None:
        print("pylog kernels: numba unavailable (PYLOG_NO_JIT set or numba missing); nothing to warm")
        return 1
    previous = _kernels.use("jit")
    try:
        with tempfile.TemporaryDirectory(prefix="pylog-warm-") as tmp:
            run(Path(tmp))
    finally:
        _kernels.restore(previous)
    where = getattr(getattr(jit.walk_records, "_cache", None), "_cache_path", "?")
    print(f"pylog kernels compiled and cached in {where} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
