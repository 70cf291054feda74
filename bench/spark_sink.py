"""Spark sink benchmark: streaming write into pylog vs the Python-sink ceiling vs parquet.

    python bench/spark_sink.py [--quick]

Rows (16-byte keys, 100-byte values) are pre-written as parquet; each contender streams them
with ``trigger(availableNow=True)`` and ``maxFilesPerTrigger`` micro-batches into:

- pylog: ``writeStream.format("pylog")`` into a 4-partition topic (exactly-once publish,
  staging, fsync; embedded maintenance off, as there is nothing to compact);
- ceiling: a minimal ``DataSourceStreamArrowWriter`` that discards its input (what any Python
  sink can reach: Spark's own cost of handing Arrow batches to Python);
- parquet: Spark's built-in parquet file sink.

Each contender first streams a small warm-up input (JIT, Python workers, imports), so that the
measured runs compare steady states rather than whoever ran first paying the JVM's warm-up.
The contenders then run in ``--rounds`` interleaved rounds (3) and each one's median counts:
on a shared 2-core VM single runs of the same contender vary by up to 1.4x.

Prints a table and, as its last line, JSON with rows/s for each and ``ceiling_ratio``
(pylog ÷ discarding Python sink) and ``parquet_ratio`` (pylog ÷ parquet sink).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from _spark import local_spark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage


class _Discard(DataSourceStreamArrowWriter):
    def write(self, iterator: Any) -> WriterCommitMessage:
        n = 0
        for batch in iterator:
            n += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages: Any, batchId: int) -> None:
        pass

    def abort(self, messages: Any, batchId: int) -> None:
        pass


class DiscardSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_discard"

    def streamWriter(self, schema: Any, overwrite: bool) -> _Discard:
        return _Discard()


def make_input(spark: SparkSession, path: Path, rows: int, files: int) -> None:
    df = spark.range(rows).selectExpr(
        "lpad(cast(id % 1000003 as string), 16, 'k') as key",
        "concat(lpad(cast(id as string), 20, '0'), repeat('x', 80)) as value",
    )
    df.repartition(files).write.parquet(str(path))


def run(spark: SparkSession, src: Path, fmt: str, out: Path, rows: int, files_per_trigger: int) -> float:
    df = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(src))
    )
    w = df.writeStream.format(fmt).option("checkpointLocation", str(out / "ck")).trigger(availableNow=True)
    if fmt == "pylog":
        w = (
            w.option("path", str(out / "root"))
            .option("topic", "bench")
            .option("partitions", "4")
            .option("maintenance", "false")
        )
    elif fmt == "parquet":
        w = w.option("path", str(out / "parquet"))
    t0 = time.perf_counter()
    q = w.start()
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{fmt} query failed: {q.exception()}")
    secs = time.perf_counter() - t0
    if fmt == "pylog":
        import pylog

        with pylog.open(out / "root", read_only=True) as r:
            n = sum(r.log("bench", p).log_end_offset for p in range(4))
        assert n == rows, (n, rows)
    return rows / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 M rows instead of 10 M")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = ap.parse_args()
    rows = 1_000_000 if args.quick else 10_000_000
    files = 8 if args.quick else 40
    spark = local_spark(
        "pylog-bench-sink",
        DiscardSink,
        spark__sql__shuffle__partitions="2",
        spark__sql__execution__arrow__maxRecordsPerBatch="65536",
        spark__driver__memory="4g",
    )
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-sink-"))
    try:
        src = tmp / "src"
        make_input(spark, src, rows, files)
        warm = tmp / "warm"
        make_input(spark, warm, rows // 20, 2)
        results: dict[str, float] = {}
        contenders = (("ceiling", "bench_discard"), ("parquet", "parquet"), ("pylog", "pylog"))
        for name, fmt in contenders:  # the JVM's and the Python workers' warm-up is nobody's cost
            run(spark, warm, fmt, tmp / f"warm-{name}", rows // 20, 1)
        runs: dict[str, list[float]] = {name: [] for name, _ in contenders}
        for r in range(args.rounds):  # interleaved, so that a slow spell of the machine hits all
            for name, fmt in contenders:
                runs[name].append(run(spark, src, fmt, tmp / f"{name}-{r}", rows, max(1, files // 4)))
                shutil.rmtree(tmp / f"{name}-{r}", ignore_errors=True)
                print(f"round {r + 1}: {name:8} {runs[name][-1] / 1e6:6.2f} M rows/s", flush=True)
        for name, _ in contenders:
            results[name] = statistics.median(runs[name])
            print(f"{name:8} {results[name] / 1e6:6.2f} M rows/s (median of {args.rounds})", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "rows": rows,
        "rounds": args.rounds,
        "runs_rows_per_s": runs,
        "rows_per_s": results,
        "ceiling_ratio": results["pylog"] / results["ceiling"],
        "parquet_ratio": results["pylog"] / results["parquet"],
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
