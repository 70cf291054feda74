"""Random process kills: a real writer process on local disk (or an object store: ``url`` and
``options`` of :func:`run_kills`, e.g. moto's S3 server), ``SIGKILL``-ed at random times.

:func:`run_kills` starts writer processes one after another (forked from a server that has
already imported and warmed up pylog, so a restart costs milliseconds, not seconds), lets each
run for a random time and kills it with ``SIGKILL``.  Each writer first recovers the root (a
kill may land in the middle of that too), replays the last planned sink batch as Spark would,
and then appends and publishes until it is killed, reporting every call that *returned* in
``acks.jsonl`` (and every call it is about to make in ``intent.jsonl``/``plan.jsonl``) with one
``write`` each.  At the end the parent recovers the root itself, replays the last plan, and
checks, per partition: every acknowledged record exactly once, nothing not attempted, no
value twice, offsets strictly increasing; and every planned sink batch exactly once.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import random
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pylog
from pylog.storage.codec import records
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root

CHECKPOINT = "killer-query-checkpoint"  # the sink's identity derives from it, as in Spark
TOPIC = "t"
PARTITIONS = 2
CONFIG = {"segment.bytes": "2000", "index.interval.bytes": "200"}


logging.getLogger("pylog.storage").setLevel(logging.ERROR)  # thousands of expected recoveries


def _sink_id() -> str:
    from pylog.connector.sink_options import parse_sink_options

    return parse_sink_options({"path": "-", "checkpointlocation": CHECKPOINT}, streaming=True).sink_id


def _warm_up() -> None:
    """Load the compiled codec kernels and the sink module once, in the fork server."""
    from pylog.connector import sink  # noqa: F401  (imports pyspark's Python side; no JVM)

    records.decode(records.encode([b"x"], key=[b"k"], timestamp=1).tobytes())
    one = np.zeros(1, np.int64)  # the sink task's encoder (stage_task)
    records.encode_partitioned(records.EncodeInput.of([b"x"], [b"k"], 1), one, one)


_warm_up()
SINK = _sink_id()


def _line(fd: int, doc: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(doc) + "\n").encode())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Whole records only.  A kill may cut a record short (it never was acknowledged): at the
    end of the file, or (a large record the kernel was still copying) glued to the front of
    the next process's first record on the same line."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1] if not text.endswith("\n") else text.split("\n")
    out = []
    for line in lines:
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            start = line.rfind('{"kind"')
            if start <= 0:
                raise
            out.append(json.loads(line[start:]))  # the torn prefix was never acknowledged
    return out


def _open(url: str, options: dict[str, str] | None, **kwargs: Any) -> Root:
    return pylog.open(url, options or None, lock_timeout=10, **kwargs)


def _stage(
    root: Root, batch: int, attempt: int, parts: dict[str, list[str]], options: dict[str, str] | None = None
) -> list[pub.StagedFile]:
    """The sink's own executor code (``connector.sink_task.stage_task``), one task per partition."""
    from pylog.connector import sink, sink_task
    from pylog.connector.sink_options import parse_sink_options

    opts = parse_sink_options(
        {
            "path": root.storage.describe(),
            **{f"storage.{k}": v for k, v in (options or {}).items()},
            "topic": TOPIC,
            "batch.size": "1024",
            "checkpointlocation": CHECKPOINT,
        },
        streaming=True,
    )
    files = []
    for task, (p, vals) in enumerate(sorted(parts.items())):
        rows = pa.record_batch(
            {
                "value": pa.array([v.encode() for v in vals]),
                "partition": pa.array([int(p)] * len(vals), pa.int32()),
            }
        )
        # on an object store: staged segments uploaded and adopted by the commit in every other
        # batch, carried in the commit message in the others
        sink_task.STAGE_INLINE_BYTES = 0 if batch % 2 else 4 << 20
        msg = sink.stage_task(iter([rows]), opts, batch, task, attempt)
        files += [pub.StagedFile.from_dict(d) for d in msg.staged]
    return files


