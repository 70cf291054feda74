"""A pylog root: pylog.open, topics, append/read_table, clean shutdown, lock, Kafka dirs.

Tests taking ``backend`` run on local disk and on S3 (tests/conftest.py); the others are about
local files (the writer lock, crash recovery from files on disk, Kafka log dirs copied from a
broker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pylog
from pylog.storage.codec.partitioner import partition_for_keys
from pylog.storage.errors import ConfigError, LogLockedError, PylogError, StorageError
from pylog.storage.partition import checkpoint as ckpt
from pylog.storage.root.manager import CLEAN_SHUTDOWN, TABLE_SCHEMA
from pylog.storage.root.metadata import TOPICS_FILE
from tests.conftest import Backend
from tests.kafka_fixtures import b64, expected_records, manifest_logs, require_fixtures


def test_create_append_read_and_reopen(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("events", partitions=3, config={"segment.bytes": "4096", "retention.ms": 1000})
        keys = pa.array([b"user-%d" % (i % 17) for i in range(300)])
        table = pa.table(
            {
                "key": keys,
                "value": pa.array([b"v%d" % i for i in range(300)]),
                "timestamp": pa.array(np.arange(300) + 1_700_000_000_000, pa.timestamp("ms")),
            }
        )
        written = root.append("events", table)
        assert sum(w.num_records for w in written.values()) == 300
        t = root.read_table("events")
        assert t.schema == TABLE_SCHEMA
        assert t.num_rows == 300
    with backend.open(read_only=True) as reader:
        assert reader.storage.exists(CLEAN_SHUTDOWN) and reader.storage.exists(TOPICS_FILE)
        assert ckpt.read_offsets(reader.storage, ckpt.RECOVERY_POINT)[("events", 0)] > 0
    with backend.open() as again:
        assert again.topics() == ["events"] and again.partitions("events") == 3
        assert again.config("events").segment_bytes == 4096
        t = again.read_table("events")
        # every key is in Kafka's murmur2 partition, offsets dense per partition
        want = partition_for_keys(t.column("key"), 3)
        assert t.column("partition").to_numpy().tolist() == want.tolist()
        for p in range(3):
            offs = t.filter(pa.compute.equal(t.column("partition"), p)).column("offset").to_pylist()
            assert offs == list(range(len(offs)))
        assert sorted(t.column("value").to_pylist()) == sorted(b"v%d" % i for i in range(300))
        again.append("events", pa.table({"value": [b"late"]}), partition=1)
        assert again.read_table("events", [1]).column("value").to_pylist()[-1] == b"late"


def test_null_keys_share_a_partition_and_explicit_partitions(backend: Backend) -> None:
    root = backend.open()
    root.create_topic("t", partitions=4)
    out = root.append("t", [b"a", b"b", b"c"])
    assert len(out) == 1 and next(iter(out.values())).num_records == 3
    root.append("t", pa.table({"value": [b"x", b"y"], "partition": pa.array([3, 0], pa.int32())}))
    t = root.read_table("t")
    assert t.filter(pa.compute.equal(t.column("value"), b"x")).column("partition").to_pylist() == [3]
    with pytest.raises(ConfigError, match="out of range"):
        root.append("t", [b"z"], partition=9)
    root.close()


def test_bad_names_and_unknown_topics(backend: Backend) -> None:
    root = backend.open()
    for bad in ["", ".", "..", "../escape", "a/b", "x" * 250, "spaces here"]:
        with pytest.raises(ConfigError):
            root.create_topic(bad)
    with pytest.raises(ConfigError, match="unknown"):
        root.create_topic("ok", config={"segment.byte": 5})
    root.create_topic("ok")
    with pytest.raises(PylogError, match="already exists"):
        root.create_topic("ok")
    with pytest.raises(PylogError, match=r"unknown topic 'nope'.*ok"):
        root.read_table("nope")
    with pytest.raises(ConfigError, match="partition 5 is out of range"):
        root.log("ok", 5)
    root.close()
    assert root.topics() == ["ok"]
    if backend.is_local:
        assert not (Path(backend.url).parent / "escape-0").exists()
    else:
        assert backend.server is not None
        parent = backend.url[len("s3://") :].rsplit("/", 1)[0]
        assert not backend.server.filesystem().find(f"{parent}/escape-0")


def test_crash_without_close_recovers_from_checkpoint(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", config={"segment.bytes": 2048})
    for i in range(50):
        root.append("t", [b"r%03d" % i] * 3)
    root.flush()
    root.append("t", [b"unflushed"])
    leo = root.log("t", 0).log_end_offset
    root._writer.close()  # type: ignore[union-attr]  # the process dies: lock released, no marker
    again = pylog.open(tmp_path)
    assert again.log("t", 0).log_end_offset == leo  # readers trust files
    again.create_topic("u")  # becomes the writer: unclean shutdown → recovery
    assert again.log("t", 0).log_end_offset == leo
    assert any(r.recovered_segments for r in again.recoveries)
    again.close()


@pytest.mark.subprocess
def test_second_writer_process_is_refused(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t")
    script = textwrap.dedent(f"""
        import pylog, sys
        from pylog.storage.errors import LogLockedError
        r = pylog.open({str(tmp_path)!r})
        print(r.read_table("t").num_rows)          # reading needs no lock
        try:
            r.append("t", [b"x"])
        except LogLockedError as e:
            print("locked:", e)
            sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "another process holds the writer lock" in proc.stdout
    root.close()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_read_only_root_refuses_writes(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t")
    ro = backend.open(read_only=True)
    with pytest.raises(PylogError, match="read-only"):
        ro.create_topic("u")
    with pytest.raises(LogLockedError.__mro__[1]):
        ro.append("t", [b"x"])
    ro.close()
    with backend.open(read_only=True) as again:
        assert again.topics() == ["t"] and again.read_table("t").num_rows == 0


LEGACY_FREE = [e for e in manifest_logs() if not e["expected_corrupt"]]


@pytest.mark.parametrize("entry", LEGACY_FREE or [None], ids=[e["log"] for e in LEGACY_FREE] or ["absent"])
def test_kafka_log_dir_without_metadata_opens(backend: Backend, entry: dict | None) -> None:
    """A broker's log directory copied as it is (to a directory, or to a bucket prefix: the
    objects are the files, no manifest) reads exactly; a writer refuses such a prefix."""
    root_dir = require_fixtures()
    assert entry is not None
    src = root_dir / entry["log"]
    if backend.is_local:
        part = Path(backend.url) / src.parent.name
        part.mkdir(parents=True)
        shutil.copy(src, part / src.name)  # a copied broker log dir (copied at test time only)
    else:
        assert backend.server is not None
        fs = backend.server.filesystem()
        fs.put_file(str(src), f"{backend.url[len('s3://') :]}/{src.parent.name}/{src.name}")
    root = backend.open(read_only=True)
    topic = entry["topic"]
    assert root.topics() == [topic] and root.partitions(topic) == entry["partition"] + 1
    t = root.read_table(topic)
    exp = expected_records(entry)
    assert t.column("offset").to_pylist() == [e["offset"] for e in exp]
    assert t.column("value").to_pylist() == [b64(e["value_b64"]) for e in exp]
    assert t.column("key").to_pylist() == [b64(e["key_b64"]) for e in exp]
    if not backend.is_local:  # the orphan sweep would take the broker's files for garbage
        with pytest.raises(StorageError, match="no pylog manifest"):
            backend.open().create_topic("other")
        assert backend.open(read_only=True).read_table(topic).num_rows == len(exp)


def test_append_with_scalar_timestamp_and_keys(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", partitions=3)
        root.append("t", [b"a", b"b", b"c"], key=[b"1", b"2", b"3"], timestamp=1234)
        t = root.read_table("t")
        assert sorted(t.column("value").to_pylist()) == [b"a", b"b", b"c"]
        assert {ts.timestamp() for ts in t.column("timestamp").to_pylist()} == {1.234}


def test_append_takes_dicts_and_dataframes_of_columns_and_refuses_a_lone_string(tmp_path: Path) -> None:
    """A dict of columns and a pandas DataFrame are tables (their ``key`` column is the key, not
    a value); a lone str or bytes would be one record per character: refused, nothing written."""
    pd = pytest.importorskip(
        "pandas", reason="pandas (installed with the spark extra) is needed to build a DataFrame"
    )
    with pylog.open(tmp_path) as root:
        root.create_topic("t", partitions=1)
        root.append("t", {"key": [b"k"], "value": [b"v"]})
        root.append("t", pd.DataFrame({"key": [b"k1", b"k2"], "value": [b"v1", b"v2"]}))
        for bad, why in (
            ("hello", "not a single str"),
            (b"hello", "not a single bytes"),
            ({"value": [b"a"], "key": [b"x", b"y"]}, r"key: has 2 values, expected 1"),
            ({"key": [b"x"]}, "the columns need a 'value' column"),
        ):
            with pytest.raises(ConfigError, match=why):
                root.append("t", bad)
        # each column as its argument would be: null keys, header pairs, one key for every record
        root.append(
            "t", types.MappingProxyType({"key": [None], "value": [b"v3"], "headers": [[("h", b"x")]]})
        )
        root.append("t", [b"v4", b"v5"], key="same")
        t = root.read_table("t")
        assert t.column("key").to_pylist() == [b"k", b"k1", b"k2", None, b"same", b"same"]
        assert t.column("value").to_pylist() == [b"v", b"v1", b"v2", b"v3", b"v4", b"v5"]
        assert t.column("headers").to_pylist()[3] == [{"key": "h", "value": b"x"}]


def test_log_start_offset_without_opening_a_log_is_the_opened_logs(backend: Backend, tmp_path: Path) -> None:
    """What a stream's planner asks for a partition read from ``earliest``: the same answer as
    the opened log's, from the checkpoint and the segment names, whatever retention did."""
    from pylog.storage.maintenance.runner import maintain

    with backend.open() as root:
        root.create_topic("t", 3, {"segment.bytes": "300", "retention.bytes": "700"})
        for i in range(40):
            root.append("t", pa.table({"key": [b"k%d" % i], "value": [b"v" * 40]}), partition=0)
        root.append("t", pa.table({"key": [b"a"], "value": [b"b"]}), partition=1)
        maintain(root, now=1_700_000_000_000)  # retention moves partition 0's log start
    with backend.open(read_only=True) as r:
        cheap = [r.log_start_offset("t", p) for p in range(3)]
        opened = [r.log("t", p).log_start_offset for p in range(3)]
        assert cheap == opened and cheap[0] > 0 and cheap[1:] == [0, 0]
        assert [r.log_start_offset("t", p) for p in range(3)] == opened  # from the open logs now
        with pytest.raises(ConfigError, match="out of range"):
            r.log_start_offset("t", 3)
    if backend.is_local:  # a checkpointed start beyond the high watermark: damage, as the log says
        ckpt_path = Path(backend.url) / "log-start-offset-checkpoint"
        saved = ckpt_path.read_bytes()
        ckpt_path.write_text("0\n1\nt 1 500\n")
        with backend.open(read_only=True) as r:
            assert r.log_start_offset("t", 1) == r.log("t", 1).log_start_offset <= 1
            assert r.log("t", 1).damage  # and reading it reports the damage
        ckpt_path.write_bytes(saved)
    if backend.is_local:  # a compaction's swap interrupted after its .swap files: the reader's view
        d = Path(backend.url) / "t-0"
        first = min(int(n[:20]) for n in (p.name for p in d.iterdir()) if n.endswith(".log"))
        for kind in ("log", "index", "timeindex"):
            src = d / f"{first:020d}.{kind}"
            if src.exists():
                shutil.copy(src, d / f"{first - 1:020d}.{kind}.swap")  # a swap below the first segment
        with backend.open(read_only=True) as r:
            assert r.log_start_offset("t", 0) == r.log("t", 0).log_start_offset
