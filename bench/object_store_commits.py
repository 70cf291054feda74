"""Object-store commit scaling: does a commit cost what it changes, whatever the root's history?

    python bench/object_store_commits.py [--quick] [--partitions N] [--commits N] [--every-partition]
                                         [--rows FILE]
    python bench/object_store_commits.py --writers SECONDS

The server is moto's S3 server on 127.0.0.1, started here (no network, no credentials).

Default mode: one topic of 256 partitions; 1,000 commits, each ``Root.append`` of 8 small
records with random keys (a few partitions per commit), each followed by the maintenance the
Spark sink runs after its commit (retention, compaction, merging, within its budget).  Reported
per window of commits (10-100 and 900-1000): the median latency of the append's commit, the
median and mean bytes it writes (PUT and create bodies; the mean includes the periodic
checkpoints), and the LIST requests per commit; and the objects under the root as it grows.
``pylog.file_delete_delay_ms`` is 5 s here so that superseded objects are deleted within the run.

``--every-partition``: a wide-write workload instead: each commit appends 4 records to *every*
partition (one ``Root.append`` with an explicit partition per record), no maintenance in
between, so segment objects accumulate (a partition's active segment is sealed past 4 KiB);
reported per window (commits 20-50 and the last 30): the same figures, the median commit of
each hundred commits, and the objects (by default 1,000 commits at 256 partitions; progress on
stderr every hundred commits).

``--rows FILE``: also write every commit's figures to FILE (JSON), updated as the run goes.

``--writers SECONDS``: two writers append to two different topics of one root at full speed;
reported: commits of each, commits re-based on the other's (cheap), operations run again after
a real conflict, and a check that every record is there exactly once.

Prints a table, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from object_store import BUCKET, filesystem
from object_store import start_server as start_moto

import pylog
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root.manager import Root

_BYTES = threading.local()


def _count_bytes() -> None:
    """Count the body bytes of every PUT and create (per thread)."""
    put, put_many, create = ObjectClient.put, ObjectClient.put_many, ObjectClient._create_once

    def add(n: int) -> None:
        _BYTES.n = getattr(_BYTES, "n", 0) + n

    def put_counted(self: ObjectClient, key: str, data: bytes) -> None:
        add(len(data))
        put(self, key, data)

    def put_many_counted(self: ObjectClient, items: Any) -> None:
        items = list(items)
        add(sum(len(v) for _, v in items))
        put_many(self, items)

    def create_counted(self: ObjectClient, key: str, data: bytes) -> None:
        add(len(data))
        create(self, key, data)

    ObjectClient.put = put_counted  # type: ignore[method-assign]
    ObjectClient.put_many = put_many_counted  # type: ignore[method-assign]
    ObjectClient._create_once = create_counted  # type: ignore[method-assign]


def written() -> int:
    return int(getattr(_BYTES, "n", 0))


def start_server() -> tuple[Any, dict[str, str]]:
    """moto's S3 server on 127.0.0.1 (as in bench/object_store.py), with the bucket."""
    server, opts = start_moto()
    filesystem(opts).mkdir(BUCKET)
    return server, opts


def object_count(url: str, opts: dict[str, str]) -> dict[str, int]:
    """Objects under the root: metadata (commits, checkpoints, hint) and data (segments, indexes)."""
    keys = ObjectClient(url, opts).list("")
    meta = sum(1 for k in keys if k.startswith("_pylog/"))
    return {"metadata": meta, "data": len(keys) - meta}


def storage_of(root: Root) -> ObjectStorage:
    assert isinstance(root.storage, ObjectStorage)
    return root.storage


def window(rows: list[dict[str, float]], lo: int, hi: int) -> dict[str, float]:
    sel = [r for r in rows if lo <= r["commit"] < hi]
    return {
        "median_commit_ms": round(statistics.median(r["commit_ms"] for r in sel), 2),
        "median_bytes": int(statistics.median(r["bytes"] for r in sel)),
        "mean_bytes": int(statistics.mean(r["bytes"] for r in sel)),
        "lists_per_commit": round(statistics.mean(r["lists"] for r in sel), 3),
        "requests_per_commit": round(statistics.mean(r["requests"] for r in sel), 2),
        "median_maintenance_ms": round(statistics.median(r["maintain_ms"] for r in sel), 2),
    }