def _copy_below(n: int) -> int:
    """Link every staged segment in two commits of three, copy them in the third."""
    return pub.COPY_BELOW_BYTES if n % 3 == 2 else 0


def replay_last_plan(
    root: Root, work: Path, attempt: int, acks: int, options: dict[str, str] | None = None
) -> None:
    """What Spark does after a restart: the last planned batch runs again, and must land once."""
    plans = read_jsonl(work / "plan.jsonl")
    if not plans:
        return
    last = plans[-1]
    committed = root.last_committed_batch(SINK) >= last["batch"]
    files = _stage(root, last["batch"], attempt, last["parts"], options)
    out = root.publish(SINK, last["batch"], files, copy_below=_copy_below(attempt))
    if (out is None) != committed:
        _line(
            acks, {"kind": "error", "error": f"replay of batch {last['batch']}: {out}, committed={committed}"}
        )
        raise SystemExit(3)
    _line(acks, {"kind": "publish", "batch": last["batch"], "replayed": True})


def writer_main(
    work_dir: str,
    gen: int,
    seed: int,
    max_ops: int,
    url: str,
    options: dict[str, str] | None = None,
    acked: Connection | None = None,
) -> None:
    """One writer process: recover, replay, then append and publish until killed.  Once it has
    acknowledged an append and a publish of its own, it says so on ``acked`` (when given)."""
    work = Path(work_dir)
    done: set[str] = set()

    def ack(kind: str, doc: dict[str, Any]) -> None:
        nonlocal acked
        _line(acks, doc)
        done.add(kind)
        if acked is not None and done == {"append", "publish"}:
            acked.send_bytes(b"acked")
            acked.close()
            acked = None

    rng = random.Random(seed * 100_003 + gen)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    acks = os.open(work / "acks.jsonl", flags, 0o644)
    intent = os.open(work / "intent.jsonl", flags, 0o644)
    plan = os.open(work / "plan.jsonl", flags, 0o644)
    root = _open(url, options)
    root.create_topic(TOPIC, PARTITIONS, CONFIG, exist_ok=True)
    replay_last_plan(root, work, gen + 1, acks, options)
    plans = read_jsonl(work / "plan.jsonl")
    batch = plans[-1]["batch"] + 1 if plans else 0
    n = 0
    for _ in range(max_ops):
        r = rng.random()
        if r < 0.5:
            vals = [f"g{gen}-a{n + i}" for i in range(rng.randint(1, 5))]
            n += len(vals)
            parts = [rng.randrange(PARTITIONS) for _ in vals]
            _line(intent, {"values": vals})
            root.append(
                TOPIC,
                pa.table(
                    {"value": pa.array([v.encode() for v in vals]), "partition": pa.array(parts, pa.int32())}
                ),
            )
            ack("append", {"kind": "append", "values": vals})
        elif r < 0.9:
            parts_map: dict[str, list[str]] = {}
            for p in range(PARTITIONS):
                if rng.random() < 0.7:
                    parts_map[str(p)] = [f"g{gen}-b{batch}-{p}-{i}" for i in range(rng.randint(1, 6))]
                    n += len(parts_map[str(p)])
            if not parts_map:
                continue
            files = _stage(root, batch, 0, parts_map, options)
            _line(plan, {"batch": batch, "parts": parts_map})
            # staged segments linked (patched and renamed) or copied, as the sink's commit does
            out = root.publish(SINK, batch, files, copy_below=_copy_below(batch))
            if out is None:
                _line(acks, {"kind": "error", "error": f"first publish of batch {batch} skipped"})
                raise SystemExit(3)
            ack("publish", {"kind": "publish", "batch": batch})
            batch += 1
        elif r < 0.95:
            root.flush()
        else:
            root.close()
            root = _open(url, options)
    root.close()


@dataclass
class KillReport:
    kills: int = 0
    finished: int = 0  # writers that ran out of operations before their kill
    records_checked: int = 0
    acked_appends: int = 0
    batches: int = 0
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    unordered: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def violations(self) -> int:
        return self.lost + self.duplicated + self.phantom + self.unordered + len(self.errors)


