"""Kafka interop: read a log directory a Kafka broker wrote, with pylog and with Spark.

The segments come from the broker-written fixtures in ``../shared/fixtures/kafka/`` (next to
the repository): three partitions are copied into ``DIR/kafka-log-dir`` as if copied from a
broker's ``log.dirs``, mixing message formats v0, v1 and v2 and the gzip and snappy codecs.
Nothing in that directory was written by pylog, and pylog needs nothing more than the
``<topic>-<partition>/<offset>.log`` files:

1. ``pylog.open(dir).read_table(topic)``: the records, with Spark's Kafka columns;
2. ``pylog dump``: the segment as Kafka's ``kafka-dump-log.sh`` prints it;
3. ``spark.read.format("pylog")``: the same records as a DataFrame, with the schema of Spark's
   Kafka source;
4. pylog appends to the copied log (a RecordBatch v2 after the broker's batches) and
   ``pylog verify`` checks every batch and index.

    .venv/bin/python examples/kafka_interop.py [DIR]     # default: demo-data/kafka-interop
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from _common import demo_dir, local_spark

import pylog

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kafka"
PARTITIONS = {  # fixture -> the partition directory it holds
    "kafka-go/v1-v1c-v2-v2c-v2b-v2b-v2b-v2bc-v1b-v1bc": "test-88-0",  # magic 1 and 2, gzip
    "kafka-go/v2c-v2-v2c": "test-natty-0",  # magic 2, gzip
    "kafka-rust/fetch1.mytopic.1p.snappy.kafka.0821": "my-topic-0",  # magic 0, snappy (Kafka 0.8.2)
}


def copy_log_dir(target: Path) -> None:
    """Copy the fixtures' segment files (only the ``.log`` files: no index, no checkpoint)."""
    if not FIXTURES.is_dir():
        sys.exit(f"the Kafka fixtures are not at {FIXTURES}; this example reads them (see README)")
    for fixture, part in PARTITIONS.items():
        (target / part).mkdir(parents=True)
        for seg in sorted((FIXTURES / fixture / part).glob("*.log")):
            shutil.copyfile(seg, target / part / seg.name)  # copyfile: not the read-only mode


def pylog_cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pylog", *args], capture_output=True, text=True, check=True)
    return out.stdout


def main() -> None:
    log_dir = demo_dir("kafka-interop", __doc__) / "kafka-log-dir"
    copy_log_dir(log_dir)
    print(f"copied a broker's partitions into {log_dir}: {sorted(p.name for p in log_dir.iterdir())}")

    print("\n1. pylog.open(dir, read_only=True): topics and partitions come from the directory names")
    with pylog.open(log_dir, read_only=True) as root:
        for topic in root.topics():
            table = root.read_table(topic)
            first = table.slice(0, 1).to_pylist()[0]
            key = first["key"].decode() if first["key"] else None
            value = first["value"][:40].decode(errors="replace")
            print(
                f"  {topic}: {table.num_rows} records, offsets {table['offset'][0]}..{table['offset'][-1]}; "
                f"first: key={key!r} value={value!r}..."
            )

    segment = log_dir / "test-88-0" / "00000000000000000000.log"
    print(f"\n2. pylog dump --files {segment} --print-data-log   (kafka-dump-log.sh's output)")
    lines = pylog_cli("dump", "--files", str(segment), "--print-data-log").splitlines()
    for line in [*lines[:3], "...", *[ln for ln in lines if "magic: 2" in ln][:1]]:
        print("  " + (line if len(line) < 160 else line[:157] + "..."))

    print("\n3. spark.read.format('pylog'): the Kafka source's schema over the same files")
    spark = local_spark("pylog-kafka-interop")
    df = spark.read.format("pylog").option("path", str(log_dir)).option("subscribePattern", ".*").load()
    df.printSchema()
    df.groupBy("topic").count().orderBy("topic").show()
    df.where("topic = 'test-88'").selectExpr(
        "offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "timestamp"
    ).orderBy("offset").show(4, truncate=False)
    spark.stop()

    print("4. pylog appends to the broker's log, then verifies every file")
    with pylog.open(log_dir) as root:  # the writer: recovers the logs as a broker does at start
        record = pa.table({"key": [b"zeta"], "value": [b'{"count":1,"from":"pylog"}']})
        info = root.append("test-natty", record)
        print(f"  appended at offset {info[0].first_offset} of test-natty-0")
    print("  " + pylog_cli("verify", str(log_dir)).rstrip())


if __name__ == "__main__":
    main()
