"""Analytics without Spark: a pylog topic read as Arrow and queried with DuckDB, on a local
directory (default ./demo-data/duckdb_analytics).

Appends a day of shop orders (keyed by customer, so Kafka's murmur2 partitioner keeps each
customer in one partition; a ``source`` header on each) to a topic with 4 partitions, then, with
no Spark and no broker:

1. reads the topic into an Arrow table (``root.read_table``) and asks DuckDB for the records
   per partition, the best customers (JSON values decoded in SQL) and the orders per header;
2. reads one hour by time (``start_timestamp``/``end_timestamp``: Spark's ``startingTimestamp``
   and ``endingTimestamp``) and counts its orders per 10 minutes;
3. streams the whole topic into DuckDB as record batches (``root.read_batches`` through a
   ``pyarrow.RecordBatchReader``), never holding it all in memory;

and checks every answer against plain Python.

    .venv/bin/python examples/duckdb_analytics.py [DIR]

The root is ``DIR/pylog-root``; a re-run starts over.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator

import duckdb
import numpy as np
import pyarrow as pa
from _common import demo_dir

import pylog
from pylog.storage.root.manager import TABLE_SCHEMA

TOPIC = "orders"
N = 50_000
CUSTOMERS = 200
DAY = 1_700_006_400_000  # 2023-11-15 00:00 UTC, in milliseconds
HOUR = 3_600_000
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def orders() -> tuple[pa.Table, list[dict[str, int]]]:
    """A day of orders, one every 1.728 s, as a table to append and as Python dicts to check with."""
    rng = np.random.default_rng(8)
    customer = rng.integers(0, CUSTOMERS, N)
    amount = rng.integers(100, 20_000, N)  # cents
    source = rng.choice([b"web", b"app", b"store"], N, p=[0.5, 0.4, 0.1])
    ts = DAY + np.arange(N, dtype=np.int64) * (24 * HOUR // N)
    rows = [
        {"order": i, "customer": int(c), "amount": int(a), "ts": int(t), "source": s.decode()}
        for i, (c, a, t, s) in enumerate(zip(customer, amount, ts, source, strict=True))
    ]
    table = pa.table(
        {
            "key": [b"customer-%03d" % r["customer"] for r in rows],
            "value": [json.dumps({"order": r["order"], "amount": r["amount"]}).encode() for r in rows],
            "timestamp": pa.array(ts, pa.timestamp("ms")),
            "headers": pa.array([[{"key": "source", "value": bytes(s)}] for s in source], HEADERS),
        }
    )
    return table, rows


def main() -> None:
    root_dir = demo_dir("duckdb_analytics", __doc__) / "pylog-root"
    table, rows = orders()
    with pylog.open(root_dir) as root:
        root.create_topic(TOPIC, partitions=4, config={"compression.type": "zstd"})
        for lo in range(0, N, 5_000):  # as a producer would, a batch at a time
            root.append(TOPIC, table.slice(lo, 5_000))
    print(f"appended {N:,} orders from {CUSTOMERS} customers to {TOPIC!r} (4 partitions)")

    root = pylog.open(root_dir, read_only=True)  # a reader: no lock, any number of them
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    # 1. the whole topic as one Arrow table, queried in place (no copy into DuckDB)
    topic = root.read_table(TOPIC)
    con.register("orders", topic)
    per_partition = con.execute(
        'SELECT partition, count(*) AS records, min("offset") AS first, max("offset") AS last '
        "FROM orders GROUP BY partition ORDER BY partition"
    ).fetchall()
    print("\nrecords per partition (DuckDB over root.read_table):")
    for p, n, first, last in per_partition:
        print(f"  partition {p}: {n:6,} records, offsets {first}..{last}")
    assert sum(n for _, n, _, _ in per_partition) == N
    assert all(first == 0 and last == n - 1 for _, n, first, last in per_partition)
    split = con.execute(
        "SELECT count(*) FROM (SELECT key FROM orders GROUP BY key HAVING count(DISTINCT partition) > 1)"
    ).fetchone()
    assert split == (0,), "a key in two partitions"

    best = con.execute(
        "SELECT decode(key) AS customer, count(*) AS orders, "
        "       sum((decode(value) ->> 'amount')::BIGINT) AS cents "
        "FROM orders GROUP BY customer ORDER BY cents DESC, customer LIMIT 5"
    ).fetchall()
    print("\nbest customers (JSON values decoded in SQL):")
    for customer, n, cents in best:
        print(f"  {customer}: {n} orders, {cents / 100:,.2f}")
    by_customer: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        by_customer[f"customer-{r['customer']:03d}"].append(r["amount"])
    want = sorted(((-sum(a), c, len(a)) for c, a in by_customer.items()))[:5]
    assert [(c, n, -s) for s, c, n in want] == best

    per_source = con.execute(
        "SELECT decode(h.value) AS source, count(*) AS orders "
        "FROM (SELECT unnest(headers) AS h FROM orders) WHERE h.key = 'source' "
        "GROUP BY source ORDER BY orders DESC"
    ).fetchall()
    print("\norders per 'source' header: " + ", ".join(f"{s} {n:,}" for s, n in per_source))
    assert dict(per_source) == dict(Counter(r["source"] for r in rows))

    # 2. one hour, read by time: only that hour's offsets are read from the log
    noon = root.read_table(TOPIC, start_timestamp=DAY + 12 * HOUR, end_timestamp=DAY + 13 * HOUR)
    con.register("noon", noon)
    buckets = con.execute(
        "SELECT strftime(time_bucket(INTERVAL 10 minutes, timestamp), '%H:%M') AS t, count(*) AS orders "
        "FROM noon GROUP BY t ORDER BY t"
    ).fetchall()
    print(f"\n12:00-13:00 UTC, read with start_timestamp/end_timestamp: {noon.num_rows:,} orders")
    print("  " + "  ".join(f"{t} {n}" for t, n in buckets))
    want_noon = [r for r in rows if DAY + 12 * HOUR <= r["ts"] < DAY + 13 * HOUR]
    assert noon.num_rows == len(want_noon) == sum(n for _, n in buckets)
    assert [t for t, _ in buckets] == [f"12:{m:02d}" for m in range(0, 60, 10)]

    # 3. the whole topic streamed: DuckDB pulls batches of at most 8,192 rows as it scans
    batches = 0

    def counted() -> Iterator[pa.RecordBatch]:
        nonlocal batches
        for batch in root.read_batches(TOPIC, max_records=8_192):
            batches += 1
            yield batch

    stream = pa.RecordBatchReader.from_batches(TABLE_SCHEMA, counted())
    con.register("stream", stream)
    n, cents = con.execute(
        "SELECT count(*), sum((decode(value) ->> 'amount')::BIGINT) FROM stream"
    ).fetchone() or (0, 0)
    print(f"\nstreamed through DuckDB in {batches} batches: {n:,} orders, {cents / 100:,.2f} in total")
    assert n == N and cents == sum(r["amount"] for r in rows) and batches >= N // 8_192

    root.close()
    checked = len(per_partition) + len(best) + len(per_source) + len(buckets) + 2
    print(f"\nOK: checked {checked} answers against Python")


if __name__ == "__main__":
    main()
