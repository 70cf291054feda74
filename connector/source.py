"""``spark.read.format("pylog")``: the batch reader of the ``pylog`` source.

:class:`BatchReader` plans one fixed range per topic-partition -- from the starting to the
ending offsets, narrowed by pushed-down filters (:mod:`.pushdown`) and split by
``minPartitions`` / ``maxRecordsPerPartition`` -- when the query is planned, and reads each
range with :func:`~pylog.connector.scan.read_task`.  The data source that creates it is
:class:`pylog.connector.datasource.DefaultSource`; the streaming reader is :mod:`.stream`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from pylog.connector.offsets import (
    OffsetRange,
    RootView,
    check_given_offsets,
    check_path,
    ending_offsets,
    initial_spec,
    listing,
    resolve,
    split_ranges,
)
from pylog.connector.options import SourceOptions
from pylog.connector.pushdown import Bounds, push_filters
from pylog.connector.scan import ReadTask, read_task, task_for
from pylog.connector.workers import on_task_start
from pylog.storage.errors import PylogError


class BatchReader(DataSourceReader):
    """``spark.read.format("pylog")``: one fixed range per topic-partition (split further by
    ``minPartitions`` / ``maxRecordsPerPartition``), resolved when the query is planned."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.bounds = Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in plan_batch(self.opts, self.bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        on_task_start()
        if isinstance(partition.value, ReadTask):  # Spark reads one empty partition when there are none
            yield from read_task(partition.value)


class PushdownBatchReader(BatchReader):
    """A :class:`BatchReader` that takes filters on topic, partition, offset and timestamp."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.bounds, rest = push_filters(self.bounds, filters)
        yield from rest


def plan_batch(opts: SourceOptions, bounds: Bounds | None = None) -> list[ReadTask]:
    """The tasks of a batch read: starting to ending offsets of every selected topic-partition,
    narrowed by pushed-down filters, split by minPartitions / maxRecordsPerPartition.  A local
    root that does not exist is an error naming the path (a stream waits for it instead)."""
    check_path(opts.path)
    bounds = bounds or Bounds()
    view = RootView(opts.path, opts.storage_options, opts.isolation_level)
    try:
        tps = listing(view, opts.subscription)
        starts = initial_spec(opts.starting, tps, default="earliest", subscription=opts.subscription)
        ends = ending_offsets(opts, view, tps)
        read = [tp for tp in tps if bounds.allows(*tp)]  # (partitions filtered out are not checked)
        starts_beyond = check_given_offsets(opts.starting, view, read, opts.fail_on_data_loss)
        ends.update(check_given_offsets(opts.ending, view, read, opts.fail_on_data_loss))
        ranges = []
        for tp in read:
            start = resolve(view, tp, starts[tp], strategy=opts.timestamp_strategy)
            end = ends[tp]
            if tp in starts_beyond:  # reported, and failOnDataLoss is false: nothing to read there
                start = end = min(start, end)
            if start > end:
                raise PylogError(
                    f"beginning offset {start} is after the ending offset {end} for {tp[0]}-{tp[1]}: the "
                    "starting options (startingOffsets, startingTimestamp, startingOffsetsByTimestamp) "
                    "give a later position than the ending ones"
                )
            start, end = bounds.offsets(start, end)
            if bounds.timestamp_lo is not None and start < end:
                found = view.offset_for_timestamp(tp, bounds.timestamp_lo)  # no earlier offset qualifies
                start = end if found is None else max(start, min(found, end))
            if (
                bounds.timestamp_lo is not None
                and bounds.timestamp_hi is not None
                and bounds.timestamp_lo >= bounds.timestamp_hi
            ):
                continue
            ranges.append(OffsetRange(tp[0], tp[1], start, end))
        ranges = split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
        return [task_for(opts, r, bounds.timestamp_lo, bounds.timestamp_hi) for r in ranges]
    finally:
        view.close()
