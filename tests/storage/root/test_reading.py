"""The Python API's reads (``pylog.storage.root.reading``): offset and time ranges, streamed batches,
pandas, bad arguments, and the broker-written Kafka fixtures read exactly.

Every test but the Kafka fixture ones (broker log dirs copied to disk) runs on local disk and on
S3 (tests/conftest.py); the data the range tests read is written once per module and backend."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog.storage.errors import ConfigError, CorruptRecordError, OffsetOutOfRangeError, PylogError
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition.log import Log
from pylog.storage.root import reading
from pylog.storage.root.manager import TABLE_SCHEMA, Root
from tests.conftest import BUCKET, Backend
from tests.kafka_fixtures import b64, expected_records, manifest_logs, require_fixtures

T0 = 1_700_000_000_000
TOPIC = "events"
PARTITIONS = 3
SMALL_LOGS = {"segment.bytes": 2048, "index.interval.bytes": 128}  # many segments and index entries


def _fill(where: Backend, timestamps: np.ndarray, *, chunk: int = 37) -> None:
    """``len(timestamps)`` keyed records with headers, appended ``chunk`` at a time (many batches),
    as one transaction (an object store then has the segments local disk has, not one per append)."""
    n = len(timestamps)
    headers = [[{"key": "i", "value": b"%d" % i}] if i % 3 == 0 else [] for i in range(n)]

    def appends(root: Root) -> None:
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            root.append(
                TOPIC,
                pa.table(
                    {
                        "key": [b"key-%d" % (i % 11) for i in range(lo, hi)],
                        "value": [b"value-%d" % i for i in range(lo, hi)],
                        "timestamp": pa.array(timestamps[lo:hi], pa.timestamp("ms")),
                        "headers": pa.array(headers[lo:hi], TABLE_SCHEMA.field("headers").type),
                    }
                ),
            )

    with where.open() as root:
        root.create_topic(TOPIC, PARTITIONS, config=SMALL_LOGS)
        root.transaction(lambda: appends(root))


def _module_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Backend:
    """A root shared by the tests of this module: ``backend`` of tests/conftest.py, module-scoped."""
    if request.param == "local":
        return Backend("local", str(tmp_path_factory.mktemp(name)))
    server = request.getfixturevalue("s3_server")
    return Backend("s3", f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}", dict(server.options), server)


@pytest.fixture(scope="module", params=["local", "s3"])
def ordered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    """600 records whose timestamps grow with their offsets (a few equal neighbours)."""
    where = _module_backend(request, tmp_path_factory, "ordered")
    _fill(where, T0 + (np.arange(600) // 2) * 10)
    return where


@pytest.fixture(scope="module", params=["local", "s3"])
def shuffled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    """600 records whose timestamps go back and forth (Kafka does not order them)."""
    where = _module_backend(request, tmp_path_factory, "shuffled")
    rng = np.random.default_rng(7)
    _fill(where, T0 + rng.integers(0, 3000, 600) + np.arange(600) * 2)
    return where


@pytest.fixture(params=["reader", "writer"])
def open_root(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Open a root as a reader (no lock: the logs are opened read-only) or as its writer (once
    per test: hypothesis's examples share it)."""
    roots: dict[str, Root] = {}

    def opener(where: Backend) -> Root:
        if where.url not in roots:
            roots[where.url] = where.open(read_only=request.param == "reader")
            if request.param == "writer":
                roots[where.url].writable_log(TOPIC, 0)  # the writer: logs recovered, writable
        return roots[where.url]

    yield opener
    for root in roots.values():
        root.close()


def _partition(t: pa.Table, p: int) -> pa.Table:
    return t.filter(pa.compute.equal(t.column("partition"), p))


def _first_at_or_after(
    ts: np.ndarray, offsets: np.ndarray, target: int | None, default: int, leo: int
) -> int:
    if target is None:
        return default
    hit = np.nonzero(ts >= target)[0]
    return int(offsets[hit[0]]) if hit.size else leo


