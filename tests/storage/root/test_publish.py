"""Exactly-once publishing: high watermarks, sink batch records, crash at every step.

Tests taking ``backend`` run on local disk and on S3 (tests/conftest.py); the crash-point test
and the state-file validation are about local files (the object-store commit has its own fault
tests in test_objectstore_faults.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylog
from pylog.storage.codec import records
from pylog.storage.errors import UnsupportedFormatError
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from tests.conftest import Backend


class Crash(Exception):
    pass


def stage(
    root: Root,
    topic: str,
    partition: int,
    sink: str,
    batch: int,
    task: int,
    values: list[bytes],
    attempt: int = 0,
) -> pub.StagedFile:
    """What an executor task does: encode its rows and write them next to the log."""
    name = pub.stage_name(sink, batch, task, attempt)
    data = records.encode(values, timestamp=1000).tobytes()
    root.storage.write_atomic(f"{partition_dir(topic, partition)}/{name}", data)
    return pub.StagedFile(topic, partition, name)


def values_of(where: Path | Backend, topic: str = "t") -> list[bytes]:
    """What a new reader sees."""
    reader = where.open(read_only=True) if isinstance(where, Backend) else pylog.open(where, read_only=True)
    with reader as r:
        return r.read_table(topic).column("value").to_pylist()


def staged_names(backend: Backend, directory: str) -> set[str]:
    """Staged files a new reader finds in a partition directory."""
    with backend.open(read_only=True) as r:
        return set(r.storage.listdir_staged(directory))


@pytest.fixture
def root(backend: Backend) -> Iterator[Root]:
    r = backend.open()
    r.create_topic("t", partitions=2)
    yield r
    r.close()


def test_publish_then_replay_is_skipped(root: Root, backend: Backend) -> None:
    files = [stage(root, "t", 0, "q1", 0, 0, [b"a", b"b"]), stage(root, "t", 1, "q1", 0, 1, [b"c"])]
    out = root.publish("q1", 0, files)
    assert out is not None and {k: v.num_records for k, v in out.items()} == {("t", 0): 2, ("t", 1): 1}
    assert sorted(values_of(backend)) == [b"a", b"b", b"c"]
    assert staged_names(backend, "t-0") == staged_names(backend, "t-1") == set()
    # Spark replays batch 0 (e.g. the commit log entry was lost): staged again, skipped
    again = [stage(root, "t", 0, "q1", 0, 0, [b"a", b"b"], attempt=1)]
    assert staged_names(backend, "t-0") == {again[0].name}
    assert root.publish("q1", 0, again) is None
    assert sorted(values_of(backend)) == [b"a", b"b", b"c"]
    assert staged_names(backend, "t-0") == set()  # the replay's staged file is removed too
    assert root.last_committed_batch("q1") == 0 and root.last_committed_batch("other") == -1
    # another sink's batch 0 is its own
    assert root.publish("q2", 0, [stage(root, "t", 0, "q2", 0, 0, [b"d"])]) is not None
    root.close()
    assert sorted(values_of(backend)) == [b"a", b"b", b"c", b"d"]
    with backend.open(read_only=True) as r:
        assert r.last_committed_batch("q1") == 0 and r.last_committed_batch("q2") == 0


def test_abandoned_attempts_are_swept(root: Root, backend: Backend) -> None:
    stage(root, "t", 1, "q1", 3, 0, [b"lost attempt"], attempt=0)  # a failed task's leftovers
    good = stage(root, "t", 1, "q1", 3, 0, [b"x"], attempt=1)
    stage(root, "t", 0, "q1", 4, 0, [b"next batch, not yet committed"])
    root.publish("q1", 3, [good])
    assert staged_names(backend, "t-1") == set()
    assert staged_names(backend, "t-0") == {pub.stage_name("q1", 4, 0, 0)}
    assert values_of(backend) == [b"x"]


@pytest.mark.parametrize("step", ["appended", "flushed", "state-written"])
def test_crash_at_each_step_of_a_publish(tmp_path: Path, step: str) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", partitions=2)
    root.publish("q", 0, [stage(root, "t", 0, "q", 0, 0, [b"before"])])
    files = [stage(root, "t", 0, "q", 1, 0, [b"new-0"]), stage(root, "t", 1, "q", 1, 1, [b"new-1"])]

    def hook(name: str) -> None:
        if name == step:
            # a reader looking while the publish is in flight sees only acknowledged data
            if step != "state-written":
                assert values_of(tmp_path) == [b"before"]
            raise Crash(name)

    root.faults.hook = hook
    with pytest.raises(Crash):
        root.publish("q", 1, files)
    root._writer.close()  # type: ignore[union-attr]  # the driver process dies here
    committed = step == "state-written"
    assert sorted(values_of(tmp_path)) == ([b"before", b"new-0", b"new-1"] if committed else [b"before"])
    # restart: Spark replays batch 1 with freshly staged data
    again = pylog.open(tmp_path)
    retry = [stage(again, "t", 0, "q", 1, 0, [b"new-0"], 1), stage(again, "t", 1, "q", 1, 1, [b"new-1"], 1)]
    assert (again.publish("q", 1, retry) is None) == committed
    again.close()
    assert sorted(values_of(tmp_path)) == [b"before", b"new-0", b"new-1"]  # exactly once either way
    with pylog.open(tmp_path, read_only=True) as r:
        offsets = r.read_table("t", [0]).column("offset").to_pylist()
    assert offsets == [0, 1]  # the rolled-back bytes left no gap and no duplicate
    if not committed:
        assert any(rec.unpublished_bytes for rec in again.recoveries)


def test_append_is_acknowledged_and_visible_to_other_readers(root: Root, backend: Backend) -> None:
    root.append("t", [b"v1"], partition=0)
    assert values_of(backend) == [b"v1"]
    lg = root.writable_log("t", 0)
    # a raw log append does not move the high watermark (on an object store it is not even
    # committed: it is outside any transaction)
    lg.append([b"unacknowledged"])
    assert values_of(backend) == [b"v1"]
    state = pub.read_state(root.storage)
    assert state.high_watermarks[("t", 0)] == 1 and state.high_watermarks[("t", 1)] == 0
    root.append("t", [b"v2"], partition=1)
    assert sorted(values_of(backend)) == [b"v1", b"v2"]


CONCURRENT = textwrap.dedent("""
    import json, sys, pylog
    from pylog.storage.root import publish as pub
    from pylog.storage.codec import records
    root_dir, options, sink, n = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    for batch in range(n):
        r = pylog.open(root_dir, options or None, lock_timeout=60)
        r._ensure_writer()
        files = []
        for p in range(2):
            name = pub.stage_name(sink, batch, p, 0)
            vals = [f"{sink}-{batch}-{p}-{i}".encode() for i in range(5)]
            r.storage.write_atomic(f"t-{p}/{name}", records.encode(vals, timestamp=1).tobytes())
            files.append(pub.StagedFile("t", p, name))
        assert r.publish(sink, batch, files) is not None
        r.close()
