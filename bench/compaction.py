"""Compaction benchmark: log cleaner throughput and memory against a plain copy of the same bytes.

    python bench/compaction.py [--quick]

- The log: 10 M records (``--quick``: 1 M) whose 16-byte keys are drawn uniformly from 1 M keys
  (``--quick``: 100 k), so each key is written about 10 times, with 100-byte random values,
  uncompressed, in 1 MiB batches and 128 MiB segments, rolled at the end so the whole log is
  dirty.  About 1.3 GB (``--quick``: 130 MB), in the page cache.
- compaction: one ``maintain(log, force=True)`` (the offset map over the dirty log, then every
  segment rewritten, swapped in, fsynced) in a fresh child process whose numba kernels are loaded
  first (a once-per-process cost, about 0.5 s, reported separately).  Throughput is the log's
  bytes divided by the time.  Its peak RSS is measured with the default
  ``log.cleaner.dedupe.buffer.size`` (128 MiB) and again, on a copy, with a 4x smaller buffer:
  the difference follows the setting, not the log size.
- plain copy: the same segment files read and written in 8 MiB chunks, fsynced (the durability
  compaction gives its output) and, separately, without fsync.
- Three rounds (``--quick``: two) of copy, copy, compaction (of the fresh fsynced copy),
  interleaved, report the best time of each: the figures stay comparable on a shared machine.

Prints a table, then as its last line a JSON object with ``copy_ratio`` (compaction MB/s ÷
durable plain copy MB/s), ``copy_ratio_no_fsync`` and ``peak_rss_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

T0 = 1_700_000_000_000
DIR = "t-0"
CHUNK = 1_000_000
MB = 1e6


def _keys(k: np.ndarray) -> pa.Array:
    n = k.shape[0]
    raw = np.empty((n, 16), np.uint8)
    raw[:, 0] = ord("k")
    for d in range(15):
        raw[:, 15 - d] = 48 + (k // 10**d) % 10
    offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 16)
    return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(raw.reshape(-1))])


def _config(segment_bytes: int) -> Any:
    from pylog.storage.config import LogConfig

    return LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": segment_bytes})


def generate(root: Path, n_keys: int, n_records: int, segment_bytes: int) -> tuple[int, int]:
    """Write the log; returns (bytes, distinct keys written)."""
    from pylog.storage.backends.local import LocalStorage
    from pylog.storage.partition.loader import open_log

    lg = open_log(LocalStorage(root), DIR, _config(segment_bytes), had_clean_shutdown=True)
    rng = np.random.default_rng(1)
    seen = np.zeros(n_keys, bool)
    for start in range(0, n_records, CHUNK):
        n = min(CHUNK, n_records - start)
        k = rng.integers(0, n_keys, n)
        seen[k] = True
        raw = rng.integers(0, 256, size=n * 100, dtype=np.uint8)
        offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 100)
        values = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(raw)])
        lg.append(values, key=_keys(k), timestamp=T0 + start + np.arange(n), codec="none")
    lg.roll()
    lg.flush()
    size = lg.size
    lg.close()
    return size, int(seen.sum())


def plain_copy(src: Path, dst: Path, *, fsync: bool) -> tuple[int, float]:
    """Copy every file of the partition directory in 8 MiB chunks: (bytes, seconds)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    total = 0
    t = time.perf_counter()
    for f in sorted(src.iterdir()):
        with open(f, "rb") as r, open(dst / f.name, "wb") as w:
            while True:
                b = r.read(8 << 20)
                if not b:
                    break
                w.write(b)
                total += len(b)
            w.flush()
            if fsync:
                os.fsync(w.fileno())
    if fsync:
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return total, time.perf_counter() - t


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``VmHWM``: unlike ``ru_maxrss`` it does not
    carry the parent's peak across fork + exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)


def child(root: str, dedupe: int, segment_bytes: int) -> None:
    """Run in a fresh process: compact the log at ``root`` and print one JSON line."""
    from pylog.storage.backends.local import LocalStorage
    from pylog.storage.config import CleanerConfig
    from pylog.storage.maintenance.cleaner import Cleaner
    from pylog.storage.maintenance.runner import maintain
    from pylog.storage.partition.loader import open_log

    rss = peak_rss_mb
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as warm:  # load the compiled kernels (numba cache)
        lg = open_log(LocalStorage(warm), DIR, _config(1024), had_clean_shutdown=True)
        for i in range(30):
            lg.append([b"v%d" % i], key=[b"k%d" % (i % 3)], timestamp=T0)
        lg.roll()
        maintain(lg, now=T0, force=True)
        lg.close()
    warmup_s = time.perf_counter() - t
    baseline = rss()
    cleaner = Cleaner(CleanerConfig.from_dict({"log.cleaner.dedupe.buffer.size": dedupe}))
    lg = open_log(LocalStorage(root), DIR, _config(segment_bytes), had_clean_shutdown=True)
    size = lg.size
    t, cpu = time.perf_counter(), time.process_time()
    report = maintain(lg, now=T0 + 10**6, force=True, cleaner=cleaner)
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    lg.close()
    out = {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "bytes": size,
        "passes": len(report.cleaning),
        "records_read": sum(c.records_read for c in report.cleaning),
        "records_retained": report.cleaning[-1].records_retained,  # the last pass rewrote everything
        "bytes_written": sum(c.bytes_written for c in report.cleaning),
        "peak_rss_mb": rss(),
        "baseline_rss_mb": baseline,
        "warmup_s": warmup_s,
    }
    print(json.dumps(out))