def brute_force(full: pa.Table, start_ts: int | None, end_ts: int | None) -> pa.Table:
    """The rows of a time range by its definition: per partition, from the first offset whose
    timestamp is >= start to the first offset whose timestamp is >= end (exclusive)."""
    parts = []
    for p in range(PARTITIONS):
        t = _partition(full, p)
        offsets = t.column("offset").to_numpy()
        ts = t.column("timestamp").cast(pa.int64()).to_numpy()
        leo = int(offsets[-1]) + 1 if len(offsets) else 0

        lo = _first_at_or_after(ts, offsets, start_ts, 0, leo)
        hi = _first_at_or_after(ts, offsets, end_ts, leo, leo)
        parts.append(t.filter(pa.array((offsets >= lo) & (offsets < hi))))
    return pa.concat_tables(parts)


# --------------------------------------------------------------------------- time ranges

time_points = st.one_of(st.none(), st.integers(T0 - 100, T0 + 4500))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=time_points, end=time_points)
def test_time_range_equals_brute_force(shuffled: Backend, open_root: Any, start: Any, end: Any) -> None:
    root = open_root(shuffled)
    if start is not None and end is not None and end < start:
        start, end = end, start
    full = root.read_table(TOPIC)
    got = root.read_table(TOPIC, start_timestamp=start, end_timestamp=end)
    assert got.equals(brute_force(full, start, end))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=time_points, end=time_points)
def test_ordered_time_range_is_a_timestamp_filter(
    ordered: Backend, open_root: Any, start: Any, end: Any
) -> None:
    """With timestamps in offset order, a time range holds exactly the records of that time."""
    root = open_root(ordered)
    if start is not None and end is not None and end < start:
        start, end = end, start
    full = root.read_table(TOPIC)
    ts = full.column("timestamp").cast(pa.int64()).to_numpy()
    keep = np.ones(len(ts), bool)
    if start is not None:
        keep &= ts >= start
    if end is not None:
        keep &= ts < end
    got = root.read_table(TOPIC, start_timestamp=start, end_timestamp=end)
    assert got.equals(full.filter(pa.array(keep)))


def test_time_range_mixes_with_offsets_and_partitions(shuffled: Backend) -> None:
    root = shuffled.open(read_only=True)
    full = root.read_table(TOPIC)
    start = T0 + 900
    got = root.read_table(TOPIC, [2, 0], start_timestamp=start, end_offset=150)
    want = brute_force(full, start, None)
    want = pa.concat_tables([_partition(want, 2), _partition(want, 0)])
    assert got.equals(want.filter(pa.compute.less(want.column("offset"), 150)))
    # a start after every record reads nothing; an end before every record too
    assert root.read_table(TOPIC, start_timestamp=T0 + 10**9).num_rows == 0
    assert root.read_table(TOPIC, end_timestamp=T0 - 1).num_rows == 0
    assert root.read_table(TOPIC, start_offset=20, end_timestamp=T0 - 1).num_rows == 0


def test_timestamps_as_datetimes(ordered: Backend) -> None:
    root = ordered.open(read_only=True)
    want = root.read_table(TOPIC, start_timestamp=T0 + 1000, end_timestamp=T0 + 2000)
    assert want.num_rows == 200
    aware = datetime.fromtimestamp(T0 / 1000, timezone.utc)
    berlin = aware.astimezone(timezone(timedelta(hours=1)))
    for lo, hi in [
        (aware + timedelta(seconds=1), aware + timedelta(seconds=2)),
        (berlin + timedelta(seconds=1), berlin + timedelta(seconds=2)),
        (np.datetime64(T0 + 1000, "ms"), np.datetime64((T0 + 2000) * 1000, "us")),
        (np.int64(T0 + 1000), np.int64(T0 + 2000)),
    ]:
        assert root.read_table(TOPIC, start_timestamp=lo, end_timestamp=hi).equals(want), (lo, hi)
    pd = pytest.importorskip("pandas")
    got = root.read_table(
        TOPIC, start_timestamp=pd.Timestamp(T0 + 1000, unit="ms", tz="UTC"), end_timestamp=T0 + 2000
    )
    assert got.equals(want)


