"""Spark source benchmark: streaming read of pylog vs the Python-source ceiling vs parquet.

    python bench/spark_source.py [--quick]

10 M records (1 M with ``--quick``), 16-byte keys and 100-byte values, in a 4-partition topic
written with pylog.storage.  Each contender is read with ``trigger(availableNow=True)`` into
Spark's ``noop`` sink, in the same SparkSession (local[2]):

- pylog: ``readStream.format("pylog")`` (decode the segments, build Spark's Kafka columns);
- ceiling: a minimal Python streaming source with the same schema, offsets and partitioning
  that yields pre-built Arrow record batches and touches no storage -- what any Python data
  source can reach: Spark's own cost of moving Arrow batches from Python into the JVM;
- parquet: Spark's built-in streaming parquet source over the same rows (same columns,
  written by pyarrow, one file per partition).

Each is run once to warm up (JVM code generation, Python workers) on a slice, then timed
(best of ``--repeat`` runs).  Also reported: a batch read, ``spark.read.format("pylog")`` into
``noop``.  Prints a table and, as its last line, one JSON object with rows/s for each,
``ceiling_ratio`` (pylog ÷ Python-source ceiling) and ``parquet_ratio`` (pylog ÷ parquet).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _spark import local_spark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

import pylog
from pylog.connector.datasource import DefaultSource, spark_schema
from pylog.connector.scan import arrow_schema

PARTITIONS = 4
KEY_BYTES, VALUE_BYTES = 16, 100
CHUNK = 250_000
T0 = 1_700_000_000_000


# ============================================================================ the ceiling


_TEMPLATE: dict[int, pa.RecordBatch] = {}


def _template(rows: int) -> pa.RecordBatch:
    """A record batch of ``rows`` rows in the source's Arrow schema, built once per process."""
    if rows not in _TEMPLATE:
        rng = np.random.default_rng(7)

        def binary(width: int) -> pa.Array:
            data = rng.integers(0, 256, size=rows * width, dtype=np.uint8)
            offsets = np.arange(rows + 1, dtype=np.int32) * width
            return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

        _TEMPLATE[rows] = pa.RecordBatch.from_arrays(
            [
                binary(KEY_BYTES),
                binary(VALUE_BYTES),
                pa.repeat(pa.scalar("bench"), rows),
                pa.repeat(pa.scalar(0, pa.int32()), rows),
                pa.array(np.arange(rows, dtype=np.int64)),
                pa.array((T0 + np.arange(rows, dtype=np.int64)) * 1000, pa.timestamp("us", tz="UTC")),
                pa.repeat(pa.scalar(0, pa.int32()), rows),
            ],
            schema=arrow_schema(False),
        )
    return _TEMPLATE[rows]


