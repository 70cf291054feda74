"""Scale benchmark: opening a root of many partitions, or a partition of many segments.

    python bench/scale.py [--quick] [--repeat N]

For roots of 10 / 1,000 / 5,000 partitions (one topic) and for one partition of 10 / 1,000 /
10,000 segments, built beforehand and closed cleanly: the time to open the root and append one
record to one partition (the writer's first append; the median of ``--repeat`` opens, each
after a clean close, default 5, the cases of one kind taken round robin), then to read that
whole partition, and the file descriptors the process holds (``/proc/self/fd``) after each step
and at most while building. Runs under ``ulimit -n 1024`` (``resource.setrlimit`` in this
process); the append handles kept open are bounded by
``pylog.storage.backends.local.MAX_OPEN_APPEND_FILES``. Prints a table, then as its last line a
JSON object with every figure and the ratios largest / smallest case of the open + append
times. ``--quick``: 10 / 200 / 1,000 partitions and 10 / 100 / 1,000 segments.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

import pylog
from pylog.storage.backends import local
from pylog.storage.codec import records

NOFILE = 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def build_partitions(path: str, n: int) -> int:
    root = pylog.open(path)
    root.create_topic("t", partitions=n)
    peak = open_fds()
    for p in range(0, n, max(1, n // 100)):
        root.append("t", [b"v"], partition=p)
        peak = max(peak, open_fds())
    root.close()
    return peak


def build_segments(path: str, n: int) -> int:
    root = pylog.open(path)
    root.create_topic("t", partitions=1, config={"segment.bytes": 200})
    enc = records.encode([b"x" * 80] * n, base_offset=0, batch_bytes=100)  # one ~150-byte batch each
    root.append_batches({("t", 0): enc.buffer.tobytes()})
    peak = open_fds()
    root.close()
    return peak


def measure(path: str, partition: int, *, read: bool = True) -> dict[str, Any]:
    base = open_fds()
    t0 = time.perf_counter()
    root = pylog.open(path)
    root.append("t", [b"new"], partition=partition)
    t1 = time.perf_counter()
    fds_append = open_fds() - base
    rows, fds_read = 0, fds_append
    if read:
        rows = root.read_table("t", partitions=[partition]).num_rows
        fds_read = open_fds() - base
    t2 = time.perf_counter()
    root.close()
    return {
        "open_append_s": t1 - t0,
        "read_s": t2 - t1,
        "rows": rows,
        "fds_after_append": fds_append,
        "fds_after_read": fds_read,
    }


def measure_round_robin(cases: list[tuple[str, int]], repeat: int) -> list[dict[str, Any]]:
    """``repeat`` opens + appends of each case (``(path, partition)``, each after a clean close),
    taken round robin so that a change of the machine's load hits every case alike; the last
    round reads too.  Per case: the median open + append time, the last run's read and
    descriptors."""
    runs: list[list[dict[str, Any]]] = [[] for _ in cases]
    for r in range(repeat):
        for out, (path, partition) in zip(runs, cases, strict=True):
            out.append(measure(path, partition, read=r == repeat - 1))
    results = []
    for out in runs:
        times = [r["open_append_s"] for r in out]
        results.append({**out[-1], "open_append_s": statistics.median(times), "open_append_runs_s": times})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller cases (about 30 s)")
    ap.add_argument("--repeat", type=int, default=5, help="opens + appends per case (the median is shown)")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(NOFILE, hard), hard))
    partitions = [10, 200, 1000] if args.quick else [10, 1000, 5000]
    segments = [10, 100, 1000] if args.quick else [10, 1000, 10000]
    results: dict[str, Any] = {
        "ulimit_n": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "max_open_append_files": local.MAX_OPEN_APPEND_FILES,
        "fds_at_start": open_fds(),
    }
    print(
        f"ulimit -n {results['ulimit_n']}, append handle cache {local.MAX_OPEN_APPEND_FILES}, "
        f"{results['fds_at_start']} fds open at the start"
    )
    print(
        f"{'case':>22} | {'build peak fds':>14} | {'open+append':>11} {'fds':>5} | "
        f"{'read':>9} {'fds':>5} {'rows':>7}"
    )
    warm = tempfile.mkdtemp(prefix="pylog-scale-")  # imports and compiled kernels, outside the figures
    build_partitions(warm, 2)
    measure(warm, 0)
    shutil.rmtree(warm, ignore_errors=True)
    for kind, sizes, build in (
        ("partitions", partitions, build_partitions),
        ("segments", segments, build_segments),
    ):
        paths = [tempfile.mkdtemp(prefix="pylog-scale-") for _ in sizes]
        try:
            peaks = [build(path, n) for path, n in zip(paths, sizes, strict=True)]
            last = [n - 1 if kind == "partitions" else 0 for n in sizes]  # the partition appended to
            cases = list(zip(paths, last, strict=True))
            measured = measure_round_robin(cases, max(1, args.repeat))
        finally:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
        for n, peak, r in zip(sizes, peaks, measured, strict=True):
            r["build_peak_fds"] = peak
            results[f"{n}_{kind}"] = r
            print(
                f"{f'{n:,} {kind}':>22} | {peak:>14} | "
                f"{r['open_append_s'] * 1e3:>8.1f} ms {r['fds_after_append']:>5} | "
                f"{r['read_s'] * 1e3:>6.1f} ms {r['fds_after_read']:>5} {r['rows']:>7}",
                flush=True,
            )
        small, large = results[f"{sizes[0]}_{kind}"], results[f"{sizes[-1]}_{kind}"]
        results[f"{kind}_open_append_ratio"] = large["open_append_s"] / small["open_append_s"]
        results[f"{kind}_read_ratio"] = large["read_s"] / small["read_s"]
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
