"""Maintenance of a root as a Spark job (connector/maintenance.py): one task per partition,
beside a writer appending to the same topic, on local disk and moto's S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pytest

from pylog.connector import maintenance
from tests.conftest import BUCKET, Backend
from tests.connector.maintenance_helpers import PAD, check_compacted, fill, job_beside_stream, rows_of

REPO = Path(__file__).resolve().parents[2]


LIVE_APPENDS = 90
"""Appends of the writer beside the job: 30 of ~700 bytes per partition, well under the 76
superseded records of ~700 bytes per partition (96 records over 20 keys) the compaction removes."""


def test_a_compaction_job_beside_a_writer_keeps_every_append_and_the_latest_values(
    spark: Any, backend: Backend
) -> None:
    with backend.open() as root:
        root.create_topic(
            "c",
            3,
            {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"},
        )
        fill(root, 12)
        history = rows_of(root.read_table("c"))
    stop = threading.Event()
    appended: list[bytes] = []
    errors: list[BaseException] = []

    def writer() -> None:  # appends while the job runs, a commit at a time like the sink
        try:
            i = 0
            # at most LIVE_APPENDS, however slow the job: what they add stays below what the
            # compaction removes, so each partition shrinks on a machine of any speed
            while not stop.is_set() and i < LIVE_APPENDS:
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
        rows = rows_of(r.read_table("c"))
    live = [v for _, _, _, v in rows if v.startswith(b"live-")]
    assert sorted(live) == sorted(appended) and len(live) == len(set(live))  # every append, once
    check_compacted(history, rows)


class Crash(BaseException):
    """The task's process dies here."""


def test_a_task_killed_mid_pass_leaves_the_previous_state_and_its_retry_applies_once(
    backend: Backend, monkeypatch: Any
) -> None:
    from pylog.storage.backends.local import LocalStorage
    from pylog.storage.faults import Faults

    with backend.open() as root:
        root.create_topic("c", 3, {"cleanup.policy": "compact", "segment.bytes": "16384"})
        fill(root, 12)
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
        real_step = Faults.step

        def step(self: Faults, name: str) -> None:  # (the task opens its own storage)
            if name == "uploaded" and not crashed:
                crashed.append(name)
                raise Crash(name)
            real_step(self, name)

        monkeypatch.setattr(Faults, "step", step)
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
    """A streaming query writes into the compacted topic (its own compactor off) while the
    maintenance job cleans it (see :func:`job_beside_stream`)."""
    summary = job_beside_stream(spark, backend.url, backend.options, str(tmp_path / "ck"))
    if backend.is_local:
        assert all(p.lock_held_s < p.elapsed_s for p in summary.partitions)


@pytest.mark.subprocess  # Spark's local-cluster master in a process of its own
def test_the_job_on_a_local_cluster(s3_server: Any, tmp_path: Path) -> None:
    """The same on Spark's ``local-cluster`` master, with two executor processes of their own,
    on local disk and on S3 (in a subprocess, since a process has one SparkContext and the
    tests' session is local[2])."""
    runs = [
        [str(tmp_path / "root"), {}, str(tmp_path / "ck-local")],
        [f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", dict(s3_server.options), str(tmp_path / "ck-s3")],
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.connector.maintenance_helpers", json.dumps(runs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2
    for result in results:
        assert result["master"].startswith("local-cluster") and result["executors"] == 2, result
        assert result["partitions_cleaned"] == 3 and result["task_pids"] >= 2, result
