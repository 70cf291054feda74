"""The sink's contract without a SparkSession: options, schema checks, staging, publishing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pylog.connector import sink, sink_task
from pylog.connector.sink_options import SinkOptions, check_schema, parse_sink_options
from pylog.storage.codec.partitioner import partition_for_keys
from pylog.storage.errors import ConfigError, PylogError, SinkSchemaError
from tests.conftest import Backend


def opts(where: Path | Backend, **extra: str) -> SinkOptions:
    """Sink options for a root given as a local path or a Backend (path and storage.* options)."""
    root = {"path": str(where)} if isinstance(where, Path) else where.spark_options()
    raw = {**root, "topic": "t", "checkpointLocation": "/checkpoints/q1", **extra}
    return parse_sink_options(raw, streaming=True)


def staged_files(backend: Backend) -> list[str]:
    """Staged files left in the partitions of topic t (local disk or object store alike)."""
    with backend.open(read_only=True) as r:
        return [name for p in range(r.partitions("t")) for name in r.storage.listdir_staged(f"t-{p}")]


def schema(*cols: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t) for n, t in cols])  # type: ignore[arg-type]


def test_options_and_sink_identity(tmp_path: Path) -> None:
    a = opts(tmp_path, partitions="2", **{"cleanup.policy": "compact", "compression.type": "zstd"})
    b = opts(tmp_path)
    assert a.sink_id == b.sink_id  # the same checkpoint is the same sink across restarts
    assert a.partitions == 2 and a.topic_config == {"cleanup.policy": "compact"} and a.codec == "zstd"
    with pytest.raises(ConfigError, match="path is required"):
        parse_sink_options({}, streaming=True)
    with pytest.raises(ConfigError, match=r"unknown option .* for the pylog sink"):
        opts(tmp_path, kafkaBootstrap="x")
    with pytest.raises(ConfigError, match=r"'directWrite' \(did you mean directWrites\?\)"):
        opts(tmp_path, directWrite="false")  # a typo gets the documented spelling of the option
    with pytest.raises(ConfigError, match=r"storage\.pylog\.file_delete_delay_ms: '-5' is not valid"):
        opts(tmp_path, **{"storage.pylog.file_delete_delay_ms": "-5"})
    with pytest.raises(ConfigError, match=r"option lockTimeoutMs: 'soon'"):
        opts(tmp_path, lockTimeoutMs="soon")  # (Spark lower-cases option names; messages do not)
    with pytest.raises(ConfigError, match="with the option path"):
        opts(tmp_path, **{"kafka.bootstrap.servers": "h:9092"})
    assert opts(tmp_path, **{"kafka.acks": "all"}).topic == "t"  # producer settings: ignored, warned
    zero = opts(tmp_path, lockTimeoutMs="0", **{"maintenance.budgetMs": "0"})
    assert zero.lock_timeout_s == 0 and zero.maintenance_budget_ms == 0
    assert opts(tmp_path).direct_writes and not opts(tmp_path, directWrites=" False").direct_writes
    with pytest.raises(ConfigError, match=r"segment\.bytes"):
        opts(tmp_path, **{"segment.bytes": "lots"})
    with pytest.raises(ConfigError, match="partitions"):
        opts(tmp_path, partitions="0")
    with pytest.raises(ConfigError, match=r"codec|compression"):
        opts(tmp_path, **{"compression.type": "brotli"})


@pytest.mark.parametrize(
    ("cols", "message"),
    [
        ([("key", BinaryType())], "needs a 'value' column"),
        ([("value", IntegerType())], "'value' must be binary or string"),
        ([("value", BinaryType()), ("key", IntegerType())], "'key' must be binary or string"),
        ([("value", BinaryType()), ("partition", StringType())], "'partition' must be int"),
        ([("value", BinaryType()), ("headers", ArrayType(StringType()))], "'headers' must be array"),
        ([("value", BinaryType()), ("timestamp", StringType())], "'timestamp' must be timestamp"),
    ],
)
def test_schema_errors_name_the_column(tmp_path: Path, cols: list, message: str) -> None:
    with pytest.raises(SinkSchemaError, match=message):
        check_schema(schema(*cols), opts(tmp_path))


def test_topic_is_required_and_created_only_when_asked(backend: Backend) -> None:
    no_topic = parse_sink_options(backend.spark_options(), streaming=False)
    with pytest.raises(SinkSchemaError, match="no topic"):
        check_schema(schema(("value", BinaryType())), no_topic)
    check_schema(schema(("value", BinaryType()), ("topic", StringType())), no_topic)
    with pytest.raises(ConfigError, match=r"does not exist.*partitions"):
        sink.prepare_topics(opts(backend))
    if backend.is_local:
        assert not (Path(backend.url) / "t-0").exists()  # nothing written
    else:
        with pytest.raises(Exception, match="no pylog root here"):
            backend.open(read_only=True)  # nothing written: not even a first manifest
    sink.prepare_topics(opts(backend, partitions="3", **{"segment.bytes": "100000"}))
    with backend.open(read_only=True) as r:
        assert r.partitions("t") == 3 and r.config("t").segment_bytes == 100000
    check_schema(
        schema(
            ("value", StringType()),
            ("key", StringType()),
            ("partition", IntegerType()),
            ("timestamp", TimestampType()),
            ("headers", ArrayType(schema(("key", StringType()), ("value", BinaryType())))),
        ),
        opts(backend),
    )


def test_stage_publish_replay_and_partitioning(backend: Backend) -> None:
    o = opts(backend, partitions="4")
    sink.prepare_topics(o)
    keys = [f"user-{i}".encode() for i in range(50)]
    rb = pa.record_batch(
        {"key": pa.array(keys + [None] * 5), "value": pa.array([b"v%d" % i for i in range(55)])}
    )
    m0 = sink.stage_task(iter([rb.slice(0, 30)]), o, 0, 0, 0)
    m1 = sink.stage_task(iter([rb.slice(30)]), o, 0, 1, 0)
    with backend.open(read_only=True) as r:
        assert r.read_table("t").num_rows == 0  # staged data is invisible
    sink.publish(o, [m0, m1], 0)
    sink.publish(o, [m0, m1], 0)  # replayed commit: skipped
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    assert t.num_rows == 55
    keyed = t.filter(pa.compute.is_valid(t.column("key")))
    assert keyed.column("partition").to_pylist() == partition_for_keys(keyed.column("key"), 4).tolist()
    nulls = t.filter(pa.compute.is_null(t.column("key")))
    assert set(nulls.column("partition").to_pylist()) == {1 % 4}  # task 1's sticky partition
    assert staged_files(backend) == []


def test_topic_column_explicit_partitions_and_abort(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("a", 2)
        root.create_topic("b", 1)
    o = parse_sink_options({**backend.spark_options(), "checkpointLocation": "x"}, streaming=True)
    rb = pa.record_batch(
        {"topic": ["a", "b", "a"], "partition": pa.array([1, None, 0], pa.int32()), "value": ["x", "y", "z"]}
    )
    m = sink.stage_task(iter([rb]), o, 5, 0, 0)
    sink.discard(o, [m])  # abort: the staged files go, nothing is published
    sink.publish(o, [], 5)
    with backend.open(read_only=True) as r:
        assert r.read_table("a").num_rows == 0
    m = sink.stage_task(iter([rb]), o, 6, 0, 0)
    sink.publish(o, [m], 6)
    with backend.open(read_only=True) as r:
        a = r.read_table("a")
        assert sorted(zip(a.column("partition").to_pylist(), a.column("value").to_pylist(), strict=True)) == [
            (0, b"z"),
            (1, b"x"),
        ]
        assert r.read_table("b").column("value").to_pylist() == [b"y"]
    bad = pa.record_batch({"topic": ["a"], "partition": pa.array([7], pa.int32()), "value": ["x"]})
    with pytest.raises(ConfigError, match=r"7 is not in the range \[0...2\) of topic .a."):
        sink.stage_task(iter([bad]), o, 7, 0, 0)


@pytest.mark.parametrize("inline", [True, False])
def test_tasks_stage_from_the_drivers_metadata_without_reading_the_root(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, inline: bool
) -> None:
    """The writer carries the topics' partition counts and configs from the driver's planning
    to its tasks: a task opens no root and, on an object store, sends no request but its
    uploads (none when the staging travels in the commit message).  A topic created since
    the planning is looked up in the root, once."""
    from pylog.storage.backends.objectstore.client import ObjectClient

    o = opts(backend, partitions="3", **{"cleanup.policy": "compact"})
    meta = sink.prepare_topics(o)
    assert set(meta) == {"t"} and meta["t"][0] == 3 and meta["t"][1].compact
    reads: list[str] = []
    for name in ("get", "get_many", "list"):
        real = getattr(ObjectClient, name)
        monkeypatch.setattr(
            ObjectClient, name, lambda self, *a, _n=name, _r=real, **k: reads.append(_n) or _r(self, *a, **k)
        )
    opened: list[bool] = []
    real_open = sink_task.open_sink_root
    monkeypatch.setattr(
        sink_task, "open_sink_root", lambda opts, **k: opened.append(True) or real_open(opts, **k)
    )
    if not inline:
        monkeypatch.setattr(sink_task, "STAGE_INLINE_BYTES", 0)
    rb = pa.record_batch({"key": [f"k{i}" for i in range(30)], "value": [f"v{i}" for i in range(30)]})
    msgs = [sink.stage_task(iter([rb.slice(15 * t, 15)]), o, 0, t, 0, topics=meta) for t in range(2)]
    assert opened == [] and reads == []
    with pytest.raises(PylogError, match="requires keys"):  # the topic's config came along: compacted
        sink.stage_task(iter([pa.record_batch({"value": ["v"]})]), o, 0, 2, 0, topics=meta)
    sink.publish(o, msgs, 0)
    with backend.open() as w:
        w.create_topic("later", 2)
    by_column = pa.record_batch({"topic": ["later", "t"], "key": ["a", "b"], "value": ["x", "y"]})
    o2 = parse_sink_options({**backend.spark_options(), "checkpointLocation": "x"}, streaming=True)
    opened.clear()
    m = sink.stage_task(iter([by_column]), o2, 1, 0, 0, topics=meta)
    assert opened == [True]  # only for the topic the metadata did not hold
    sink.publish(o2, [m], 1)
    with backend.open(read_only=True) as r:
        assert sorted(r.read_table("t").column("value").to_pylist()) == sorted(
            [f"v{i}".encode() for i in range(30)] + [b"y"]
        )
        assert r.read_table("later").column("value").to_pylist() == [b"x"]


def test_overwrite_hides_earlier_records_and_keeps_offsets_growing(backend: Backend) -> None:
    o = opts(backend, partitions="1")
    sink.prepare_topics(o)
    sink.publish(o, [sink.stage_task(iter([pa.record_batch({"value": ["old1", "old2"]})]), o, 0, 0, 0)], 0)
    sink.publish(
        o, [sink.stage_task(iter([pa.record_batch({"value": ["new"]})]), o, 1, 0, 0)], 1, overwrite=True
    )
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    assert t.column("value").to_pylist() == [b"new"] and t.column("offset").to_pylist() == [2]
    # Spark replays the commit of batch 1 (driver restarted after the commit): nothing is
    # truncated again, nothing published twice
    m1 = sink.stage_task(iter([pa.record_batch({"value": ["new"]})]), o, 1, 0, 1)
    sink.publish(o, [m1], 1, overwrite=True)
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    assert t.column("value").to_pylist() == [b"new"] and t.column("offset").to_pylist() == [2]


@pytest.mark.parametrize("inline_limit", [sink_task.STAGE_INLINE_BYTES, 0])
def test_object_store_staging_inline_or_as_objects(
    s3_backend: Backend, monkeypatch: pytest.MonkeyPatch, inline_limit: int
) -> None:
    """Small stagings travel in the commit message (no staged object); larger ones are staged
    segments uploaded as objects (the log; indexes too unless they are small enough to be kept
    in the state, as here), which the commit adopts as the segments' files.  Either way the
    batch is published exactly once and no staged object is left that the state does not hold."""
    monkeypatch.setattr(sink_task, "STAGE_INLINE_BYTES", inline_limit)
    o = opts(s3_backend, partitions="2")
    sink.prepare_topics(o)
    rb = pa.record_batch({"key": [f"k{i}" for i in range(40)], "value": [f"v{i}" for i in range(40)]})
    msgs = [
        sink.stage_task(iter([rb.slice(0, 20)]), o, 0, 0, 0),
        sink.stage_task(iter([rb.slice(20)]), o, 0, 1, 0),
    ]
    carried = [d.get("data") is not None for m in msgs for d in m.staged]
    assert carried and all(carried) == (inline_limit > 0) and any(carried) == (inline_limit > 0)
    assert len(staged_files(s3_backend)) == (0 if inline_limit else len(carried))  # the .log objects
    sink.publish(o, msgs, 0)
    sink.publish(o, msgs, 0)  # a replay: skipped
    with s3_backend.open(read_only=True) as r:
        assert sorted(r.read_table("t").column("value").to_pylist()) == sorted(
            f"v{i}".encode() for i in range(40)
        )
    assert staged_files(s3_backend) == []


def test_the_planning_finds_a_topic_created_by_another_process_since_its_known_state(
    s3_backend: Backend,
) -> None:
    """The planning of a micro-batch starts from the state its process knows (no request); a
    topic missing there is looked up in the store before the write is refused."""
    import time

    from pylog.storage.backends.objectstore import commitlog
    from pylog.storage.backends.objectstore.storage import ObjectStorage

    with s3_backend.open() as w:
        w.create_topic("a", 1)
        assert isinstance(w.storage, ObjectStorage)
        store = w.storage.store
    known = commitlog.known(store, 60.0)
    assert known is not None
    with s3_backend.open() as other:  # another process creates the topic ...
        other.create_topic("t", 2)
    commitlog._KNOWN[store.url] = (known[0], time.monotonic())  # ... which this one does not know
    meta = sink.prepare_topics(opts(s3_backend))  # no partitions option: it must exist
    assert meta["t"][0] == 2 and "a" in meta


def test_every_run_of_a_task_stages_under_names_of_its_own(spark: object) -> None:
    """A restarted query runs its tasks again from attempt 0, while a task of the failed run
    may still be running: the attempt in a staging's name must differ between runs, or the old
    task could write into the files the new run commits."""
    sc = spark.sparkContext  # type: ignore[attr-defined]

    def attempts() -> list[int]:
        return sc.parallelize(range(4), 4).map(lambda _: sink_task.task_ids()[1]).collect()

    first, second = attempts(), attempts()
    assert len(set(first) | set(second)) == 8, (first, second)