def run_commits(opts: dict[str, str], partitions: int, commits: int) -> dict[str, Any]:
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    opts = {**opts, "pylog.file_delete_delay_ms": "5000"}
    rng = np.random.default_rng(7)
    root = pylog.open(url, opts)
    root.create_topic("t", partitions=partitions)
    st = storage_of(root)
    counts = st.store.requests.counts
    rows: list[dict[str, float]] = []
    objects: dict[int, dict[str, int]] = {}
    for i in range(commits):
        keys = [b"key-%d" % k for k in rng.integers(0, 100_000, size=8)]
        values = [b"value-%d-" % i + b"x" * 90 for _ in range(8)]
        counts.clear()
        before = written()
        t0 = time.perf_counter()
        info = root.append("t", values, key=keys)
        t1 = time.perf_counter()
        nbytes = written() - before
        requests, lists = sum(counts.values()), counts.get("list", 0)
        maintain(root, now=int(time.time() * 1000), budget_s=2.0, partitions=[("t", p) for p in info])
        t2 = time.perf_counter()
        rows.append(
            {
                "commit": i,
                "commit_ms": (t1 - t0) * 1000,
                "bytes": nbytes,
                "lists": lists,
                "requests": requests,
                "maintain_ms": (t2 - t1) * 1000,
            }
        )
        if (i + 1) in (100, 500, commits):
            objects[i + 1] = object_count(url, opts)
    root.close()
    early = window(rows, 10, 100)
    late = window(rows, max(100, commits - 100), commits)
    with pylog.open(url, opts, read_only=True) as r:
        total = r.read_table("t").num_rows
    assert total == 8 * commits, total
    return {
        "partitions": partitions,
        "commits": commits,
        "early": early,
        "late": late,
        "latency_ratio": round(late["median_commit_ms"] / early["median_commit_ms"], 3),
        "bytes_ratio": round(late["mean_bytes"] / max(1, early["mean_bytes"]), 3),
        "objects": objects,
        "rebases": st.rebases,
    }


def run_every_partition(
    opts: dict[str, str], partitions: int, commits: int, rows_file: str | None = None
) -> dict[str, Any]:
    """A wide write: 4 records to every partition per commit, no maintenance in between."""
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    root = pylog.open(url, opts)
    root.create_topic("t", partitions=partitions)
    st = storage_of(root)
    counts = st.store.requests.counts
    rows: list[dict[str, float]] = []
    objects: dict[int, dict[str, int]] = {}
    part = [p for p in range(partitions) for _ in range(4)]
    keys = [b"k%d" % j for j in range(len(part))]
    for i in range(commits):
        values = [b"value-%d-%d-" % (i, j) + b"x" * 20 for j in range(len(part))]
        counts.clear()
        before = written()
        t0 = time.perf_counter()
        table = pa.table({"key": keys, "value": values, "partition": pa.array(part, pa.int32())})
        root.append("t", table)
        t1 = time.perf_counter()
        rows.append(
            {
                "commit": i,
                "commit_ms": (t1 - t0) * 1000,
                "bytes": written() - before,
                "lists": counts.get("list", 0),
                "requests": sum(counts.values()),
                "maintain_ms": 0.0,
            }
        )
        if (i + 1) % 100 == 0 or i + 1 == commits:
            objects[i + 1] = object_count(url, opts)
            recent = statistics.median(r["commit_ms"] for r in rows[-100:])
            print(f"{i + 1} commits: median of the last 100 {recent:.1f} ms", file=sys.stderr, flush=True)
            if rows_file:
                with open(rows_file, "w") as f:
                    json.dump(rows, f)
    root.close()
    early = window(rows, 20, 50)
    late = window(rows, commits - 30, commits)
    hundreds = {
        f"{lo + 1}-{min(lo + 100, commits)}": round(
            statistics.median(r["commit_ms"] for r in rows[lo : lo + 100]), 1
        )
        for lo in range(0, commits, 100)
    }
    with pylog.open(url, opts, read_only=True) as r:
        total = r.read_table("t").num_rows
    assert total == 4 * partitions * commits, total
    return {
        "mode": "every-partition",
        "partitions": partitions,
        "commits": commits,
        "early": early,
        "late": late,
        "latency_ratio": round(late["median_commit_ms"] / early["median_commit_ms"], 3),
        "bytes_ratio": round(late["mean_bytes"] / max(1, early["mean_bytes"]), 3),
        "median_commit_ms_per_hundred": hundreds,
        "objects": objects,
    }


