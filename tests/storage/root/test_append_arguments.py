"""The record arguments of ``Root.append`` (storage/root/routing.py) and ``Log.append``, checked
by storage/codec/columns.py: a ``headers`` column of another type, a negative timestamp and a
naive datetime are ``ConfigError`` s naming the argument and the value, and nothing is
written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pylog
from pylog import ConfigError
from pylog.storage.codec.columns import HEADER_TYPE

UTC_2024 = datetime(2024, 1, 1, tzinfo=timezone.utc)
MS_2024 = 1_704_067_200_000


@pytest.fixture
def root(tmp_path: Path) -> Any:
    r = pylog.open(tmp_path / "root")
    r.create_topic("t", partitions=2)
    yield r
    r.close()


def _nothing_written(root: pylog.Root) -> None:
    assert root.read_table("t").num_rows == 0
    root.append("t", [b"ok"], partition=0)  # and the root stays usable
    assert root.read_table("t").num_rows == 1


HEADERS_EXPECTED = (
    r"^headers: expected one list of \(str key, bytes value\) pairs per record "
    r"\(Arrow type list<item: struct<key: string not null, value: binary>>\), got a column of "
)


@pytest.mark.parametrize(
    ("headers", "got"),
    [
        (pa.array([1, 2]), "int64"),  # named, not an AttributeError
        (pa.array([[1], [2]]), "list<item: int64>"),  # named, not an Arrow or KeyError
        (pa.array([[{"k": "a", "v": b"1"}], []]), "list<item: struct<k: string, v: binary>>"),
        (pa.array([None, None]), "null"),
    ],
)
def test_a_headers_column_of_another_type_is_named(root: pylog.Root, headers: pa.Array, got: str) -> None:
    with pytest.raises(ConfigError, match=HEADERS_EXPECTED + f"{got}$".replace("[", r"\[")):
        root.append("t", [b"a", b"b"], headers=headers, partition=0)
    with pytest.raises(ConfigError, match=HEADERS_EXPECTED):  # a table's column, all partitions
        root.append("t", pa.table({"value": [b"a", b"b"], "key": [b"1", b"2"], "headers": headers}))
    with pytest.raises(ConfigError, match=HEADERS_EXPECTED):  # the partition log's own append
        root.writable_log("t", 0).append([b"a", b"b"], headers=headers)
    _nothing_written(root)


def test_headers_columns_of_the_header_type_are_taken(root: pylog.Root) -> None:
    large = pa.large_list(pa.struct([("key", pa.large_string()), ("value", pa.large_binary())]))
    for headers in (
        pa.array([[("h", b"1")], []], pa.list_(HEADER_TYPE)),
        pa.array([[("h", b"1")], []], large),
    ):
        root.append("t", [b"a", b"b"], headers=headers, partition=0)
    got = root.read_table("t").column("headers").to_pylist()
    assert got == [[{"key": "h", "value": b"1"}], []] * 2


@pytest.mark.parametrize(
    ("timestamp", "named"),
    [
        (-5, "timestamp: -5 is before 1970-01-01"),  # refused, as Kafka's producer does
        (-1, "timestamp: -1 is before 1970-01-01"),  # Kafka's "no timestamp" of v0/v1 messages only
        ([1, -5], "timestamp: row 1 is -5, before 1970-01-01"),
        (np.array([-2, 1]), "timestamp: row 0 is -2, before 1970-01-01"),
        (pa.array([1, -3], pa.int64()), "timestamp: row 1 is -3, before 1970-01-01"),
        (datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc), "timestamp: -60000 is before 1970-01-01"),
    ],
)
def test_negative_timestamps_are_refused_as_by_kafkas_producer(
    root: pylog.Root, timestamp: Any, named: str
) -> None:
    why = r"a record timestamp is epoch milliseconds in \[0, 9223372036854775807\] \(Kafka's producer refuses"
    appends = [
        lambda: root.append("t", [b"a", b"b"], timestamp=timestamp, partition=0),
        lambda: root.writable_log("t", 1).append([b"a", b"b"], timestamp=timestamp),  # the partition log's
    ]
    if not isinstance(timestamp, int | datetime):  # a table's column, going to both partitions
        appends.append(lambda: root.append("t", pa.table({"value": [b"a", b"b"], "timestamp": timestamp})))
    for append in appends:
        with pytest.raises(ConfigError, match=f"^{named}: {why}"):
            append()
    _nothing_written(root)


def test_timestamp_zero_and_positive_ones_are_taken(root: pylog.Root) -> None:
    root.append("t", [b"a", b"b"], timestamp=[0, MS_2024], partition=0)
    root.writable_log("t", 1).append([b"c"], timestamp=0)
    ts = root.read_table("t").column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [0, MS_2024, 0]


NAIVE = r"is a datetime without tzinfo; give tzinfo=timezone.utc \(or the zone it is in\) or epoch ms"


@pytest.mark.parametrize(
    "timestamp",
    [
        datetime(2024, 1, 1),  # its zone is unknown: neither local time nor UTC is assumed
        [UTC_2024, datetime(2024, 1, 1)],
    ],
)
def test_naive_datetimes_are_refused(root: pylog.Root, timestamp: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^timestamp: datetime.datetime\(2024, 1, 1, 0, 0\) {NAIVE}"):
        root.append("t", [b"a"] * (len(timestamp) if isinstance(timestamp, list) else 1), timestamp=timestamp)
    with pytest.raises(ConfigError, match=NAIVE):
        root.writable_log("t", 0).append([b"a"], timestamp=datetime(2024, 1, 1))
    _nothing_written(root)


def test_naive_pandas_timestamps_are_refused_but_datetime64_columns_are_utc(root: pylog.Root) -> None:
    """A naive ``pandas.Timestamp`` is a naive datetime; a DataFrame's ``datetime64`` column holds
    numpy datetimes (UTC, as numpy's and Arrow's), also when pandas shows its values as naive."""
    pd = pytest.importorskip("pandas")
    with pytest.raises(ConfigError, match=rf"^timestamp: Timestamp\('2024-01-01 00:00:00'\) {NAIVE}"):
        root.append("t", [b"a"], timestamp=pd.Timestamp("2024-01-01"))
    with pytest.raises(ConfigError, match=NAIVE):  # a column of objects
        root.append(
            "t",
            pd.DataFrame(
                {"value": [b"a"], "timestamp": pd.Series([pd.Timestamp("2024-01-01")], dtype=object)}
            ),
        )
    _nothing_written(root)
    naive = pd.to_datetime(["2024-01-01"])
    for column in (naive, naive.as_unit("ms"), naive.tz_localize("UTC"), naive.tz_localize("Europe/Berlin")):
        root.append("t", pd.DataFrame({"value": [b"b"], "timestamp": column}), partition=1)
    ts = root.read_table("t", [1]).column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [MS_2024, MS_2024, MS_2024, MS_2024 - 3_600_000]


def test_datetimes_with_a_zone_and_numpy_datetimes_are_taken(root: pylog.Root) -> None:
    plus_one = UTC_2024.astimezone(timezone(timedelta(hours=1)))
    root.append("t", [b"a", b"b"], timestamp=[UTC_2024, plus_one], partition=0)
    root.append("t", [b"c"], timestamp=np.datetime64(MS_2024, "ms"), partition=0)  # numpy: UTC
    root.append("t", pa.table({"value": [b"d"], "timestamp": pa.array([MS_2024], pa.timestamp("ms"))}))
    ts = root.read_table("t").column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [MS_2024] * 4
