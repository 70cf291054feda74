"""``pylog serve`` benchmark: Kafka clients (confluent-kafka) through the server against pylog's
own API over the same files, and produce-to-consume latency on local disk and on S3.

    python bench/serve.py [--quick] [--only consume,produce,latency,s3]

The server runs as ``python -m pylog serve ROOT --port 0`` in its own process, as users run it.

- consume: a topic of 1 GiB (1 KiB values, 4 partitions, written with ``Root.append``) read
  whole by a ``confluent_kafka.Consumer`` through the server (assigned partitions from offset 0,
  no group, fetches of up to 16 MB a partition, ``consume()`` batches of 10,000, every value's
  bytes counted) against ``root.read_batches(topic)`` over the same files (Arrow batches, value
  bytes counted).  Both read from the page cache; each runs twice, alternating, the best run
  counts.  ``consume_ratio`` = server rate / read_batches rate.
- produce: 512 MiB of 1 KiB records sent by a ``confluent_kafka.Producer`` (acks=all,
  linger.ms=10, batch.size 1 MB, partitions round robin) until every one is acknowledged,
  against ``Root.append`` of the same records (10,000 per call, each call durable) into a fresh
  root; twice each, alternating, the best run counts.  ``produce_ratio`` = server rate / append
  rate.
- latency: one producer thread sends one small record every 2 ms (linger.ms=0, acks=all; the
  value is ``time.perf_counter()`` at the send); a consumer in the same process, waiting in
  fetches of ``fetch.wait.max.ms=500``, takes each delivery's perf_counter delta (and the
  producer each acknowledgement's).  The server wakes a waiting fetch right after the commit that
  appended to its partition, so this is produce request + group commit + fetch response.
  p50 / p99 of 500 records (200 with ``--quick``) after 1 s of warm-up, on local disk and on S3.
- S3: moto's S3 server, in its own process on 127.0.0.1 (no network, no credentials), counts
  every HTTP request it gets, by method and key pattern; ``s3_requests_per_produce`` and
  ``s3_requests_per_commit`` are the requests made during the S3 latency run (the server's: the
  benchmark makes none then) divided by the Produce requests it answered and the group commits it
  made (both from its ``--metrics`` log line).

CPU seconds per GiB of the server process and of this one (the client: the Python loop and
librdkafka's threads) are reported beside the rates: on a 2-core machine they say which side
bounds a rate.  ``--quick`` moves 64 MiB instead (fixed costs then weigh more: a quick check that
everything runs, not figures).  Prints a table, then as its last line one JSON object with every
figure, the ratios, the goals and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import pylog

TOPIC = "t"
LATENCY_TOPIC = "lat"
PARTITIONS = 4
VALUE = 1024
APPEND_RECORDS = 10_000  # records per Root.append call (produce peer)
GOALS = {"consume_ratio": 0.5, "produce_ratio": 0.5, "latency_p50_ms": 5.0, "latency_p99_ms": 20.0}
BUCKET = "pylog-bench-serve"
S3_OPTIONS = {"key": "testing", "secret": "testing", "client_kwargs.region_name": "us-east-1"}
START_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------- the server process


class Serve:
    """One ``pylog serve`` process (the port from its first line; SIGTERM stops it)."""

    def __init__(
        self, root: str, log_path: Path, options: dict[str, str] | None = None, metrics_s: float = 0
    ):
        args = [sys.executable, "-m", "pylog", "serve", root, "--port", "0"]
        for k, v in (options or {}).items():
            args += ["-S", f"{k}={v}"]
        if metrics_s:
            args += ["--metrics", str(metrics_s)]
        self.log_path = log_path
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=open(log_path, "wb"),  # noqa: SIM115 - the child holds it
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            cwd=Path(__file__).resolve().parent.parent,
        )
        first = _first_line(self.proc, START_TIMEOUT_S, log_path)
        m = re.search(r"listening on (\S+):(\d+)", first)
        assert m is not None, first
        self.bootstrap = f"127.0.0.1:{m.group(2)}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, int]:
        """Counts of the last ``--metrics`` line: requests per API, and the store's commits."""
        lines = [ln for ln in self.log().splitlines() if "metrics:" in ln]
        if not lines:
            return {}
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
            assert code == 0, f"pylog serve exited with {code}: {self.log()[-3000:]}"


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (default: this one, with
    every thread it ran, librdkafka's included)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds of this process (the client) and of the server over a ``with`` block."""

    def __init__(self, server_pid: int):
        self.pid = server_pid
        self.client = self.server = 0.0

    def __enter__(self) -> Cpu:
        self._c, self._s = cpu_s(), cpu_s(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client, self.server = cpu_s() - self._c, cpu_s(self.pid) - self._s


def _first_line(proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    got = b""
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"the server did not start: {log_path.read_text(errors='replace')[-3000:]}")
        if select.select([proc.stdout], [], [], left)[0]:
            got += os.read(proc.stdout.fileno(), 4096)
    return got.split(b"\n")[0].decode()


# ---------------------------------------------------------------------------- data


def values_block(n: int, seed: int = 3) -> pa.Array:
    """``n`` random values of VALUE bytes (incompressible, as the codec never matters here)."""
    raw = np.random.default_rng(seed).integers(0, 256, size=n * VALUE, dtype=np.uint8)
    offsets = np.arange(n + 1, dtype=np.int32) * VALUE
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw)])