def test_offsets_behave_as_before(ordered: Backend) -> None:
    """Without timestamps: all records from the log start, a start below it starts there, the
    end is exclusive and capped at the log end offset."""
    root = ordered.open(read_only=True)
    full = root.read_table(TOPIC)
    assert full.num_rows == 600 and full.schema == TABLE_SCHEMA
    for p in range(PARTITIONS):
        leo = root.log(TOPIC, p).log_end_offset
        assert _partition(full, p).column("offset").to_pylist() == list(range(leo))
    got = root.read_table(TOPIC, start_offset=0, end_offset=10_000)
    assert got.equals(full)
    got = root.read_table(TOPIC, [1], start_offset=10, end_offset=20)
    assert got.column("offset").to_pylist() == list(range(10, 20))
    leo = root.log(TOPIC, 1).log_end_offset
    assert root.read_table(TOPIC, [1], start_offset=leo).num_rows == 0
    assert "headers" not in root.read_table(TOPIC, include_headers=False).column_names


def test_ranges_start_at_the_log_start_offset_after_retention(backend: Backend) -> None:
    old = T0 - 30 * 86_400_000  # a month before ``now``: due for deletion under retention.ms
    _fill(backend, np.concatenate([np.full(300, old), np.full(30, T0)]))
    with backend.open() as root:
        root.alter_config(TOPIC, {"retention.ms": 86_400_000})
        maintain(root, now=T0, compaction=False)
    root = backend.open(read_only=True)
    starts = {p: root.log(TOPIC, p).log_start_offset for p in range(PARTITIONS)}
    assert any(s > 0 for s in starts.values()), "retention deleted no segment"
    full = root.read_table(TOPIC)
    for p, s in starts.items():
        assert _partition(full, p).column("offset").to_pylist()[0] == s
    assert root.read_table(TOPIC, start_offset=0).equals(full)
    assert root.read_table(TOPIC, start_timestamp=old).equals(full)  # no earlier offset exists
    assert pa.Table.from_batches(list(root.read_batches(TOPIC, start_timestamp=0))).equals(full)
    assert root.read_table(TOPIC, start_timestamp=T0).num_rows == 30


# --------------------------------------------------------------------------- streamed batches


