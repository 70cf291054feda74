"""Kafka clients and Spark on one root: ``pylog serve`` between them.

1. ``pylog serve`` starts over a new root on a free port of 127.0.0.1 (the first line it prints
   says where it listens): a one-node Kafka cluster whose partitions are the root's files.
2. confluent-kafka's AdminClient creates the topic ``orders`` (3 partitions).
3. A confluent-kafka Producer (idempotent, acks=all, the Java client's murmur2 partitioner)
   sends 1,200 JSON orders keyed by customer.
4. A confluent-kafka consumer group reads them and commits its offsets, which the server keeps
   in the root (``pylog describe`` lists the group with its lag).
5. ``spark.readStream.format("pylog")`` reads the same topic from the files, while the server
   runs, in an availableNow run (``foreachBatch`` sums the orders per customer); 300 more orders
   are produced, and the query, restarted on its checkpoint, reads only those.
6. SIGTERM stops the server: it answers what it read, closes the root cleanly and exits with 0.

    .venv/bin/python examples/kafka_clients.py [DIR]      # default: demo-data/kafka_clients

Needs the ``serve`` extra (``pip install 'pylog[serve]'``: kio) and confluent-kafka.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import demo_dir, local_spark, pylog_command, shown

TOPIC = "orders"
GROUP = "order-audit"
ITEMS = ("book", "lamp", "chair", "pen", "mug")


def order(i: int) -> tuple[str, dict[str, Any]]:
    return f"customer-{i % 7}", {"order": i, "amount": 10 + i % 90, "item": ITEMS[i % len(ITEMS)]}


class Server:
    """``python -m pylog serve ROOT --port 0``: its address from the first line it prints, its
    log (stderr, one JSON object a line) kept, stopped with SIGTERM."""

    def __init__(self, root: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pylog", "serve", str(root), "--port", "0",
             # one consumer: its group need not wait for more members (Kafka's default is 3000 ms)
             "--group-initial-rebalance-delay-ms", "0", "--log-format", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.log: list[str] = []
        threading.Thread(target=self._keep, args=(self.proc.stderr,), daemon=True).start()
        # "pylog serve: listening on HOST:PORT for ROOT"
        self.first_line = self.proc.stdout.readline().strip()
        threading.Thread(target=self._keep, args=(self.proc.stdout,), daemon=True).start()
        if "listening on " not in self.first_line:
            self.proc.wait(60)
            sys.exit(f"pylog serve did not start:\n{''.join(self.log[-20:])}")
        self.bootstrap = self.first_line.split("listening on ")[1].split()[0]

    def _keep(self, stream: Any) -> None:
        for line in stream:
            self.log.append(line)

    def last_message(self) -> str:
        for line in reversed(self.log):
            try:
                return str(json.loads(line)["message"])
            except (ValueError, KeyError):
                continue
        return ""

    def stop(self) -> int:
        """SIGTERM, and the exit status (0 after a clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])[TOPIC].result(30)
    print(f"created topic {TOPIC!r} with AdminClient.create_topics: 3 partitions")


def produce(bootstrap: str, first: int, n: int) -> Counter[int]:
    """Send orders ``first`` .. ``first + n - 1``; returns the acknowledged ones per partition."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,  # acks=all; retries are recognised, never appended twice
            "partitioner": "murmur2_random",  # the Java client's (and the pylog sink's) key mapping
            "linger.ms": 5,
            "compression.type": "zstd",  # batches are stored as the producer compressed them
        }
    )
    acked: Counter[int] = Counter()
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.partition()] += 1
        else:
            failed.append(err)

    for i in range(first, first + n):
        key, value = order(i)
        producer.produce(TOPIC, key=key, value=json.dumps(value), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0 and not failed, failed
    print(f"produced {n:,} orders, acknowledged per partition {dict(sorted(acked.items()))}")
    return acked


def consume_as_group(bootstrap: str, expected: int) -> dict[int, int]:
    """Read the topic in a consumer group and commit; returns the committed offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    seen, deadline = 0, time.monotonic() + 60
    while seen < expected and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=1.0):
            assert msg.error() is None, msg.error()
            seen += 1
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(3)], timeout=10)
    consumer.close()
    offsets = {tp.partition: tp.offset for tp in committed}
    print(f"consumer group {GROUP!r} read {seen:,} orders and committed {offsets}")
    assert seen == expected, (seen, expected)
    return offsets


