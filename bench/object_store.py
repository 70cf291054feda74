"""Object-store benchmark: pylog's streaming write and read paths on a local S3 server against
raw s3fs put/get of the same bytes, and the S3 requests each micro-batch costs.

    python bench/object_store.py [--quick]

The server is moto's S3 server on 127.0.0.1, started here (no network, no credentials).

- write: what the Spark sink does per micro-batch, minus Spark: the planner opens the root
  read-only (``make_writer``: the topics' metadata, which the writer carries to its tasks), two
  tasks stage their records without reading the root (``open_staging``): encoded
  RecordBatches; up to 4 MiB a task travel in the commit message, larger stagings are PUT as
  objects; the driver opens the root, publishes the
  batch exactly once (staged objects read, segments uploaded, one manifest created with
  put-if-absent, staged objects deleted) and runs the embedded maintenance (retention,
  compaction, merging of small segments, orphan sweeps).
  Peer: one ``s3fs.pipe_file`` per partition per micro-batch of the same encoded bytes.
- read: what the Spark source does per micro-batch: open the root (resolve the newest
  manifest) and read each partition's offset range of that micro-batch into Arrow.
  Peer: ``s3fs.cat_file`` of the peer's objects (the same bytes).

Ratios are pylog throughput / raw s3fs throughput in the same run (1.0 = as fast as raw
put/get).  ``requests_per_microbatch`` counts every S3 request of the write path (staging,
publish and maintenance) per micro-batch.  Prints a table, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

import pylog
from pylog.storage.codec import records
from pylog.storage.maintenance.merge import COMMIT_SMALL_MAX
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from pylog.storage.root.opening import open_root, open_staging

BUCKET = "pylog-bench"
STAGE_INLINE_BYTES = 4 << 20  # connector.sink.STAGE_INLINE_BYTES (not imported: no pyspark needed)
KNOWN_STATE_S = 30.0  # connector.sink_options.KNOWN_STATE_S: planning and commit start from a known state
PARTITIONS = 2
TASKS = 2


def start_server() -> tuple[Any, dict[str, str]]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {
        "endpoint_url": f"http://{host}:{port}",
        "key": "bench",
        "secret": "bench",
        "client_kwargs.region_name": "us-east-1",
    }
    return server, opts


def filesystem(opts: dict[str, str]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=opts["endpoint_url"], key=opts["key"], secret=opts["secret"], skip_instance_cache=True
    )


def micro_batch(rng: np.random.Generator, rows: int, value_size: int) -> dict[tuple[int, int], bytes]:
    """Encoded record batches per (task, partition) of one micro-batch (what its tasks stage)."""
    out = {}
    for tp in [(task, p) for task in range(TASKS) for p in range(PARTITIONS)]:
        n = rows // PARTITIONS // TASKS
        raw = rng.integers(0, 256, size=n * value_size, dtype=np.uint8)
        values = pa.Array.from_buffers(
            pa.binary(),
            n,
            [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * value_size), pa.py_buffer(raw)],
        )
        keys = pa.array([b"key-%d" % (i % 1000) for i in range(n)])
        enc = records.encode(values, keys, int(time.time() * 1000) + np.arange(n, dtype=np.int64))
        out[tp] = enc.buffer.tobytes()
    return out


KINDS: Counter[str] = Counter()


def requests_of(root: Root) -> int:
    return requests_of_storage(root.storage)


def requests_of_storage(storage: Any) -> int:
    counts = storage.store.requests.counts
    KINDS.update(counts)
    return sum(counts.values())


Batches = list[dict[tuple[int, int], bytes]]


def write_pylog(url: str, opts: dict[str, str], batches: Batches) -> tuple[float, int]:
    requests = 0
    t0 = time.perf_counter()
    for b, parts in enumerate(batches):
        staged = []
        # the writer's planning, every micro-batch
        planner = open_root(url, opts, read_only=True, trust_known_s=KNOWN_STATE_S)
        assert planner.partitions("t") == PARTITIONS
        requests += requests_of(planner)
        planner.close()
        for task in range(TASKS):  # each task stages its share of every partition, as the sink does
            storage = open_staging(url, opts)
            name = pub.stage_name("bench", b, task, 0)
            files = {p: storage.open_append(f"{partition_dir('t', p)}/{name}") for p in range(PARTITIONS)}
            for p, f in files.items():
                f.write(parts[(task, p)])
            small = sum(f.size() for f in files.values()) <= STAGE_INLINE_BYTES
            for p, f in files.items():
                if small:  # sent to the driver in the commit message
                    staged.append(pub.StagedFile("t", p, name, f.detach()))
                else:
                    f.close()
                    staged.append(pub.StagedFile("t", p, name))
            requests += requests_of_storage(storage)
        root = open_root(url, opts, trust_known_s=KNOWN_STATE_S)
        root.publish("bench", b, staged)
        maintain(  # as the sink's commit runs it (merges of segments under 1 MiB only)
            root,
            now=int(time.time() * 1000),
            budget_s=1.0,
            partitions=[("t", p) for p in range(PARTITIONS)],
            merge_below=COMMIT_SMALL_MAX,
        )
        requests += requests_of(root)
        root.close()
    return time.perf_counter() - t0, requests


def write_raw(fs: Any, prefix: str, batches: Batches) -> float:
    t0 = time.perf_counter()
    for b, parts in enumerate(batches):
        for (task, p), data in parts.items():
            fs.pipe_file(f"{prefix}/{p}/{b:06d}-{task}", data)
    return time.perf_counter() - t0


def read_pylog(url: str, opts: dict[str, str], ranges: list[dict[int, tuple[int, int]]]) -> tuple[float, int]:
    rows = 0
    t0 = time.perf_counter()
    for rng_ in ranges:
        root = pylog.open(url, opts, read_only=True)
        for p, (start, end) in rng_.items():
            rows += root.read_table("t", [p], start_offset=start, end_offset=end).num_rows
        root.close()
    return time.perf_counter() - t0, rows


def read_raw(fs: Any, prefix: str, batches: Batches) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for b, parts in enumerate(batches):
        for task, p in parts:
            n += len(fs.cat_file(f"{prefix}/{p}/{b:06d}-{task}"))
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller micro-batches")
    args = ap.parse_args()
    n_batches, rows, value_size = (20, 4_000, 200) if args.quick else (60, 20_000, 200)
    server, opts = start_server()
    try:
        fs = filesystem(opts)
        fs.mkdir(BUCKET)
        rng = np.random.default_rng(7)
        batches = [micro_batch(rng, rows, value_size) for _ in range(n_batches)]
        total_bytes = sum(len(d) for parts in batches for d in parts.values())
        url = f"s3://{BUCKET}/pylog-{uuid.uuid4().hex[:8]}"
        with pylog.open(url, opts) as root:
            root.create_topic("t", PARTITIONS, {"segment.bytes": 64 << 20})
        raw_prefix = f"{BUCKET}/raw-{uuid.uuid4().hex[:8]}"
        # alternate the contenders so that load from other jobs hits both alike
        w_raw = write_raw(fs, raw_prefix, batches)
        w_pylog, requests = write_pylog(url, opts, batches)
        ranges = []
        offs = dict.fromkeys(range(PARTITIONS), 0)
        per = rows // PARTITIONS // TASKS * TASKS
        for _ in batches:
            ranges.append({p: (offs[p], offs[p] + per) for p in range(PARTITIONS)})
            offs = {p: offs[p] + per for p in range(PARTITIONS)}
        r_raw, raw_bytes = read_raw(fs, raw_prefix, batches)
        r_pylog, got_rows = read_pylog(url, opts, ranges)
        r_raw2, _ = read_raw(fs, raw_prefix, batches)
        r_pylog2, _ = read_pylog(url, opts, ranges)
        r_raw, r_pylog = min(r_raw, r_raw2), min(r_pylog, r_pylog2)
        assert raw_bytes == total_bytes and got_rows == n_batches * per * PARTITIONS, (got_rows, raw_bytes)
        objects = len(fs.find(url[len("s3://") :]))
    finally:
        server.stop()
    mb = total_bytes / 1e6
    out = {
        "micro_batches": n_batches,
        "bytes": total_bytes,
        "write_MBps": round(mb / w_pylog, 2),
        "write_raw_MBps": round(mb / w_raw, 2),
        "read_MBps": round(mb / r_pylog, 2),
        "read_raw_MBps": round(mb / r_raw, 2),
        "write_ratio": round(w_raw / w_pylog, 3),
        "read_ratio": round(r_raw / r_pylog, 3),
        "requests_per_microbatch": round(requests / n_batches, 1),
        "objects_after": objects,
        "requests_by_kind": {k: round(v / n_batches, 2) for k, v in sorted(KINDS.items())},
    }
    print(f"{'path':<8}{'pylog MB/s':>12}{'raw s3fs MB/s':>15}{'ratio':>8}")
    print(f"{'write':<8}{out['write_MBps']:>12}{out['write_raw_MBps']:>15}{out['write_ratio']:>8}")
    print(f"{'read':<8}{out['read_MBps']:>12}{out['read_raw_MBps']:>15}{out['read_ratio']:>8}")
    kinds = ", ".join(f"{k} {v / n_batches:.1f}" for k, v in sorted(KINDS.items()))
    print(
        "S3 requests per micro-batch (staging + publish + maintenance): "
        f"{out['requests_per_microbatch']} ({kinds})"
    )
    print(f"objects under the root after {n_batches} micro-batches: {objects}")
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