ranges = st.fixed_dictionaries(
    {},
    optional={
        "start_offset": st.integers(0, 230),
        "end_offset": st.integers(0, 240),
        "start_timestamp": st.integers(T0 - 10, T0 + 4000),
        "end_timestamp": st.integers(T0 - 10, T0 + 4000),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bounds=ranges,
    partitions=st.one_of(st.none(), st.lists(st.integers(0, PARTITIONS - 1), max_size=4)),
    max_records=st.integers(1, 500),
    include_headers=st.booleans(),
)
def test_batches_concatenate_to_the_table(
    shuffled: Backend,
    open_root: Any,
    bounds: dict[str, int],
    partitions: Any,
    max_records: int,
    include_headers: bool,
) -> None:
    root = open_root(shuffled)
    if "start_offset" in bounds and "start_timestamp" in bounds:
        del bounds["start_timestamp"]
    if "end_offset" in bounds and "end_timestamp" in bounds:
        del bounds["end_offset"]
    for a, b in [("start_offset", "end_offset"), ("start_timestamp", "end_timestamp")]:
        if a in bounds and b in bounds and bounds[b] < bounds[a]:
            bounds[a], bounds[b] = bounds[b], bounds[a]
    kwargs: dict[str, Any] = {**bounds, "include_headers": include_headers}
    try:
        want = root.read_table(TOPIC, partitions, **kwargs)
    except OffsetOutOfRangeError:
        with pytest.raises(OffsetOutOfRangeError):
            root.read_batches(TOPIC, partitions, max_records=max_records, **kwargs)
        return
    batches = list(root.read_batches(TOPIC, partitions, max_records=max_records, **kwargs))
    assert all(0 < b.num_rows <= max_records for b in batches)
    assert all(b.schema == want.schema for b in batches)
    got = pa.Table.from_batches(batches, schema=want.schema)
    assert got.equals(want)


def test_batches_are_read_a_bounded_amount_at_a_time(
    ordered: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming never reads the whole range at once: nothing is read before the first batch is
    asked for, one fetch of ``max_bytes`` per step after, and Log.read_table is not used."""
    root = ordered.open(read_only=True)
    want = root.read_table(TOPIC)
    fetched: list[int] = []
    original = Log.iter_record_sets

    def counting(self: Log, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for rs in original(self, *args, **kwargs):
            fetched.append(rs.records.num_rows)
            yield rs

    def forbidden(*args: Any, **kwargs: Any) -> pa.Table:
        raise AssertionError("read_batches materialized a whole partition")

    monkeypatch.setattr(Log, "iter_record_sets", counting)
    monkeypatch.setattr(Log, "read_table", forbidden)
    it = reading.read_batches(root, TOPIC, max_records=16, max_bytes=512)
    assert fetched == []
    first = next(it)
    assert first.num_rows <= 16 and len(fetched) == 1
    assert fetched[0] < 100, "one fetch of 512 bytes holds a few batches of 37 records at most"
    rest = list(it)
    assert len(fetched) > 10
    assert pa.Table.from_batches([first, *rest]).equals(want)
    assert max(b.num_rows for b in rest) <= 16


def test_batches_fix_their_range_when_called(backend: Backend) -> None:
    """Records appended while the batches are consumed are not read (the end is fixed)."""
    with backend.open() as root:
        root.create_topic(TOPIC, 1)
        root.append(TOPIC, [b"%d" % i for i in range(100)])
        it = root.read_batches(TOPIC, max_records=10)
        first = next(it)
        root.append(TOPIC, [b"late"] * 50)
        rows = first.num_rows + sum(b.num_rows for b in it)
        assert rows == 100
        assert root.read_table(TOPIC).num_rows == 150


def test_batches_of_an_empty_range_and_topic(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("empty", 2)
        assert list(root.read_batches("empty")) == []
        assert root.read_table("empty").schema == TABLE_SCHEMA
        assert root.read_table("empty").num_rows == 0
        assert root.read_table("empty", []).num_rows == 0
        assert root.read_table("empty", start_timestamp=0, end_timestamp=T0).num_rows == 0


# --------------------------------------------------------------------------- pandas


def test_to_pandas(ordered: Backend) -> None:
    pytest.importorskip("pandas")
    root = ordered.open(read_only=True)
    df = root.to_pandas(TOPIC, [1], start_timestamp=T0 + 1000, end_timestamp=T0 + 2000)
    want = root.read_table(TOPIC, [1], start_timestamp=T0 + 1000, end_timestamp=T0 + 2000)
    assert list(df.columns) == TABLE_SCHEMA.names
    assert len(df) == want.num_rows > 0
    assert df["offset"].tolist() == want.column("offset").to_pylist()
    assert df["value"].tolist() == want.column("value").to_pylist()
    assert (df["partition"] == 1).all() and (df["topic"] == TOPIC).all()
    assert str(df["timestamp"].dtype) == "datetime64[ms, UTC]"
    assert df["timestamp"].min() >= datetime.fromtimestamp((T0 + 1000) / 1000, timezone.utc)
    assert "headers" not in root.to_pandas(TOPIC, include_headers=False).columns


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"start_offset": 1, "start_timestamp": T0}, ConfigError, "start_offset or start_timestamp, not"),
        ({"end_offset": 1, "end_timestamp": T0}, ConfigError, "end_offset or end_timestamp, not both"),
        ({"start_offset": 10, "end_offset": 5}, ConfigError, "end_offset 5 is before start_offset 10"),
        ({"start_timestamp": T0 + 5, "end_timestamp": T0}, ConfigError, "end_timestamp .* before start_"),
        ({"start_timestamp": -1}, ConfigError, "start_timestamp must not be before 1970"),
        ({"end_timestamp": "yesterday"}, ConfigError, "end_timestamp must be millis.* str 'yesterday'"),
        ({"start_timestamp": True}, ConfigError, "start_timestamp must be milliseconds since the epoch"),
        ({"start_timestamp": 1.5}, ConfigError, "start_timestamp must be milliseconds .* float"),
        ({"start_timestamp": np.datetime64("NaT")}, ConfigError, "start_timestamp must be a time"),
        ({"start_offset": "earliest"}, ConfigError, "start_offset must be an integer offset, got str"),
        ({"end_offset": 2.0}, ConfigError, "end_offset must be an integer offset, got float"),
        # a negative offset is refused, not read from the log start (or as nothing); a naive
        # datetime is refused, not guessed to be UTC or local time
        ({"start_offset": -5}, ConfigError, "^start_offset must be an offset >= 0, got -5"),
        ({"end_offset": -1}, ConfigError, "^end_offset must be an offset >= 0, got -1"),
        (
            {"start_timestamp": datetime(2024, 1, 1)},
            ConfigError,
            r"^start_timestamp: datetime.datetime\(2024, 1, 1, 0, 0\) is a datetime without tzinfo; give "
            "tzinfo=timezone.utc",
        ),
        ({"end_timestamp": datetime(2024, 1, 1)}, ConfigError, "^end_timestamp: .* without tzinfo"),
        ({"partitions": [0, 7]}, ConfigError, "partition 7 is out of range for topic 'events' \\(0..2\\)"),
        ({"partitions": 1}, ConfigError, "partitions must be a sequence of partition numbers, got 1"),
        ({"partitions": ["0"]}, ConfigError, "partition numbers must be integers, got str '0'"),
        ({"start_offset": 10_000}, OffsetOutOfRangeError, "start_offset 10000 is out of range \\[0, \\d+\\]"),
        ({"topic": "nope"}, PylogError, "unknown topic 'nope' .*; topics: events"),
    ],
)
def test_bad_arguments_are_refused_clearly(
    ordered: Backend, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    root = ordered.open(read_only=True)
    args = dict(kwargs)
    topic = args.pop("topic", TOPIC)
    partitions = args.pop("partitions", None)
    with pytest.raises(error, match=match):
        root.read_table(topic, partitions, **args)
    with pytest.raises(error, match=match):  # at the call, before any batch is asked for
        root.read_batches(topic, partitions, **args)
    with pytest.raises(error, match=match):
        root.to_pandas(topic, partitions, **args)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_bad_batch_sizes(ordered: Backend, bad: Any) -> None:
    root = ordered.open(read_only=True)
    with pytest.raises(ConfigError, match="max_records must be a positive integer"):
        root.read_batches(TOPIC, max_records=bad)
    with pytest.raises(ConfigError, match="max_bytes must be a positive integer"):
        reading.read_batches(root, TOPIC, max_bytes=bad)


# --------------------------------------------------------------------------- Kafka fixtures

FIXTURES = [e for e in manifest_logs() if not e["expected_corrupt"]]
CORRUPT = [e for e in manifest_logs() if e["expected_corrupt"]]


def _broker_dir(root: Path, entry: dict[str, Any], topic: str) -> None:
    """A fixture laid out as a Kafka log dir in ``root`` (copied at test time only)."""
    src = require_fixtures() / entry["log"]
    part = root / f"{topic}-{entry['partition']}"
    part.mkdir(parents=True)
    shutil.copy(src, part / src.name)


def test_kafka_fixtures_read_exactly(tmp_path: Path) -> None:
    """Every broker-written fixture (message formats v0-v2, gzip,
    snappy) read through ``pylog.open(...).read_table`` gives exactly its expected records,
    every column; ``read_batches`` gives the same rows."""
    require_fixtures()
    topics = {f"f{i}-{e['topic']}": e for i, e in enumerate(FIXTURES)}
    for topic, entry in topics.items():
        _broker_dir(tmp_path, entry, topic)
    root = pylog.open(tmp_path, read_only=True)
    assert root.topics() == sorted(topics)
    for topic, entry in topics.items():
        where = entry["log"]
        t = root.read_table(topic, [entry["partition"]])
        assert t.schema == TABLE_SCHEMA
        exp = expected_records(entry)
        assert t.num_rows == entry["records"] == len(exp), where
        assert t.column("offset").to_pylist() == [e["offset"] for e in exp], where
        assert t.column("key").to_pylist() == [b64(e["key_b64"]) for e in exp], where
        assert t.column("value").to_pylist() == [b64(e["value_b64"]) for e in exp], where
        assert t.column("timestamp").cast(pa.int64()).to_pylist() == [e["timestamp"] for e in exp], where
        assert t.column("timestampType").to_pylist() == [e["timestamp_type"] for e in exp], where
        assert t.column("headers").to_pylist() == [
            [{"key": k, "value": b64(v)} for k, v in e["headers"]] for e in exp
        ], where
        assert set(t.column("topic").to_pylist()) == {topic}, where
        assert set(t.column("partition").to_pylist()) == {entry["partition"]}, where
        assert root.read_table(topic).equals(t), where  # the fixture's partition is the topic's only one
        streamed = list(root.read_batches(topic, max_records=5))
        assert pa.Table.from_batches(streamed, schema=TABLE_SCHEMA).equals(t), where


def test_kafka_fixture_with_a_bad_crc_is_refused(tmp_path: Path) -> None:
    require_fixtures()
    if not CORRUPT:
        pytest.skip("the fixture set has no corrupt log")
    for i, entry in enumerate(CORRUPT):
        _broker_dir(tmp_path / str(i), entry, entry["topic"])
        root = pylog.open(tmp_path / str(i), read_only=True)
        with pytest.raises(CorruptRecordError, match="CRC mismatch"):
            root.read_table(entry["topic"])
        with pytest.raises(CorruptRecordError, match="CRC mismatch"):
            list(root.read_batches(entry["topic"]))


def test_a_table_appended_is_read_back_identically(backend: Backend) -> None:
    """What ``append`` takes in Spark's columns comes back unchanged, headers and all."""
    with backend.open() as root:
        root.create_topic("t", 2)
        table = pa.table(
            {
                "key": [b"a", None, b"c"],
                "value": [b"1", b"2", None],
                "timestamp": pa.array([T0, T0 + 1, T0 - 5], pa.timestamp("ms")),
                "headers": pa.array(
                    [[{"key": "h", "value": b"x"}, {"key": "g", "value": None}], [], []],
                    TABLE_SCHEMA.field("headers").type,
                ),
                "partition": pa.array([1, 1, 1], pa.int32()),
            }
        )
        root.append("t", table)
        got = root.read_table("t", [1])
        for name in ("key", "value", "headers", "partition"):
            assert got.column(name).to_pylist() == table.column(name).to_pylist(), name
        assert got.column("timestamp").cast(pa.int64()).to_pylist() == [T0, T0 + 1, T0 - 5]
        assert got.column("offset").to_pylist() == [0, 1, 2]
        assert root.read_table("t", [1], start_timestamp=T0 + 1).column("offset").to_pylist() == [1, 2]