def value_bytes(batch: pa.RecordBatch) -> int:
    return int(pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0)


def generate(path: str, total: int) -> int:
    """A topic of ``total`` value bytes, 1 KiB values round robin over the partitions; its
    record count."""
    block = values_block(16_384)
    n = 0
    with pylog.open(path) as root:
        root.create_topic(TOPIC, PARTITIONS)
        for i in range(max(1, total // (len(block) * VALUE))):
            root.append(TOPIC, block, partition=i % PARTITIONS)
            n += len(block)
    return n


# ---------------------------------------------------------------------------- (a) consume


def read_batches(path: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    n = nbytes = 0
    with pylog.open(path, read_only=True) as root:
        for b in root.read_batches(TOPIC):
            n += b.num_rows
            nbytes += value_bytes(b)
    return time.perf_counter() - t0, n, nbytes


def consumer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",  # required by the client; never joined (assign)
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        **extra,
    }


def consume_server(bootstrap: str, expected: int) -> tuple[float, int, int]:
    from confluent_kafka import Consumer, Message, TopicPartition

    c = Consumer(
        consumer_config(
            bootstrap,
            **{
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 16 << 20,
                "receive.message.max.bytes": (64 << 20) + 4096,
                "queued.max.messages.kbytes": 512 << 10,
                "queued.min.messages": 1_000_000,
                "fetch.wait.max.ms": 100,
            },
        )
    )
    t0 = time.perf_counter()
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    n = nbytes = 0
    deadline = time.monotonic() + 600
    while n < expected and time.monotonic() < deadline:
        msgs = c.consume(num_messages=min(10_000, expected - n), timeout=1.0)
        if any(map(Message.error, msgs)):
            msgs = [m for m in msgs if m.error() is None]
        n += len(msgs)
        nbytes += sum(map(len, map(Message.value, msgs)))  # each value, as bytes
    secs = time.perf_counter() - t0
    c.close()
    assert n == expected, (n, expected)
    return secs, n, nbytes


# ---------------------------------------------------------------------------- (b) produce


def append_root(path: str, block: pa.Array, n: int) -> float:
    """Seconds to append ``n`` records of ``block`` (cycled) to a fresh root at ``path``."""
    with pylog.open(path) as root:
        root.create_topic(TOPIC, PARTITIONS)
        t0 = time.perf_counter()
        for c, i in enumerate(range(0, n, APPEND_RECORDS)):
            j = i % len(block)
            root.append(TOPIC, block[j : j + min(APPEND_RECORDS, n - i)], partition=c % PARTITIONS)
        return time.perf_counter() - t0


def produce_server(bootstrap: str, values: list[bytes], n: int, topic: str = TOPIC) -> float:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 10,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
        }
    )
    p.list_topics(topic, timeout=30)  # metadata before the clock starts
    produce = p.produce
    nv = len(values)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                produce(topic, values[i % nv], partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.005)
        if not i & 1023:
            p.poll(0)
    assert p.flush(600) == 0
    return time.perf_counter() - t0


def records_in(path: str, topic: str = TOPIC) -> int:
    with pylog.open(path, read_only=True) as root:
        return sum(root.log(topic, p).log_end_offset for p in range(root.partitions(topic)))


# ---------------------------------------------------------------------------- (c, d) latency


