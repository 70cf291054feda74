"""Maintenance of a root as a Spark job (connector/maintenance.py): one task per partition,
beside a writer appending to the same topic, on local disk and moto's S3 server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa

from pylog.connector import maintenance
from tests.conftest import Backend

KEYS = 20
PAD = b"." * 700  # 8 records a commit: over 4 KiB, so each commit seals its segment on S3


def _fill(root: Any, rounds: int) -> None:
    for i in range(rounds):
        for p in range(3):
            keys = [b"k%d-%d" % (p, (i * 8 + j) % KEYS) for j in range(8)]
            root.append(
                "c", pa.table({"key": keys, "value": [b"r%d-%s" % (i, k) + PAD for k in keys]}), partition=p
            )


def test_a_compaction_job_beside_a_writer_keeps_every_append_and_the_latest_values(
    spark: Any, backend: Backend
) -> None:
    with backend.open() as root:
        root.create_topic(
            "c",
            3,
            {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"},
        )
        _fill(root, 12)
        before = root.read_table("c")
    by_offset = {
        (p, o): (k, v)
        for p, o, k, v in zip(
            before.column("partition").to_pylist(),
            before.column("offset").to_pylist(),
            before.column("key").to_pylist(),
            before.column("value").to_pylist(),
            strict=True,
        )
    }
    stop = threading.Event()
    appended: list[bytes] = []
    errors: list[BaseException] = []

    def writer() -> None:  # appends while the job runs, a commit at a time like the sink
        try:
            i = 0
            while not stop.is_set():
                v = b"live-%d" % i + PAD
                with backend.open(lock_timeout=60) as root:  # the writer lock only per commit
                    root.append("c", pa.table({"key": [b"live-%d" % i], "value": [v]}), partition=i % 3)
                appended.append(v)
                i += 1
                time.sleep(0.02)
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=writer)
    th.start()
    try:
        summary = maintenance.run(
            spark,
            backend.url,
            storage_options=backend.options or None,
            force=True,
            now=int(time.time() * 1000),
        )
    finally:
        stop.set()
        th.join(60)
    assert not errors, errors
    assert len(summary.partitions) == 3 and not summary.errors, summary.describe()
    assert summary.partitions_cleaned == 3 and summary.records_removed > 0, summary.describe()
    after_bytes = {(p.topic, p.partition): p.bytes_after for p in summary.partitions}
    assert all(p.bytes_after < p.bytes_before for p in summary.partitions), after_bytes
    with backend.open(read_only=True) as r:
        t = r.read_table("c")
    rows = list(
        zip(
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )
    live = [v for _, _, _, v in rows if v.startswith(b"live-")]
    assert sorted(live) == sorted(appended) and len(live) == len(set(live))  # every append, once
    for p, o, k, v in rows:  # what was there before keeps its offset and value
        if (p, o) in by_offset:
            assert by_offset[(p, o)] == (k, v)
    latest: dict[bytes, bytes] = {}
    for p, o in sorted(by_offset):
        k, v = by_offset[(p, o)]
        latest[k] = v
    kept = {k: v for _, _, k, v in rows}
    assert all(kept[k] == v for k, v in latest.items())  # the latest value of every key survives
    for p in range(3):
        offs = [o for q, o, _, _ in rows if q == p]
        assert offs == sorted(set(offs))
