"""First micro-batch benchmark: what a new process pays before pylog's first batch is done.

    python bench/first_batch.py [--quick] [--rounds N] [--cold]

Every figure comes from a *new* process, as a user's first query or first CLI command runs:

- write: a streaming query reads the same parquet input (``maxFilesPerTrigger=1``, 3 files)
  and writes it with ``writeStream.format("pylog")`` (a 4-partition topic, the sink's
  defaults), with Spark's ``writeStream.format("parquet")``, or with a Python sink that drops
  its input (the floor of any Python sink: the Python processes Spark starts for it);
- read: ``readStream.format("pylog")`` of a 4-partition topic (``maxOffsetsPerTrigger`` a
  third of it) or ``readStream.parquet`` of the same rows (3 files, ``maxFilesPerTrigger=1``),
  both into Spark's ``noop`` sink;
- cli: ``pylog consume ROOT readings --max-messages 2`` and ``pylog describe ROOT`` as
  subprocesses, on a root shaped like ``make demo``'s (a compacted topic ``readings``, 4
  partitions, 32 KiB segments).

Each Spark run is a fresh ``python`` process with its own local[2] SparkSession (its start is
not counted); the figure is micro-batch 0's ``triggerExecution`` from the query's progress,
beside the median of the later batches.  pylog and its peer run alternately, ``--rounds``
times (5; 3 with ``--quick``), and the medians count: the machine may be shared.

Kernels are cached as after an install: by default the bench uses the installation's numba
cache (``make`` warms it, see the Makefile); with ``--cold`` it points ``NUMBA_CACHE_DIR`` at
an empty directory and runs the install's warm-up step there first (``python -m
pylog.tools.warm_kernels``, timed), so the figures are those of a fresh installation.

Prints a table and, as its last line, one JSON object with every run and the ratios
``write_ratio``, ``read_ratio`` (pylog's first batch ÷ the parquet one's),
``write_ceiling_ratio`` (÷ the dropping Python sink's) and ``cli_ratio`` (``consume`` ÷
``describe`` wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

HERE = Path(__file__).resolve().parent
FILES = 3
PARTITIONS = 4
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)

# ============================================================================ inputs


def make_inputs(data: Path, rows: int) -> None:
    """The write input (key, value strings in ``FILES`` parquet files), the same rows in a
    4-partition pylog topic ``bench``, those rows as ``FILES`` parquet files with Spark's Kafka
    columns, and a demo-like root for the CLI."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import pylog

    ids = np.arange(rows)
    keys = pa.array([f"{i % 1000003:k>16}" for i in ids.tolist()])
    values = pa.array([f"{i:020d}" + "x" * 80 for i in ids.tolist()])
    table = pa.table({"key": keys, "value": values})
    (data / "write-input").mkdir(parents=True)
    per = -(-rows // FILES)
    for f in range(FILES):
        pq.write_table(table.slice(f * per, per), data / "write-input" / f"part-{f}.parquet")

    with pylog.open(data / "root") as root:
        root.create_topic("bench", partitions=PARTITIONS)
        root.append("bench", table.cast(pa.schema([("key", pa.binary()), ("value", pa.binary())])))
        kafka = root.read_table("bench", include_headers=False)
    (data / "read-input").mkdir()
    for f in range(FILES):
        pq.write_table(kafka.slice(f * per, per), data / "read-input" / f"part-{f}.parquet")

    with pylog.open(data / "demo-root") as root:  # make demo's topic: sensors' readings, compacted
        config = {"cleanup.policy": "compact", "segment.bytes": 32 * 1024}
        root.create_topic("readings", partitions=PARTITIONS, config=config)
        for chunk in range(20):
            seq = range(chunk * 1000, (chunk + 1) * 1000)
            root.append(
                "readings",
                pa.table(
                    {
                        "key": [f"sensor-{s % 200:04d}".encode() for s in seq],
                        "value": [f'{{"seq": {s}, "celsius": {15 + s % 17}.5}}'.encode() for s in seq],
                    }
                ),
            )


# ============================================================================ one Spark run (child)


def _discard_sink() -> Any:
    """A Python streaming sink that drops its input: what any Python sink pays (Spark's Python
    workers) before doing anything of its own."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class Discard(DataSourceStreamArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class DiscardSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_discard"

        def streamWriter(self, schema: Any, overwrite: bool) -> Discard:
            return Discard()

    return DiscardSink


def spark_run(case: str, fmt: str, data: Path, out: Path, rows: int) -> dict[str, Any]:
    """One query in this (new) process; batch 0's figures and the later batches' median."""
    sys.path.insert(0, str(HERE))
    from _spark import local_spark

    t_session = time.perf_counter()
    spark = local_spark("pylog-bench-first-batch", _discard_sink(), spark__sql__shuffle__partitions="2")
    session_s = time.perf_counter() - t_session
    try:
        if case == "write":
            df = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
            df = df.parquet(str(data / "write-input"))
            w = df.writeStream.format(fmt).option("path", str(out / fmt))  # or parquet, bench_discard
            if fmt == "pylog":
                w = w.option("topic", "bench").option("partitions", PARTITIONS)
        else:
            if fmt == "pylog":
                df = spark.readStream.format("pylog").option("path", str(data / "root"))
                df = df.option("subscribe", "bench").option("startingOffsets", "earliest")
                df = df.option("maxOffsetsPerTrigger", -(-rows // FILES)).load()
            else:
                df = spark.readStream.schema(KAFKA_SCHEMA).option("maxFilesPerTrigger", 1)
                df = df.parquet(str(data / "read-input"))
            w = df.writeStream.format("noop")
        w = w.option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True)
        started = time.time()
        q = w.start()
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"{case} {fmt}: {q.exception()}")
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    finally:
        spark.stop()
    ms = [p["durationMs"]["triggerExecution"] for p in progress]
    first = progress[0]
    first_start = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).timestamp()
    return {
        "first_ms": ms[0],
        "first_add_batch_ms": first["durationMs"].get("addBatch", 0),
        "start_to_first_end_ms": round((first_start - started) * 1000 + ms[0]),
        "later_ms": statistics.median(ms[1:]) if len(ms) > 1 else None,
        "batches": len(ms),
        "rows": sum(p["numInputRows"] for p in progress),
        "session_s": round(session_s, 2),
    }


def fresh_spark_run(case: str, fmt: str, data: Path, rows: int, env: dict[str, str]) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"run-{case}-{fmt}-", dir=data))
    try:
        got = subprocess.run(
            [sys.executable, __file__, "--child", case, fmt, str(data), str(out), str(rows)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode != 0:
            raise RuntimeError(f"{case} {fmt} failed:\n{got.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ============================================================================ the CLI


def cli_run(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pylog", *args], env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


# ============================================================================ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30,000 rows and 3 rounds instead of 300,000 and 5")
    ap.add_argument("--rounds", type=int, help="alternate runs of each contender; medians are reported")
    ap.add_argument("--cold", action="store_true", help="an empty numba cache, warmed by the install step")
    ap.add_argument("--cases", default="write,read,cli", help="comma-separated: write, read, cli")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        case, fmt, data, out, rows = args.child
        print(json.dumps(spark_run(case, fmt, Path(data), Path(out), int(rows))))
        return
    rows = 30_000 if args.quick else 300_000
    rounds = args.rounds or (3 if args.quick else 5)
    cases = args.cases.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-first-"))
    env = dict(os.environ)
    report: dict[str, Any] = {"rows": rows, "rounds": rounds, "cold": args.cold}
    report["load_before"] = os.getloadavg()[0]
    try:
        make_inputs(tmp / "data", rows)
        if args.cold:
            env["NUMBA_CACHE_DIR"] = str(tmp / "numba-cache")
            t0 = time.perf_counter()
            warm = subprocess.run([sys.executable, "-m", "pylog.tools.warm_kernels"], env=env, check=False)
            report["install_warm_s"] = round(time.perf_counter() - t0, 2) if warm.returncode == 0 else None
            print(f"install warm-up step: {report['install_warm_s']} s", flush=True)
        runs: dict[str, list[Any]] = {}
        for r in range(rounds):  # alternately, so that a busy spell of the machine hits both
            for case in ("write", "read"):
                if case not in cases:
                    continue
                fmts = ("pylog", "parquet", "bench_discard") if case == "write" else ("pylog", "parquet")
                for fmt in fmts if r % 2 == 0 else reversed(fmts):
                    got = fresh_spark_run(case, fmt, tmp / "data", rows, env)
                    runs.setdefault(f"{case}/{fmt}", []).append(got)
                    print(
                        f"round {r + 1}: {case:5} {fmt:7} batch 0 {got['first_ms'] / 1000:5.2f} s, "
                        f"later {got['later_ms'] / 1000 if got['later_ms'] else 0:5.2f} s "
                        f"({got['batches']} batches, {got['rows']:,} rows; session {got['session_s']} s)",
                        flush=True,
                    )
            if "cli" in cases:
                demo = str(tmp / "data" / "demo-root")
                commands = {
                    "describe": ["describe", demo],
                    "consume": ["consume", demo, "readings", "--max-messages", "2"],
                }
                for name, argv in commands.items() if r % 2 == 0 else reversed(commands.items()):
                    runs.setdefault(f"cli/{name}", []).append(cli_run(argv, env))
                runs.setdefault("cli/consume-nojit", []).append(
                    cli_run(commands["consume"], {**env, "PYLOG_NO_JIT": "1"})
                )
                print(
                    "round {}: cli   describe {:.2f} s, consume {:.2f} s (PYLOG_NO_JIT=1: {:.2f} s)".format(
                        r + 1, *(runs[f"cli/{n}"][-1] for n in ("describe", "consume", "consume-nojit"))
                    ),
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["load_after"] = os.getloadavg()[0]
    report["runs"] = runs

    def med(key: str, field: str | None = "first_ms") -> float:
        return statistics.median(x[field] if field else x for x in runs[key])

    print(f"\n{'case':28} {'pylog':>9} {'peer':>9} {'ratio':>6}   (medians of {rounds} fresh processes)")
    for case in ("write", "read"):
        if case in cases:
            p, q = med(f"{case}/pylog"), med(f"{case}/parquet")
            report[f"{case}_first_ms"] = {"pylog": p, "parquet": q}
            report[f"{case}_later_ms"] = {
                "pylog": med(f"{case}/pylog", "later_ms"),
                "parquet": med(f"{case}/parquet", "later_ms"),
            }
            report[f"{case}_ratio"] = round(p / q, 2)
            print(f"{case + ': micro-batch 0 (s)':28} {p / 1000:9.2f} {q / 1000:9.2f} {p / q:6.2f}")
            lp, lq = report[f"{case}_later_ms"]["pylog"], report[f"{case}_later_ms"]["parquet"]
            print(f"{case + ': later batches (s)':28} {lp / 1000:9.2f} {lq / 1000:9.2f} {lp / lq:6.2f}")
            if case == "write":
                c = med("write/bench_discard")
                report["write_first_ms"]["python_sink_ceiling"] = c
                report["write_ceiling_ratio"] = round(p / c, 2)
                print(
                    f"{'write: batch 0, Python sink':28} {p / 1000:9.2f} {c / 1000:9.2f} {p / c:6.2f}"
                    "   (peer: a Python sink that drops its input)"
                )
    if "cli" in cases:
        c, d, n = (med(f"cli/{x}", None) for x in ("consume", "describe", "consume-nojit"))
        report["cli_s"] = {"consume": c, "describe": d, "consume_nojit": n}
        report["cli_ratio"] = round(c / d, 2)
        print(
            f"{'cli: consume vs describe (s)':28} {c:9.2f} {d:9.2f} {c / d:6.2f}"
            f"   (PYLOG_NO_JIT=1 consume {n:.2f})"
        )
    print(f"load average {report['load_before']:.2f} before, {report['load_after']:.2f} after")
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