class _CeilingReader(DataSourceStreamReader):
    def __init__(self, counts: list[int], batch_rows: int):
        self.counts = counts
        self.batch_rows = batch_rows

    def initialOffset(self) -> dict[str, Any]:
        return {"bench": {str(p): 0 for p in range(len(self.counts))}}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        return {"bench": {str(p): n for p, n in enumerate(self.counts)}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        s, e = start["bench"], end["bench"]
        return [InputPartition((int(s[p]), int(e[p]))) for p in sorted(e, key=int) if int(e[p]) > int(s[p])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        lo, hi = partition.value
        batch = _template(self.batch_rows)
        while lo < hi:
            n = min(self.batch_rows, hi - lo)
            yield batch if n == self.batch_rows else batch.slice(0, n)
            lo += n


class CeilingSource(DataSource):
    """Pre-built Arrow batches: the fastest a Python streaming source can be."""

    @classmethod
    def name(cls) -> str:
        return "bench_arrow_ceiling"

    def schema(self) -> Any:
        return spark_schema(False)

    def streamReader(self, schema: Any) -> _CeilingReader:
        counts = [int(c) for c in self.options["counts"].split(",")]
        return _CeilingReader(counts, int(self.options.get("batchrows", "65536")))


# ============================================================================ data


def make_data(root_dir: Path, parquet_dir: Path, rows: int) -> tuple[list[int], float]:
    """The pylog topic ``bench`` and the same rows as parquet; returns per-partition counts and
    the average number of rows per decoded record set (for the ceiling's batch size)."""
    rng = np.random.default_rng(1)
    per = [rows // PARTITIONS + (1 if p < rows % PARTITIONS else 0) for p in range(PARTITIONS)]
    with pylog.open(root_dir) as root:
        root.create_topic("bench", PARTITIONS)
        for p, n in enumerate(per):
            for lo in range(0, n, CHUNK):
                m = min(CHUNK, n - lo)
                keys = rng.integers(0, 256, size=m * KEY_BYTES, dtype=np.uint8)
                vals = rng.integers(0, 256, size=m * VALUE_BYTES, dtype=np.uint8)
                root.append(
                    "bench",
                    pa.table(
                        {
                            "key": _binary(keys, m, KEY_BYTES),
                            "value": _binary(vals, m, VALUE_BYTES),
                            "timestamp": pa.array(T0 + lo + np.arange(m, dtype=np.int64), pa.timestamp("ms")),
                        }
                    ),
                    partition=p,
                )
    parquet_dir.mkdir(parents=True)
    sets = 0
    with pylog.open(root_dir, read_only=True) as root:
        for p in range(PARTITIONS):
            lg = root.log("bench", p)
            sets += sum(1 for _ in lg.iter_record_sets(0, lg.log_end_offset))
            table = root.read_table("bench", [p], include_headers=False)
            micros = table.schema.set(5, pa.field("timestamp", pa.timestamp("us", tz="UTC")))
            pq.write_table(table.cast(micros), parquet_dir / f"part-{p}.parquet")
    return per, rows / max(sets, 1)


def _binary(data: np.ndarray, n: int, width: int) -> pa.Array:
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# ============================================================================ runs


def stream_rows_per_s(spark: SparkSession, name: str, df: Any, ck: Path, rows: int) -> float:
    shutil.rmtree(ck, ignore_errors=True)
    t0 = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    secs = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(f"{name}: {q.exception()}")
    got = sum(p["numInputRows"] for p in q.recentProgress)
    if got != rows:
        raise RuntimeError(f"{name}: read {got} rows, expected {rows}")
    return rows / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 M records instead of 10 M")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per contender (best is kept)")
    args = ap.parse_args()
    rows = 1_000_000 if args.quick else 10_000_000
    repeat = args.repeat or 3
    tmp = Path(tempfile.mkdtemp(prefix="pylog-bench-source-"))
    spark = local_spark(
        "pylog-bench-source",
        DefaultSource,
        CeilingSource,
        spark__sql__shuffle__partitions="2",
        spark__driver__memory="4g",
    )
    try:
        t0 = time.perf_counter()
        counts, per_set = make_data(tmp / "root", tmp / "parquet", rows)
        print(
            f"wrote {rows:,} records in {time.perf_counter() - t0:.1f} s ({per_set:,.0f} rows per record set)"
        )
        batch_rows = int(per_set)
        contenders = {
            "pylog": lambda: (
                spark.readStream.format("pylog")
                .option("path", str(tmp / "root"))
                .option("subscribe", "bench")
                .option("startingOffsets", "earliest")
                .load()
            ),
            "ceiling": lambda: (
                spark.readStream.format("bench_arrow_ceiling")
                .option("counts", ",".join(map(str, counts)))
                .option("batchRows", str(batch_rows))
                .load()
            ),
            "parquet": lambda: spark.readStream.schema(spark_schema(False)).parquet(str(tmp / "parquet")),
        }
        results: dict[str, float] = {}
        for name, make in contenders.items():  # warm-up: JVM code generation, Python workers
            stream_rows_per_s(spark, name, make(), tmp / f"ck-{name}", rows)
        for _ in range(repeat):
            for name, make in contenders.items():
                rate = stream_rows_per_s(spark, name, make(), tmp / f"ck-{name}", rows)
                results[name] = max(results.get(name, 0.0), rate)
        batch = 0.0
        for _ in range(repeat):
            t = time.perf_counter()
            spark.read.format("pylog").option("path", str(tmp / "root")).option(
                "subscribe", "bench"
            ).load().write.format("noop").mode("overwrite").save()
            batch = max(batch, rows / (time.perf_counter() - t))
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mb = (KEY_BYTES + VALUE_BYTES) / 1e6
    print(f"\n{'case':42} {'rows/s':>14} {'MB/s (key+value)':>18}")
    for label, rate in (
        ("pylog streaming source (availableNow)", results["pylog"]),
        ("Python source ceiling (pre-built Arrow)", results["ceiling"]),
        ("Spark streaming parquet source", results["parquet"]),
        ("pylog batch read (spark.read)", batch),
    ):
        print(f"{label:42} {rate:14,.0f} {rate * mb:18.1f}")
    out = {
        "records": rows,
        "partitions": PARTITIONS,
        "rows_per_s": {**{k: round(v) for k, v in results.items()}, "pylog_batch": round(batch)},
        "ceiling_ratio": round(results["pylog"] / results["ceiling"], 3),
        "parquet_ratio": round(results["pylog"] / results["parquet"], 3),
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
