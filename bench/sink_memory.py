"""Driver-side memory of a large Spark batch write into ONE partition: flat in the write's size.

    python bench/sink_memory.py [--quick] [--backend local|s3]

``df.write.format("pylog")`` of 1 GiB and then 3 GiB of 1 KiB values (``--quick``: 128 and
384 MiB), 8 tasks, every row into partition 0 of a one-partition topic, on a local disk (or on
moto's S3 server, run in a process of its own).  Each task stages its rows as segments with
their indexes; the driver's ``commit`` links them into the log (local disk: patches each
batch's base offset, renames the files; S3: adopts the uploaded objects, the base offsets a
patch read over them), so the process that runs the commit should not grow with the bytes
written.  Measured:

- the peak RSS of the process Spark runs the data source's ``commit`` in (a wrapper source,
  ``pylog_measured``, records ``ru_maxrss`` after delegating to pylog's commit) and the
  commit's duration;
- the peak RSS of the task processes (``ru_maxrss`` at the end of each task, the largest);
- the write's throughput (MiB of values per second, whole ``df.write``) and, as the peer in
  the same run, Spark's parquet writer on the same DataFrame.

Prints a table and, as its last line, JSON with every figure and ``rss_growth_ratio`` (commit
peak RSS of the large write / of the small one: 1.0 is flat).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from _spark import local_spark
from maintenance_job import BUCKET, start_moto
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

import pylog
from pylog.connector.datasource import DefaultSource

REPORT = "bench.report"  # option: where the wrapper writes its measurements
VALUE_BYTES = 1000


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _Measured(DataSourceArrowWriter):
    def __init__(self, inner: Any, report: str):
        self.inner = inner
        self.report = report

    def write(self, iterator: Any) -> WriterCommitMessage:
        msg = self.inner.write(iterator)
        Path(self.report, f"task-{os.getpid()}-{time.monotonic_ns()}").write_text(str(_rss_mib()))
        return msg

    def commit(self, messages: Any) -> None:
        t0 = time.perf_counter()
        self.inner.commit(messages)
        secs = time.perf_counter() - t0
        Path(self.report, "commit.json").write_text(json.dumps({"rss_mib": _rss_mib(), "secs": secs}))

    def abort(self, messages: Any) -> None:
        self.inner.abort(messages)


class MeasuredSource(DefaultSource):
    @classmethod
    def name(cls) -> str:
        return "pylog_measured"

    def writer(self, schema: Any, overwrite: bool) -> _Measured:
        opts = dict(self.options)
        report = opts.pop(REPORT)
        inner = DefaultSource(opts).writer(schema, overwrite)
        return _Measured(inner, report)


def frame(spark: SparkSession, mib: int) -> Any:
    rows = mib * (1 << 20) // VALUE_BYTES
    return spark.range(0, rows, numPartitions=8).selectExpr(
        "cast(id as string) as key",
        f"cast(concat(lpad(cast(id as string), 20, '0'), repeat('x', {VALUE_BYTES - 20})) as binary)"
        " as value",
        "cast(0 as int) as partition",
    ), rows


def measure(spark: SparkSession, tmp: Path, mib: int, s3: dict[str, str] | None = None) -> dict[str, Any]:
    df, rows = frame(spark, mib)
    report = tmp / "report"
    report.mkdir()
    root = str(tmp / "root") if s3 is None else f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    (
        df.write.format("pylog_measured")
        .option("path", root)
        .options(**{f"storage.{k}": v for k, v in (s3 or {}).items()})
        .option("topic", "big")
        .option("partitions", "1")
        .option(REPORT, str(report))
        .mode("append")
        .save()
    )
    secs = time.perf_counter() - t0
    commit = json.loads((report / "commit.json").read_text())
    tasks = [float(p.read_text()) for p in report.glob("task-*")]
    with pylog.open(root, s3, read_only=True) as r:
        end = r.high_watermark("big", 0)
        segments = len(r.log("big", 0).segments)
    if end != rows:
        raise RuntimeError(f"the log ends at {end}, {rows} rows were written")
    if s3 is None:
        shutil.rmtree(root)
    t0 = time.perf_counter()
    df.drop("partition").write.parquet(str(tmp / "parquet"))
    parquet_secs = time.perf_counter() - t0
    shutil.rmtree(tmp / "parquet")
    shutil.rmtree(report)
    return {
        "mib": mib,
        "rows": rows,
        "commit_peak_rss_mib": round(commit["rss_mib"], 1),
        "commit_s": round(commit["secs"], 3),
        "task_peak_rss_mib": round(max(tasks), 1) if tasks else None,
        "write_mib_s": round(rows * VALUE_BYTES / (1 << 20) / secs, 1),
        "parquet_mib_s": round(rows * VALUE_BYTES / (1 << 20) / parquet_secs, 1),
        "segments": segments,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="128 and 384 MiB instead of 1 and 3 GiB")
    ap.add_argument("--backend", choices=["local", "s3"], default="local")
    args = ap.parse_args()
    server, s3 = start_moto() if args.backend == "s3" else (None, None)
    sizes = (128, 384) if args.quick else (1024, 3072)
    spark = local_spark(
        "pylog-bench-sink-memory", MeasuredSource, spark__sql__execution__arrow__maxRecordsPerBatch="8192"
    )
    results = []
    try:
        warm = Path(tempfile.mkdtemp(prefix="pylog-bench-sink-memory-"))
        try:
            measure(spark, warm, 16, s3)  # JVM and Python workers warmed up: not reported
        finally:
            shutil.rmtree(warm, ignore_errors=True)
        for mib in sizes:
            tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-sink-memory-"))
            try:
                results.append(measure(spark, tmp, mib, s3))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        spark.stop()
        if server is not None:
            server.kill()
    heads = ("commit peak RSS", "commit", "task peak RSS", "pylog", "parquet", "segments")
    print(
        f"{'write':>9} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, (16, 8, 14, 11, 11, 9), strict=True))
    )
    for r in results:
        print(
            f"{r['mib']:>5} MiB {r['commit_peak_rss_mib']:>12.0f} MiB {r['commit_s']:>7.2f}s "
            f"{r['task_peak_rss_mib'] or 0:>10.0f} MiB {r['write_mib_s']:>6.0f} MiB/s "
            f"{r['parquet_mib_s']:>6.0f} MiB/s {r['segments']:>9}"
        )
    out = {
        "bench": "sink_memory",
        "backend": args.backend,
        "quick": args.quick,
        "results": results,
        "rss_growth_ratio": round(results[-1]["commit_peak_rss_mib"] / results[0]["commit_peak_rss_mib"], 3),
        "write_ratio_parquet": round(results[-1]["write_mib_s"] / results[-1]["parquet_mib_s"], 3),
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