ACK_DEADLINE_S = 120.0
"""How long a writer that must acknowledge before its kill may take to (an error after that)."""


def run_kills(
    work: Path,
    kills: int,
    *,
    seed: int = 0,
    min_s: float = 0.03,
    max_s: float = 0.35,
    max_ops: int = 5000,
    url: str | None = None,
    options: dict[str, str] | None = None,
) -> KillReport:
    """Run ``kills`` writer processes, each ``SIGKILL``-ed after a random time; then check.
    The root is ``work/root``, or ``url`` (with fsspec ``options``).

    The random time runs from the writer's start for every other writer (a kill may land in its
    recovery and replay), and for the others from the moment the writer has acknowledged an
    append and a publish of its own: so that acknowledged appends and planned batches are checked
    however slow a loaded machine makes the writers' start (before, every writer could be killed
    before its first acknowledgement: nothing was checked)."""
    url = url or str(work / "root")
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    rng = random.Random(seed)
    report = KillReport()
    for gen in range(kills):
        received, acked = ctx.Pipe(duplex=False) if gen % 2 == 0 else (None, None)
        proc = ctx.Process(
            target=writer_main, args=(str(work), gen, seed, max_ops, url, options, acked), daemon=True
        )
        proc.start()
        if received is not None and acked is not None:
            acked.close()  # (the writer's end: EOF here once it is gone)
            if not wait([received, proc.sentinel], ACK_DEADLINE_S):
                report.errors.append(f"writer {gen} acknowledged no append and publish in {ACK_DEADLINE_S} s")
            received.close()
        proc.join(rng.uniform(min_s, max_s))
        if proc.exitcode is None:
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
            report.kills += 1
        proc.join(30)
        if proc.exitcode not in (0, -signal.SIGKILL):
            report.errors.append(f"writer {gen} exited with {proc.exitcode}")
        elif proc.exitcode == 0:
            report.finished += 1
    check(work, report, url, options)
    report.seconds = time.monotonic() - t0
    return report


def check(
    work: Path, report: KillReport, url: str | None = None, options: dict[str, str] | None = None
) -> None:
    """Recover as the parent, replay the last plan, and check every acknowledgement."""
    url = url or str(work / "root")
    acks_fd = os.open(work / "acks.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with _open(url, options) as root:
            root.create_topic(TOPIC, PARTITIONS, CONFIG, exist_ok=True)
            replay_last_plan(root, work, 10_000, acks_fd, options)
    finally:
        os.close(acks_fd)
    acks = read_jsonl(work / "acks.jsonl")
    report.errors += [a["error"] for a in acks if a["kind"] == "error"]
    acked = {v for a in acks if a["kind"] == "append" for v in a["values"]}
    attempted = {v for a in read_jsonl(work / "intent.jsonl") for v in a["values"]}
    plans = {p["batch"]: p for p in read_jsonl(work / "plan.jsonl")}
    planned = {v for p in plans.values() for vals in p["parts"].values() for v in vals}
    report.acked_appends = len(acked)
    report.batches = len(plans)
    seen: dict[str, int] = {}
    with _open(url, options, read_only=True) as reader:
        for p in range(PARTITIONS):
            t = reader.read_table(TOPIC, [p])
            offsets = t.column("offset").to_pylist()
            if any(b <= a for a, b in itertools.pairwise(offsets)):
                report.unordered += 1
            for v in t.column("value").to_pylist():
                s = v.decode()
                seen[s] = seen.get(s, 0) + 1
    report.duplicated = sum(1 for c in seen.values() if c > 1)
    report.phantom = sum(1 for v in seen if v not in attempted and v not in planned)
    report.lost = sum(1 for v in acked | planned if v not in seen)
    report.records_checked = len(seen)


__all__ = ["KillReport", "check", "run_kills", "writer_main"]
