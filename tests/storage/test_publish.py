"""Exactly-once publishing: high watermarks, sink batch records, crash at every step."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pylog
from pylog.storage import publish as pub
from pylog.storage import records
from pylog.storage.manager import Root, partition_dir


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


def values_of(path: Path, topic: str = "t") -> list[bytes]:
    with pylog.open(path, read_only=True) as r:
        return r.read_table(topic).column("value").to_pylist()


@pytest.fixture
def root(tmp_path: Path) -> Root:
    r = pylog.open(tmp_path)
    r.create_topic("t", partitions=2)
    return r


def test_publish_then_replay_is_skipped(root: Root, tmp_path: Path) -> None:
    files = [stage(root, "t", 0, "q1", 0, 0, [b"a", b"b"]), stage(root, "t", 1, "q1", 0, 1, [b"c"])]
    out = root.publish("q1", 0, files)
    assert out is not None and {k: v.num_records for k, v in out.items()} == {("t", 0): 2, ("t", 1): 1}
    assert sorted(values_of(tmp_path)) == [b"a", b"b", b"c"]
    # Spark replays batch 0 (e.g. the commit log entry was lost): staged again, skipped
    again = [stage(root, "t", 0, "q1", 0, 0, [b"a", b"b"], attempt=1)]
    assert root.publish("q1", 0, again) is None
    assert sorted(values_of(tmp_path)) == [b"a", b"b", b"c"]
    assert not any(n.startswith(pub.STAGE_PREFIX) for n in (tmp_path / "t-0").iterdir() for n in [n.name])
    assert root.last_committed_batch("q1") == 0 and root.last_committed_batch("other") == -1
    # another sink's batch 0 is its own
    assert root.publish("q2", 0, [stage(root, "t", 0, "q2", 0, 0, [b"d"])]) is not None
    root.close()
    assert sorted(values_of(tmp_path)) == [b"a", b"b", b"c", b"d"]


def test_abandoned_attempts_are_swept(root: Root, tmp_path: Path) -> None:
    stage(root, "t", 1, "q1", 3, 0, [b"lost attempt"], attempt=0)  # a failed task's leftovers
    good = stage(root, "t", 1, "q1", 3, 0, [b"x"], attempt=1)
    stage(root, "t", 0, "q1", 4, 0, [b"next batch, not yet committed"])
    root.publish("q1", 3, [good])
    names = {p.name for d in ("t-0", "t-1") for p in (tmp_path / d).iterdir()}
    assert pub.stage_name("q1", 3, 0, 0) not in names and pub.stage_name("q1", 4, 0, 0) in names
    assert values_of(tmp_path) == [b"x"]


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

    root.step_hook = hook
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


def test_append_is_acknowledged_and_visible_to_other_readers(root: Root, tmp_path: Path) -> None:
    root.append("t", [b"v1"], partition=0)
    assert values_of(tmp_path) == [b"v1"]
    lg = root.log("t", 0)
    lg.append([b"unacknowledged"])  # a raw log append does not move the high watermark
    assert values_of(tmp_path) == [b"v1"]
    state = pub.read_state(root.storage)
    assert state.high_watermarks[("t", 0)] == 1 and state.high_watermarks[("t", 1)] == 0


CONCURRENT = textwrap.dedent("""
    import sys, pylog
    from pylog.storage import publish as pub, records
    root_dir, sink, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for batch in range(n):
        r = pylog.open(root_dir, lock_timeout=60)
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


def test_two_writer_processes_publish_concurrently(root: Root, tmp_path: Path) -> None:
    root.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(tmp_path), s, "8"], stderr=subprocess.PIPE, text=True
        )
        for s in ("qa", "qb")
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with pylog.open(tmp_path, read_only=True) as r:
        t = r.read_table("t")
    vals = t.column("value").to_pylist()
    assert len(vals) == len(set(vals)) == 2 * 8 * 2 * 5
    for p in range(2):
        offs = r.read_table("t", [p]).column("offset").to_pylist()
        assert offs == list(range(len(offs)))


def test_state_file_is_validated(tmp_path: Path) -> None:
    (tmp_path / pub.STATE_FILE).write_text('{"version": 9}')
    with pytest.raises(pylog.PylogError, match=r"pylog-state\.json.*version"):
        pylog.open(tmp_path)
    with pytest.raises(pylog.PylogError, match="sink id"):
        pub.stage_name("bad id!", 0, 0, 0)