""")


@pytest.mark.subprocess
def test_two_writer_processes_publish_concurrently(root: Root, backend: Backend) -> None:
    """Local disk: the writers take turns on the lock; object store: they race to commit."""
    root.close()
    options = json.dumps(backend.options)
    n = 8 if backend.is_local else 3  # object store: keep the run short (each batch is a few round trips)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, backend.url, options, s, str(n)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in ("qa", "qb")
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    r = backend.open(read_only=True)
    t = r.read_table("t")
    vals = t.column("value").to_pylist()
    assert len(vals) == len(set(vals)) == 2 * n * 2 * 5
    assert r.last_committed_batch("qa") == r.last_committed_batch("qb") == n - 1
    for p in range(2):
        offs = r.read_table("t", [p]).column("offset").to_pylist()
        assert offs == list(range(len(offs)))


def test_state_file_is_validated(tmp_path: Path) -> None:
    (tmp_path / pub.STATE_FILE).write_text('{"version": 9}')
    with pytest.raises(pylog.PylogError, match=r"pylog-state\.json.*version"):
        pylog.open(tmp_path)
    with pytest.raises(pylog.PylogError, match="sink id"):
        pub.stage_name("bad id!", 0, 0, 0)


DAY = 24 * 3600 * 1000


def test_queries_not_seen_for_the_retention_time_are_expired(root: Root, backend: Backend) -> None:
    t0 = 1_700_000_000_000
    root.publish("qa", 0, [stage(root, "t", 0, "qa", 0, 0, [b"a"])], now=t0, retention_ms=7 * DAY)
    root.publish("qb", 5, [stage(root, "t", 0, "qb", 5, 0, [b"b"])], now=t0 + 6 * DAY, retention_ms=7 * DAY)
    assert root.last_committed_batch("qa") == 0  # 6 days: still known, a replay is skipped
    assert root.publish("qa", 0, [stage(root, "t", 0, "qa", 0, 1, [b"a"])], now=t0 + 6 * DAY) is None
    # qb commits 8 days after qa's last commit: qa's record is dropped, qb's kept
    root.publish("qb", 6, [stage(root, "t", 1, "qb", 6, 0, [b"c"])], now=t0 + 8 * DAY, retention_ms=7 * DAY)
    root.close()
    with backend.open(read_only=True) as r:
        state = pub.read_state(r.storage)
    assert state.queries == {"qb": pub.QueryRecord(6, t0 + 8 * DAY)}
    assert sorted(values_of(backend)) == [b"a", b"b", b"c"]


def test_state_file_of_another_version_is_refused(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", partitions=1)
    root.publish("q1", 0, [stage(root, "t", 0, "q1", 0, 0, [b"a"])])
    root.close()
    state = tmp_path / pub.STATE_FILE
    for version in (1, 3):
        doc = json.dumps({"version": version, "high_watermarks": {"t": {"0": 1}}, "sinks": {"q1": 4}})
        state.write_text(doc)
        for read_only in (False, True):
            with pytest.raises(
                UnsupportedFormatError, match=rf"pylog-state\.json: state file version {version} "
            ):
                pylog.open(tmp_path, read_only=read_only).close()
        assert state.read_text() == doc  # nothing is changed


def test_state_file_with_an_empty_sinks_key_is_read(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", partitions=1)
    root.publish("q1", 0, [stage(root, "t", 0, "q1", 0, 0, [b"a"])], now=5)
    root.close()
    state = tmp_path / pub.STATE_FILE
    doc = json.loads(state.read_text())
    assert "sinks" not in doc
    state.write_text(json.dumps({**doc, "sinks": {}}))
    root = pylog.open(tmp_path)
    assert root.last_committed_batch("q1") == 0
    assert root.publish("q1", 0, [stage(root, "t", 0, "q1", 0, 1, [b"x"])]) is None  # a replay
    root.close()
    assert values_of(tmp_path) == [b"a"]


def test_unrecorded_publish_of_a_batch_write(root: Root, backend: Backend) -> None:
    for task in range(2):
        f = stage(root, "t", 0, "w1", 0, task, [b"v%d" % task])
        assert root.publish("w1", 0, [f], exactly_once=False) is not None  # never taken for a replay
    root.close()
    assert sorted(values_of(backend)) == [b"v0", b"v1"]
    with backend.open(read_only=True) as r:
        assert r.last_committed_batch("w1") == -1
