"""The executor's half of the source without Spark: reading a planned range into Arrow batches
(gaps, control records, aborted transactions, data loss, timestamps)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

import pylog
from pylog.connector.datasource import spark_schema
from pylog.connector.scan import ReadTask, arrow_schema, read_task
from pylog.storage.codec import records
from pylog.storage.errors import DataLossError
from tests.conftest import Backend
from tests.connector.source_helpers import T0, append, append_at, control_batch, delete_topic, publish, value


def rows(task: ReadTask) -> list[tuple[int, bytes]]:
    batches = list(read_task(task, fetch_bytes=1 << 10))  # small fetches: many record sets
    for b in batches:
        assert b.schema == arrow_schema(task.include_headers) and b.num_rows > 0
    t = pa.Table.from_batches(batches, schema=arrow_schema(task.include_headers))
    return list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))


def task(backend: Backend, start: int, end: int, **kw: object) -> ReadTask:
    return ReadTask(
        path=backend.url,
        topic="t",
        partition=0,
        start=start,
        end=end,
        storage_options=backend.options,
        **kw,  # type: ignore[arg-type]
    )


def test_arrow_schema_is_sparks() -> None:
    for headers in (False, True):
        assert arrow_schema(headers).equals(to_arrow_schema(spark_schema(headers), timezone="UTC"))


def test_rows_and_columns(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", 1)
        root.append(
            "t",
            pa.table(
                {
                    "key": [b"k", None],
                    "value": [b"v", None],
                    "timestamp": pa.array([T0, T0 + 1], pa.timestamp("ms")),
                    "headers": pa.array(
                        [[{"key": "h", "value": b"x"}], []],
                        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                    ),
                }
            ),
        )
    (b,) = read_task(task(backend, 0, 2, include_headers=True))
    stamps = b.column("timestamp").to_pylist()
    assert b.to_pylist() == [
        {"key": b"k", "value": b"v", "topic": "t", "partition": 0, "offset": 0,
         "timestamp": stamps[0], "timestampType": 0, "headers": [{"key": "h", "value": b"x"}]},
        {"key": None, "value": None, "topic": "t", "partition": 0, "offset": 1,
         "timestamp": stamps[1], "timestampType": 0, "headers": []},
    ]  # fmt: skip
    assert b.column("timestamp").cast(pa.int64()).to_pylist() == [T0 * 1000, (T0 + 1) * 1000]


def test_gaps_control_records_and_ranges_without_visible_records(backend: Backend) -> None:
    """Compaction gaps and transaction markers are skipped silently (checklist E39)."""
    with backend.open() as root:
        root.create_topic("t", 1)
        append_at(root, "t", 0, [0, 1, 2, 3, 4, 10, 11, 30])
        control_batch(root, "t", 0, 31, producer_id=9, commit=True)
        append_at(root, "t", 0, [40, 41, 42])
    visible = [0, 1, 2, 3, 4, 10, 11, 30, 40, 41, 42]
    assert rows(task(backend, 0, 43)) == [(o, value("t", 0, o)) for o in visible]
    for lo, hi in [(5, 10), (12, 30), (31, 32), (32, 40), (31, 40), (43, 43)]:  # nothing visible
        assert rows(task(backend, lo, hi)) == []
    # ranges cut batches in the middle: exactly the offsets asked for, and the same on a re-read
    assert [o for o, _ in rows(task(backend, 2, 11))] == [2, 3, 4, 10]
    assert rows(task(backend, 3, 41)) == rows(task(backend, 3, 41))


def test_data_loss_below_the_log_start_and_beyond_the_log_end(backend: Backend) -> None:
    """Retention under a planned range (E36/E40) and a log that ends early (E37)."""
    with backend.open() as root:
        root.create_topic("t", 1, config={"segment.bytes": 500})
        append(root, "t", 0, 100, chunk=10)

        def retain() -> int:
            lg = root.writable_log("t", 0)
            assert len(lg.segments) > 3
            lg.delete_segments(lg.segments[:2])
            return lg.log_start_offset

        first = root.transaction(retain)
    assert first > 0
    with pytest.raises(DataLossError, match=f"t-0: offsets \\[0, {first}\\) .* are gone: the log starts at"):
        list(read_task(task(backend, 0, 50)))
    got = rows(task(backend, 0, 50, fail_on_data_loss=False))
    assert [o for o, _ in got] == list(range(first, 50))  # what is left, nothing outside the range
    assert rows(task(backend, 0, first - 1, fail_on_data_loss=False)) == []  # the whole range is gone
    with pytest.raises(DataLossError, match=r"planned but the log now ends at offset 100"):
        list(read_task(task(backend, 90, 120)))
    assert [o for o, _ in rows(task(backend, 90, 120, fail_on_data_loss=False))] == list(range(90, 100))
    with backend.open() as root:
        delete_topic(root, "t")
    with pytest.raises(DataLossError, match="t-0 does not exist any more"):
        list(read_task(task(backend, 90, 100)))
    assert list(read_task(task(backend, 90, 100, fail_on_data_loss=False))) == []


def test_segments_deleted_while_reading_are_looked_up_again(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("t", 1, config={"segment.bytes": 500})
        append(root, "t", 0, 100, chunk=10)
        it = read_task(task(backend, 0, 100, fail_on_data_loss=False), fetch_bytes=200)
        first = next(it)

        def retain() -> None:
            lg = root.writable_log("t", 0)
            lg.delete_segments(lg.segments[:3])
            lg.delete_pending(force=True)

        root.transaction(retain)
        rest = list(it)
    offsets = first.column("offset").to_pylist() + [o for b in rest for o in b.column("offset").to_pylist()]
    assert offsets == sorted(set(offsets)) and offsets[-1] == 99  # in order, no duplicates


def test_pushed_down_timestamp_bounds_cut_rows(backend: Backend) -> None:
    stamps = [T0 + 5, T0 + 1, T0 + 9, T0 + 3, T0 + 7]  # not monotonic (CreateTime)
    with backend.open() as root:
        root.create_topic("t", 1)
        append(root, "t", 0, 5, ts=stamps)
    got = rows(task(backend, 0, 5, min_timestamp=T0 + 3, max_timestamp=T0 + 8))
    assert [o for o, _ in got] == [0, 3, 4]


def test_timestamp_out_of_sparks_range_is_a_clear_error(backend: Backend) -> None:
    """A producer that wrote nanoseconds as milliseconds (SPARK-56243, checklist D34)."""
    with backend.open() as root:
        root.create_topic("t", 1)
        append(root, "t", 0, 2, ts=[T0, T0 * 1_000_000])
    with pytest.raises(
        pylog.PylogError, match=f"t-0 offset 1: record timestamp {T0 * 1_000_000} is out of the"
    ):
        list(read_task(task(backend, 0, 2)))


def test_read_committed_hides_aborted_and_open_transactions(backend: Backend) -> None:
    def txn(root: pylog.Root, offsets: list[int], pid: int) -> None:
        def write() -> None:
            enc = records.encode(
                pa.array([value("t", 0, o) for o in offsets]),
                timestamp=T0 + np.array(offsets),
                base_offset=offsets[0],
                is_transactional=True,
                producer_id=pid,
                producer_epoch=0,
            )
            root.writable_log("t", 0).append_batches(enc.tobytes(), assign_offsets=False)
            publish(root, "t", 0)

        root.transaction(write)

    with backend.open() as root:
        root.create_topic("t", 1)
        append_at(root, "t", 0, [0, 1])
        txn(root, [2, 3], pid=5)
        control_batch(root, "t", 0, 4, producer_id=5, commit=False)  # aborted
        txn(root, [5, 6], pid=6)
        control_batch(root, "t", 0, 7, producer_id=6, commit=True)  # committed
        txn(root, [8], pid=7)  # still open: beyond the last stable offset
    assert [o for o, _ in rows(task(backend, 0, 8, isolation_level="read_committed"))] == [0, 1, 5, 6]
    assert [o for o, _ in rows(task(backend, 0, 9))] == [0, 1, 2, 3, 5, 6, 8]