def latency(bootstrap: str, count: int, warmup_s: float, interval_s: float = 0.002) -> dict[str, list[float]]:
    """Milliseconds from each send to its delivery to the consumer (``consume``) and to the
    producer's acknowledgement (``ack``), for ``count`` records sent after ``warmup_s`` of
    records not counted (see the module docstring)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    c = Consumer(consumer_config(bootstrap, **{"fetch.wait.max.ms": 500, "fetch.min.bytes": 1}))
    p.list_topics(LATENCY_TOPIC, timeout=30)
    _, end = c.get_watermark_offsets(TopicPartition(LATENCY_TOPIC, 0), timeout=30)
    c.assign([TopicPartition(LATENCY_TOPIC, 0, end)])
    c.consume(num_messages=1, timeout=0.5)  # connected, fetching
    pack, unpack = struct.Struct(">d").pack, struct.Struct(">d").unpack
    start = time.perf_counter()
    measured_from = start + warmup_s
    acks: list[float] = []
    sent = [0]

    def acked(err: Any, msg: Any) -> None:
        sent_at = unpack(msg.value())[0]
        if err is None and sent_at >= measured_from:
            acks.append((time.perf_counter() - sent_at) * 1000)

    def send() -> None:
        nxt = time.perf_counter()
        while sent[0] < count:
            now = time.perf_counter()
            p.produce(LATENCY_TOPIC, pack(now), partition=0, on_delivery=acked)
            p.poll(0)
            if now >= measured_from:
                sent[0] += 1
            nxt += interval_s
            time.sleep(max(0.0, nxt - time.perf_counter()))
        p.flush(60)

    sender = threading.Thread(target=send)
    sender.start()
    got: list[float] = []
    deadline = time.monotonic() + 120 + warmup_s + count * interval_s
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)  # (consume(n) would wait for n records)
        if m is not None and m.error() is None:
            sent_at = unpack(m.value())[0]
            if sent_at >= measured_from:
                got.append((time.perf_counter() - sent_at) * 1000)
    sender.join()
    c.close()
    assert len(got) == count == len(acks), (len(got), len(acks), count)
    return {"consume": got, "ack": acks}


def latency_figures(lat: dict[str, list[float]]) -> dict[str, float]:
    out = percentiles(lat["consume"])
    ack = percentiles(lat["ack"])
    out.update({"ack_p50_ms": ack["p50_ms"], "ack_p99_ms": ack["p99_ms"], "records": len(lat["consume"])})
    return out


def commit_figures(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """The server's group commits between two of its metrics lines: how many, their mean time,
    and Produce requests per commit."""
    commits = after.get("commits", 0) - before.get("commits", 0)
    produces = after.get("Produce", 0) - before.get("Produce", 0)
    ms = after.get("commit_ms", 0) - before.get("commit_ms", 0)
    return {
        "commits": commits,
        "commit_ms_mean": round(ms / commits, 2) if commits else None,
        "produce_requests_per_commit": round(produces / commits, 2) if commits else None,
    }


def fsync_probe(tmp: Path, n: int = 100) -> dict[str, float]:
    """p50 / p99 milliseconds of appending 100 bytes to a file and fsyncing it, here and now: what
    one durable write costs on this disk while the benchmark runs (a local commit makes three)."""
    times = []
    fd = os.open(tmp / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(n):
            os.write(fd, b"x" * 100)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
    return {"p50_ms": round(statistics.median(times), 2), "p99_ms": round(float(np.percentile(times, 99)), 2)}


def percentiles(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(float(np.percentile(ms, 90)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(max(ms), 2),
    }


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        f.result(30)


# ---------------------------------------------------------------------------- S3 (moto, counted)


def moto_main() -> None:
    """``--moto``: moto's S3 server on 127.0.0.1 (port on the first line), counting requests;
    ``GET /_bench/counts`` answers the counts so far."""
    import logging

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == "/_bench/counts":
            body = json.dumps(dict(counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        if "list-type" in query or "prefix=" in query:
            kind = f"{method} (list)"
        else:  # the key under the root; ids as *, numbers as #
            key = "/".join(environ["PATH_INFO"].split("/")[3:])
            kind = f"{method} {re.sub(r'[0-9]+', '#', re.sub(r'[0-9a-f]{8,}', '*', key))}"
        with lock:
            counts[kind] += 1
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, threaded=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def s3_counts(endpoint: str) -> Counter[str]:
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/_bench/counts", timeout=30) as r:
        return Counter(json.loads(r.read()))


def latency_s3(tmp: Path, count: int, warmup_s: float) -> dict[str, Any]:
    import s3fs

    moto = subprocess.Popen(
        [sys.executable, __file__, "--moto"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        port = int(_first_line(moto, 60, Path(os.devnull)))
        endpoint = f"http://127.0.0.1:{port}"
        fs = s3fs.S3FileSystem(
            endpoint_url=endpoint, key="testing", secret="testing", skip_instance_cache=True
        )
        fs.mkdir(BUCKET)
        opts = {"endpoint_url": endpoint, **S3_OPTIONS}
        serve = Serve(f"s3://{BUCKET}/root-{uuid.uuid4().hex[:8]}", tmp / "serve-s3.log", opts, metrics_s=0.2)
        try:
            create_topics(serve.bootstrap, {LATENCY_TOPIC: 1})
            time.sleep(0.5)
            m0, c0 = serve.metrics(), s3_counts(endpoint)
            lat = latency(serve.bootstrap, count, warmup_s)
            time.sleep(0.6)  # the next metrics line: every request answered so far
            m1, c1 = serve.metrics(), s3_counts(endpoint)
        finally:
            serve.stop()
    finally:
        moto.send_signal(signal.SIGTERM)
        moto.wait(30)
    produces = m1.get("Produce", 0) - m0.get("Produce", 0)
    fetches = m1.get("Fetch", 0) - m0.get("Fetch", 0)
    commits = m1.get("commits", 0) - m0.get("commits", 0)
    commit_ms = m1.get("commit_ms", 0) - m0.get("commit_ms", 0)
    reqs = c1 - c0
    total = sum(reqs.values())
    return {
        **latency_figures(lat),
        "produce_requests": produces,
        "fetch_requests": fetches,
        "commits": commits,
        "s3_requests": total,
        "s3_requests_by_kind": dict(sorted(reqs.items())),
        "s3_requests_per_produce": round(total / produces, 2) if produces else None,
        "s3_requests_per_commit": round(total / commits, 2) if commits else None,
        "produce_requests_per_commit": round(produces / commits, 2) if commits else None,
        "commit_ms_mean": round(commit_ms / commits, 2) if commits else None,
    }


# ---------------------------------------------------------------------------- main


def bench_consume(tmp: Path, total: int, runs: int) -> dict[str, Any]:
    path = str(tmp / "consume")
    t0 = time.perf_counter()
    n = generate(path, total)
    gen_s = time.perf_counter() - t0
    local: list[tuple[float, int, int]] = []
    server: list[tuple[float, int, int]] = []
    cpu: list[Cpu] = []
    serve = Serve(path, tmp / "serve-consume.log")
    try:
        for _ in range(runs):  # alternating; both read from the page cache
            local.append(read_batches(path))
            with Cpu(serve.proc.pid) as c:
                server.append(consume_server(serve.bootstrap, n))
            cpu.append(c)
    finally:
        serve.stop()
    best = min(range(runs), key=lambda i: server[i][0])
    (tl, nl, bl), (ts, ns, bs) = min(local), server[best]
    assert nl == ns == n and bl == bs, (nl, ns, n, bl, bs)
    gib = bs / (1 << 30)
    return {
        "records": n,
        "value_bytes": bs,
        "generate_s": round(gen_s, 2),
        "server_MBps": round(bs / ts / 1e6, 1),
        "read_batches_MBps": round(bl / tl / 1e6, 1),
        "server_records_per_s": round(n / ts),
        "server_cpu_s_per_GiB": round(cpu[best].server / gib, 3),
        "client_cpu_s_per_GiB": round(cpu[best].client / gib, 3),
        "runs_s": {
            "server": [round(r[0], 3) for r in server],
            "read_batches": [round(r[0], 3) for r in local],
        },
        "ratio": round(tl / ts, 3),
    }


def bench_produce(tmp: Path, serve: Serve, total: int, runs: int) -> dict[str, Any]:
    n = total // VALUE
    block = values_block(65_536, seed=11)
    values = [v.as_py() for v in block]
    t_app, t_srv, cpu = [], [], []
    for r in range(runs):  # alternating, each into a fresh root / topic
        app = tmp / f"produce-append-{r}"
        t_app.append(append_root(str(app), block, n))
        shutil.rmtree(app)
        topic = f"{TOPIC}{r}"
        create_topics(serve.bootstrap, {topic: PARTITIONS})
        with Cpu(serve.proc.pid) as c:
            t_srv.append(produce_server(serve.bootstrap, values, n, topic))
        cpu.append(c)
    best = min(range(runs), key=lambda i: t_srv[i])
    mb, gib = n * VALUE / 1e6, n * VALUE / (1 << 30)
    return {
        "records": n,
        "server_MBps": round(mb / t_srv[best], 1),
        "append_MBps": round(mb / min(t_app), 1),
        "server_records_per_s": round(n / t_srv[best]),
        "server_cpu_s_per_GiB": round(cpu[best].server / gib, 3),
        "client_cpu_s_per_GiB": round(cpu[best].client / gib, 3),
        "runs_s": {"server": [round(t, 3) for t in t_srv], "append": [round(t, 3) for t in t_app]},
        "ratio": round(min(t_app) / t_srv[best], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 MiB instead of 1 GiB, fewer latency samples")
    ap.add_argument("--dir", default=None, help="where the roots go (default: a temporary directory)")
    ap.add_argument("--moto", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="consume,produce,latency,s3", help="comma-separated parts to run")
    args = ap.parse_args()
    if args.moto:
        moto_main()
        return
    parts = set(args.only.split(","))
    consume_bytes = (64 << 20) if args.quick else (1 << 30)
    produce_bytes = (64 << 20) if args.quick else (512 << 20)
    lat_count, lat_warmup_s = (200, 1.0) if args.quick else (500, 1.0)
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-serve-", dir=args.dir))
    out: dict[str, Any] = {
        "goals": GOALS,
        "value_bytes": VALUE,
        "partitions": PARTITIONS,
        "load_before": round(os.getloadavg()[0], 2),
    }
    try:
        if "consume" in parts:
            out["consume"] = bench_consume(tmp, consume_bytes, 2)
            out["consume_ratio"] = out["consume"]["ratio"]
        if "produce" in parts or "latency" in parts:
            serve = Serve(str(tmp / "produce-serve"), tmp / "serve-produce.log", metrics_s=0.2)
            try:
                if "produce" in parts:
                    out["produce"] = bench_produce(tmp, serve, produce_bytes, 2)
                    out["produce_ratio"] = out["produce"]["ratio"]
                if "latency" in parts:
                    create_topics(serve.bootstrap, {LATENCY_TOPIC: 1})
                    time.sleep(0.3)
                    m0 = serve.metrics()
                    lat = latency(serve.bootstrap, lat_count, lat_warmup_s)
                    time.sleep(0.3)  # the next metrics line
                    out["latency_local"] = {
                        **latency_figures(lat),
                        **commit_figures(m0, serve.metrics()),
                        "disk_fsync": fsync_probe(tmp),
                    }
            finally:
                serve.stop()
        if "s3" in parts:
            out["latency_s3"] = latency_s3(tmp, lat_count, lat_warmup_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = round(os.getloadavg()[0], 2)
    report(out)
    print(json.dumps(out, sort_keys=True))


def report(out: dict[str, Any]) -> None:
    print(f"{'case':30}{'server':>10}{'pylog API':>11}{'ratio':>7}{'goal':>7}   server / client CPU")
    for name, peer, what in (
        ("consume", "read_batches_MBps", "consume"),
        ("produce", "append_MBps", "produce"),
    ):
        r = out.get(name)
        if r:
            print(
                f"{what + ' 1 KiB records, MB/s':30}{r['server_MBps']:>10}{r[peer]:>11}{r['ratio']:>7}"
                f"{'0.5':>7}   {r['server_cpu_s_per_GiB']} / {r['client_cpu_s_per_GiB']} core-s per GiB"
            )
    for where in ("local", "s3"):
        lat = out.get(f"latency_{where}")
        if lat:
            print(
                f"{f'produce -> consume, {where}':30}p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms "
                f"(goal 5 / 20 ms); producer's ack p50 {lat['ack_p50_ms']} ms, p99 {lat['ack_p99_ms']} ms; "
                f"{lat['produce_requests_per_commit']} Produce requests a commit, "
                f"{lat['commit_ms_mean']} ms each"
            )
            if "disk_fsync" in lat:
                f = lat["disk_fsync"]
                print(f"{'':30}this disk's fsync meanwhile: p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms")
    s3 = out.get("latency_s3")
    if s3:
        kinds = ", ".join(f"{k} {v}" for k, v in s3["s3_requests_by_kind"].items())
        print(
            f"S3: {s3['s3_requests']} requests for {s3['produce_requests']} Produce requests in "
            f"{s3['commits']} commits: {s3['s3_requests_per_produce']} per produce request, "
            f"{s3['s3_requests_per_commit']} per commit ({kinds})"
        )
    print(f"load average (1 min) before / after: {out['load_before']} / {out['load_after']}")


if __name__ == "__main__":
    main()
