"""Maintenance of a root as a Spark job (connector/maintenance.py): one task per partition,
beside a writer appending to the same topic, on local disk and moto's S3 server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pytest

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


class Crash(BaseException):
    """The task's process dies here."""


def test_a_task_killed_mid_pass_leaves_the_previous_state_and_its_retry_applies_once(
    backend: Backend, monkeypatch: Any
) -> None:
    from pylog.storage.backends.fs import LocalStorage
    from pylog.storage.backends.objectfs import ObjectStorage

    with backend.open() as root:
        root.create_topic("c", 3, {"cleanup.policy": "compact", "segment.bytes": "16384"})
        _fill(root, 12)
        before = root.read_table("c")
    now = int(time.time() * 1000)
    options = backend.options or None
    crashed: list[str] = []
    if backend.is_local:  # in the middle of the swap: .swap files renamed, not all of them
        real_rename = LocalStorage.rename

        def rename(self: LocalStorage, src: str, dst: str) -> None:
            if src.endswith(".swap") and not crashed:
                crashed.append(src)
                raise Crash(src)
            real_rename(self, src, dst)

        monkeypatch.setattr(LocalStorage, "rename", rename)
    else:  # the cleaned segments uploaded, the commit not created

        def step(self: ObjectStorage, name: str) -> None:
            if name == "uploaded" and not crashed:
                crashed.append(name)
                raise Crash(name)

        monkeypatch.setattr(ObjectStorage, "_step", step)
    old = before.filter(pa.compute.equal(before.column("partition"), 0))
    by_offset = dict(zip(old.column("offset").to_pylist(), old.column("value").to_pylist(), strict=True))
    latest = dict(zip(old.column("key").to_pylist(), old.column("value").to_pylist(), strict=True))

    def partition_0() -> dict[bytes, bytes]:
        with backend.open(read_only=True) as r:
            got = r.read_table("c", [0])
        offsets = got.column("offset").to_pylist()
        assert offsets == sorted(set(offsets))
        assert all(by_offset[o] == v for o, v in zip(offsets, got.column("value").to_pylist(), strict=True))
        kept = dict(zip(got.column("key").to_pylist(), got.column("value").to_pylist(), strict=True))
        assert kept == latest  # the latest value of every key, whatever else is still there
        return kept

    with pytest.raises(Crash):
        maintenance.run_partition(backend.url, options, ("c", 0), now=now, force=True)
    assert crashed
    partition_0()  # after the kill: the previous state (or, on local disk, a swap readers complete)
    retried = [
        maintenance.run_partition(backend.url, options, ("c", 0), now=now, force=True) for _ in range(2)
    ]
    if not backend.is_local:  # the killed task published nothing: its retry does the work
        assert retried[0].records_removed > 0
    # (on local disk the retry's open completes the interrupted swap first, as Kafka's recovery)
    assert retried[1].records_removed == 0  # applied once: a second run finds nothing to remove
    partition_0()


def test_a_compaction_job_beside_a_streaming_sink(spark: Any, backend: Backend, tmp_path: Any) -> None:
    """The job of issue #18's acceptance: a streaming query writes into the compacted topic
    (its own compactor off) while the job cleans it; afterwards every
    streamed record is there exactly once and the cleaned part is the cleaner's model."""
    with backend.open() as root:
        root.create_topic(
            "c",
            3,
            {"cleanup.policy": "compact", "segment.bytes": "16384"},
        )
        _fill(root, 12)
        before = root.read_table("c")
    history = {
        (p, o): (k, v)
        for p, o, k, v in zip(
            before.column("partition").to_pylist(),
            before.column("offset").to_pylist(),
            before.column("key").to_pylist(),
            before.column("value").to_pylist(),
            strict=True,
        )
    }
    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 40)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "concat('live-', cast(value as string)) AS key", "concat('v', cast(value as string)) AS value"
        )
        .writeStream.format("pylog")
        .options(**backend.spark_options())
        .option("topic", "c")
        .option("maintenance", "false")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while (stream.lastProgress or {}).get("batchId", -1) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the sink is committing before the job starts
        summary = maintenance.run(
            spark,
            backend.url,
            storage_options=backend.options or None,
            force=True,
            now=int(time.time() * 1000),
        )
        batches_during = stream.lastProgress["batchId"]
        time.sleep(1)
    finally:
        stream.stop()
    assert stream.exception() is None, stream.exception()
    assert not summary.errors and summary.partitions_cleaned == 3, summary.describe()
    assert summary.records_removed > 0 and batches_during > 2
    with backend.open(read_only=True) as r:
        t = r.read_table("c")
        written = r.last_committed_batch(next(iter(r._state.queries)))
    rows = list(
        zip(
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )
    live = sorted(int(v[1:]) for _, _, k, v in rows if k.startswith(b"live-"))
    assert written is not None and live == list(range(40 * (written + 1)))  # every streamed row, once
    for p, o, k, v in rows:  # what was there before keeps its offset and value
        if (p, o) in history:
            assert history[(p, o)] == (k, v)
    latest: dict[bytes, bytes] = {}
    for key in sorted(history):
        k, v = history[key]
        latest[k] = v
    kept = {k: v for _, _, k, v in rows}
    assert all(kept[k] == v for k, v in latest.items())  # the latest value of every key
    for p in range(3):  # in order, no offset twice; the prefilled keys compacted
        offs = [o for q, o, _, _ in rows if q == p]
        assert offs == sorted(set(offs))
    old_rows = sum(1 for _, _, k, _ in rows if not k.startswith(b"live-"))
    assert old_rows < len(history)