def run_writers(opts: dict[str, str], seconds: float) -> dict[str, Any]:
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    with pylog.open(url, opts) as setup:
        setup.create_topic("x", partitions=16)
        setup.create_topic("y", partitions=16)
    stop = time.monotonic() + seconds
    out: dict[str, dict[str, int]] = {}
    errors: list[BaseException] = []

    def writer(topic: str) -> None:
        try:
            root = pylog.open(url, opts)
            n = 0
            while time.monotonic() < stop:
                root.append(
                    topic,
                    [b"%s-%d-%d" % (topic.encode(), n, j) for j in range(4)],
                    key=[b"%d" % j for j in range(4)],
                )
                n += 1
            st = storage_of(root)
            out[topic] = {"appends": n, "rebased": st.rebases, "ran_again": st.conflicts}
            root.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "xy"]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    exact = True
    with pylog.open(url, opts, read_only=True) as r:
        for t in "xy":
            got = r.read_table(t).column("value").to_pylist()
            exact &= len(got) == len(set(got)) == 4 * out[t]["appends"]
    return {"seconds": seconds, "writers": out, "exactly_once": exact}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 partitions, 200 commits")
    ap.add_argument("--partitions", type=int, default=256)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument(
        "--every-partition",
        action="store_true",
        help="4 records to every partition per commit, no maintenance",
    )
    ap.add_argument("--rows", help="--every-partition: write every commit's figures to this JSON file")
    ap.add_argument(
        "--writers", type=float, default=0.0, help="run the two-writer test for this many seconds"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    _count_bytes()
    server, opts = start_server()
    try:
        if args.writers:
            res = run_writers(opts, args.writers)
            for t, w in res["writers"].items():
                print(
                    f"topic {t}: {w['appends']} appends, {w['rebased']} re-based, {w['ran_again']} run again"
                )
            print(f"every record exactly once: {res['exactly_once']}")
        else:
            partitions, commits = (64, 200) if args.quick else (args.partitions, args.commits)
            if args.every_partition:
                res = run_every_partition(opts, partitions, commits, args.rows)
                print(f"{partitions} partitions, {commits} commits of 4 records to every partition")
                print(f"median commit per hundred commits (ms): {res['median_commit_ms_per_hundred']}")
            else:
                res = run_commits(opts, partitions, commits)
                print(f"{partitions} partitions, {commits} commits of 8 records (+ maintenance)")
            print(
                f"{'window':<14}{'commit ms':>10}{'bytes med':>11}{'bytes mean':>11}"
                f"{'LIST/commit':>12}{'req/commit':>11}"
            )
            for name in ("early", "late"):
                w = res[name]
                print(
                    f"{name:<14}{w['median_commit_ms']:>10}{w['median_bytes']:>11}{w['mean_bytes']:>11}"
                    f"{w['lists_per_commit']:>12}{w['requests_per_commit']:>11}"
                )
            print(f"latency ratio late/early {res['latency_ratio']}, bytes ratio {res['bytes_ratio']}")
            print(f"objects under the root after N commits: {res['objects']}")
        print(json.dumps(res))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