def run_child(root: Path, dedupe: int, segment_bytes: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(root), str(dedupe), str(segment_bytes)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compaction child failed:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 M records over 100 k keys (well under a minute)")
    ap.add_argument("--child", nargs=3, metavar=("ROOT", "DEDUPE", "SEGMENT_BYTES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    n_keys, n_records = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    segment_bytes = 128 << 20
    dedupe = 128 << 20
    rounds = 2 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="pylog-bench-") as tmp:
        base = Path(tmp)
        t = time.perf_counter()
        size, distinct = generate(base / "src", n_keys, n_records, segment_bytes)
        gen_s = time.perf_counter() - t
        src = base / "src" / DIR
        copies: dict[bool, list[float]] = {True: [], False: []}
        runs = []
        for _ in range(rounds):  # interleaved, best of each: the machine may be shared
            n, s = plain_copy(src, base / "scratch" / DIR, fsync=False)
            copies[False].append(s)
            shutil.rmtree(base / "work", ignore_errors=True)  # also the last round's checkpoints
            n, s = plain_copy(src, base / "work" / DIR, fsync=True)
            copies[True].append(s)
            assert n >= size
            runs.append(run_child(base / "work", dedupe, segment_bytes))  # compacts the fresh copy
        shutil.rmtree(base / "work", ignore_errors=True)
        plain_copy(src, base / "work" / DIR, fsync=False)
        small = run_child(base / "work", dedupe // 4, segment_bytes)
    copy_s, copy_nofsync_s = min(copies[True]), min(copies[False])
    big = min(runs, key=lambda r: float(r["seconds"]))
    for r in (big, small):  # one record per distinct key is left
        assert r["records_read"] >= n_records and r["records_retained"] == distinct, r
    compaction = size / big["seconds"] / MB
    copy = size / copy_s / MB
    copy_nofsync = size / copy_nofsync_s / MB
    rows = [
        ("log", f"{n_records:,} records, {n_keys:,} keys ({distinct:,} written), {size / MB:,.0f} MB"),
        ("generate", f"{gen_s:.1f} s"),
        ("compaction", f"{big['seconds']:.2f} s  {compaction:,.0f} MB/s  ({big['passes']} pass, "
                       f"{big['records_retained']:,} records and {big['bytes_written'] / MB:,.0f} MB kept; "
                       f"CPU {big['cpu_seconds']:.2f} s)"),
        ("plain copy + fsync", f"{copy_s:.2f} s  {copy:,.0f} MB/s"),
        ("plain copy", f"{copy_nofsync_s:.2f} s  {copy_nofsync:,.0f} MB/s"),
        ("copy_ratio", f"{compaction / copy:.2f} (no fsync: {compaction / copy_nofsync:.2f})"),
        ("peak RSS, 128 MiB map", f"{big['peak_rss_mb']:,.0f} MiB (process after kernel warm-up: "
                                  f"{big['baseline_rss_mb']:,.0f} MiB)"),
        ("peak RSS, 32 MiB map", f"{small['peak_rss_mb']:,.0f} MiB ({small['passes']} pass(es), "
                                 f"{small['seconds']:.2f} s)"),
        ("kernel warm-up", f"{big['warmup_s']:.2f} s per process (excluded)"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(
        json.dumps(
            {
                "bench": "compaction",
                "quick": args.quick,
                "records": n_records,
                "keys": n_keys,
                "log_mb": round(size / MB, 1),
                "compaction_mb_s": round(compaction, 1),
                "compaction_s": round(big["seconds"], 3),
                "compaction_cpu_s": round(big["cpu_seconds"], 3),
                "rounds": rounds,
                "copy_mb_s": round(copy, 1),
                "copy_no_fsync_mb_s": round(copy_nofsync, 1),
                "copy_ratio": round(compaction / copy, 3),
                "copy_ratio_no_fsync": round(compaction / copy_nofsync, 3),
                "peak_rss_mb": round(big["peak_rss_mb"], 1),
                "baseline_rss_mb": round(big["baseline_rss_mb"], 1),
                "peak_rss_mb_quarter_buffer": round(small["peak_rss_mb"], 1),
                "dedupe_buffer_mb": dedupe / (1 << 20),
            }
        )
    )


if __name__ == "__main__":
    main()
