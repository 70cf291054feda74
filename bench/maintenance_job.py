"""Maintenance as a Spark job: compaction throughput with 2 tasks against 1, and the driver's memory.

    python bench/maintenance_job.py [--quick] [--backend local|s3]

The roots live in a temporary directory (``local``, the default), or on moto's S3 server, run
in a process of its own on 127.0.0.1 (so that the driver's memory is the driver's; the server
then shares the 2 cores with the tasks).  Two identical roots are written: a compacted topic of
4 partitions, each holding ``--mb`` MiB (256, a 1 GiB log; 16 with ``--quick``: a job of a
fraction of a second then mostly measures Spark's scheduling) of 1 KiB records over 2,000
keys per partition in sealed segments of ``--segment-mb`` MiB (1).  ``pylog.connector.maintenance.run(...,
force=True)`` then compacts one root with at most 1 task and the other with at most 2
(local[2]).  Reported: the dirty bytes per second of each, their ratio, the time the tasks held
the root's writer lock (local disk), and the driver process's peak RSS while the jobs run
(VmHWM, reset before each job: the roots are written before) against the bytes of the log.
Prints a table, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
from _spark import local_spark
from compaction import peak_rss_mb

import pylog
from pylog.connector import maintenance

BUCKET = "pylog-bench"
PARTITIONS = 4


def start_moto() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    opts = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "bench",
        "secret": "bench",
        "client_kwargs.region_name": "us-east-1",
    }
    import s3fs

    deadline = time.monotonic() + 30
    while True:
        try:
            s3fs.S3FileSystem(
                endpoint_url=opts["endpoint_url"], key="bench", secret="bench", skip_instance_cache=True
            ).mkdir(BUCKET)
            return proc, opts
        except Exception:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)


def fill(url: str, opts: dict[str, str] | None, mib: int, segment_mib: int = 1) -> int:
    rng = np.random.default_rng(3)
    with pylog.open(url, opts) as root:
        root.create_topic(
            "c",
            PARTITIONS,
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(segment_mib << 20),
                "min.cleanable.dirty.ratio": "0.01",
            },
        )
        per_append = 1000
        for _ in range(mib):
            for p in range(PARTITIONS):
                keys = [b"key-%d" % k for k in rng.integers(0, 2000, size=per_append)]
                values = [bytes(rng.integers(97, 123, size=1000, dtype=np.uint8)) for _ in range(per_append)]
                root.append("c", pa.table({"key": keys, "value": values}), partition=p)
        return sum(s.size for p in range(PARTITIONS) for s in root.log("c", p).segments)


def reset_peak_rss() -> None:
    """Start this process's peak resident memory (VmHWM) afresh (Linux: ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mb", type=int, default=256, help="MiB per partition")
    ap.add_argument("--backend", choices=["local", "s3"], default="local")
    ap.add_argument("--segment-mb", type=int, default=1, help="segment.bytes in MiB")
    args = ap.parse_args()
    mib = 16 if args.quick else args.mb
    proc: subprocess.Popen[bytes] | None = None
    opts: dict[str, str] | None = None
    if args.backend == "s3":
        proc, opts = start_moto()
        base = f"s3://{BUCKET}"
    else:
        base = tempfile.mkdtemp(prefix="pylog-bench-maintenance-")
    spark = local_spark("pylog-bench-maintenance")
    results: dict[str, Any] = {}
    try:
        urls = {n: f"{base}/{uuid.uuid4().hex[:8]}" for n in (1, 2)}
        sizes = {n: fill(url, opts, mib, args.segment_mb) for n, url in urls.items()}
        warm = f"{base}/{uuid.uuid4().hex[:8]}"
        fill(warm, opts, 1)
        maintenance.run(spark, warm, storage_options=opts, force=True)  # Python workers, imports
        for n in (1, 2):
            t0 = time.perf_counter()
            reset_peak_rss()  # the roots were written by this process: count the job alone
            summary = maintenance.run(spark, urls[n], storage_options=opts, force=True, max_tasks=n)
            peak_mib = peak_rss_mb()
            secs = time.perf_counter() - t0
            assert summary.partitions_cleaned == PARTITIONS and not summary.errors, summary.describe()
            results[str(n)] = {
                "seconds": round(secs, 2),
                "dirty_MBps": round(sizes[n] / secs / 1e6, 1),
                "bytes_before": summary.bytes_before,
                "bytes_after": summary.bytes_after,
                "driver_peak_rss_bytes": int(peak_mib * 2**20),
                "lock_held_s": round(sum(p.lock_held_s for p in summary.partitions), 2),
            }
            print(
                f"{n} task(s): {summary.describe()}; {results[str(n)]['dirty_MBps']} MB/s of log", flush=True
            )
    finally:
        spark.stop()
        if proc is not None:
            proc.kill()
        else:
            shutil.rmtree(base, ignore_errors=True)
    peak = max(r["driver_peak_rss_bytes"] for r in results.values())
    out = {
        "bench": "maintenance_job",
        "backend": args.backend,
        "segment_bytes": args.segment_mb << 20,
        "partitions": PARTITIONS,
        "log_bytes": sizes[1],
        "tasks": results,
        "speedup_2_vs_1": round(results["2"]["dirty_MBps"] / results["1"]["dirty_MBps"], 2),
        "driver_peak_rss_bytes": peak,
    }
    mib_log = sizes[1] / 2**20
    rss = peak / 2**20
    print(
        f"2 tasks vs 1: {out['speedup_2_vs_1']}x; driver peak RSS {rss:.0f} MiB for a {mib_log:.0f} MiB log"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