def spark_run(
    spark: Any, root: Path, checkpoint: Path, totals: dict[str, list[int]], orders: set[int]
) -> int:
    """One availableNow run of the query that reads ``orders`` from the root's files; returns
    the records it read."""
    from pyspark.sql import functions as F

    read = {"rows": 0}

    def each_batch(df: Any, batch_id: int) -> None:
        rows = df.groupBy("customer").agg(F.count("*").alias("n"), F.sum("amount").alias("amount")).collect()
        for r in rows:
            n, amount = totals.setdefault(r["customer"], [0, 0])
            totals[r["customer"]] = [n + r["n"], amount + r["amount"]]
        orders.update(r["order"] for r in df.select("order").collect())
        batch_rows = sum(r["n"] for r in rows)
        read["rows"] += batch_rows
        print(f"  batch {batch_id}: {batch_rows:,} orders")

    query = (
        spark.readStream.format("pylog")
        .option("path", str(root))  # the files the server writes: no bootstrap servers, no lock
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "CAST(key AS STRING) AS customer",
            "from_json(CAST(value AS STRING), 'order INT, amount INT, item STRING') AS o",
        )
        .select("customer", "o.order", "o.amount")
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return read["rows"]


def describe_group(root: Path) -> None:
    """The lines of ``pylog describe`` about the consumer group."""
    out = subprocess.run(
        [sys.executable, "-m", "pylog", "describe", str(root)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if GROUP in line)
    print(f"$ {pylog_command()} describe {shown(root)}   (the group's lines)")
    for line in out[start : start + 4]:
        print(f"  {line}")


def main() -> None:
    base = demo_dir("kafka_clients", __doc__)
    try:
        import confluent_kafka  # noqa: F401
        import kio  # noqa: F401
    except ImportError as e:
        sys.exit(f"this example needs kio (pip install 'pylog[serve]') and confluent-kafka: {e}")
    root, checkpoints = base / "pylog-root", base / "spark-checkpoints"

    server = Server(root)
    try:
        print(server.first_line)
        create_topic(server.bootstrap)
        produce(server.bootstrap, 0, 1200)
        consume_as_group(server.bootstrap, 1200)
        describe_group(root)

        print("\nspark.readStream.format('pylog') on the same root, while the server runs:")
        spark = local_spark("pylog-kafka-clients")
        totals: dict[str, list[int]] = {}
        orders: set[int] = set()
        first = spark_run(spark, root, checkpoints / "orders", totals, orders)
        print(f"  run 1 read {first:,} orders")
        produce(server.bootstrap, 1200, 300)
        second = spark_run(spark, root, checkpoints / "orders", totals, orders)
        print(f"  run 2, restarted on its checkpoint, read {second:,} orders: only the new ones")
        spark.stop()
    finally:
        code = server.stop()
    print(f"\nSIGTERM: pylog serve exited with status {code}; its last log line: {server.last_message()!r}")

    print("\norders per customer (Spark):")
    for customer, (n, amount) in sorted(totals.items()):
        print(f"  {customer}: {n:>4} orders, amount {amount:>6,}")
    expected = Counter[str]()
    amounts = Counter[str]()
    for i in range(1500):
        key, value = order(i)
        expected[key] += 1
        amounts[key] += value["amount"]
    assert code == 0, f"pylog serve exited with {code}:\n{''.join(server.log[-20:])}"
    assert (first, second) == (1200, 300), (first, second)
    assert orders == set(range(1500)), "an order is missing"
    assert {c: tuple(v) for c, v in totals.items()} == {c: (expected[c], amounts[c]) for c in expected}
    print("OK: every order produced through the server read once by Spark, sums as sent")
    print(f"\nthe root is a Kafka log directory; inspect it with: {pylog_command()} describe {shown(root)}")


if __name__ == "__main__":
    main()
