"""The Spark Data Source ``pylog``: ``spark.read`` / ``spark.readStream`` ``.format("pylog")``,
a drop-in for Spark's Kafka source over a pylog root (same schema, options and offsets).

    df = (spark.readStream.format("pylog")
          .option("path", "/data/events")            # instead of kafka.bootstrap.servers
          .option("subscribe", "clicks,views")
          .option("startingOffsets", "earliest")
          .load())

``DefaultSource`` is registered automatically by the top-level module ``pyspark_pylog``
(``spark.dataSource.register(DefaultSource)`` works too).  Options: :mod:`.options`; offsets
and admission control: :mod:`.offsets` and :mod:`.stream`; reading: :mod:`.scan`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pylog.connector.offsets import (
    OffsetRange,
    RootView,
    check_path,
    ending_offsets,
    initial_spec,
    resolve,
    split_ranges,
)
from pylog.connector.options import SourceOptions, Subscription, parse_options
from pylog.connector.pushdown import Bounds, push_filters
from pylog.connector.scan import ReadTask, read_task
from pylog.connector.sink import SinkMixin
from pylog.storage.errors import PylogError, SourceOptionError, UnknownTopicError

TopicPartition = tuple[str, int]


def spark_schema(include_headers: bool = False) -> StructType:
    """Spark's Kafka source schema (``headers`` only with ``includeHeaders=true``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def check_isolation(level: str) -> None:
    """read_committed needs transaction-aware reads from the storage layer (issue #4)."""
    if level == "read_committed" and not read_committed_supported():
        raise SourceOptionError(
            "option isolationLevel: read_committed is not supported yet: this version of pylog's storage "
            "cannot hide aborted transactions; valid values: read_uncommitted"
        )


def read_committed_supported() -> bool:
    try:
        from pylog.storage.partition import transactions
    except ImportError:
        return False
    return all(
        hasattr(transactions, f) for f in ("last_stable_offset", "aborted_transactions", "aborted_batches")
    )


class DefaultSource(SinkMixin, DataSource):
    """The ``pylog`` data source: batch and streaming reads, and writes (see :mod:`sink`)."""

    @classmethod
    def name(cls) -> str:
        return "pylog"

    def _parsed(self) -> SourceOptions:
        return parse_options(self.options)

    def schema(self) -> StructType:
        opts = self._parsed()  # invalid options fail here, at load()
        check_path(opts.path)
        check_isolation(opts.isolation_level)
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._parsed().for_batch()
        _check_schema(schema, opts)
        return PushdownBatchReader(opts) if _planning_with_pushdown() else BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pylog.connector.stream import StreamReader

        opts = self._parsed().for_stream()
        _check_schema(schema, opts)
        return StreamReader(opts)


def _check_schema(schema: StructType, opts: SourceOptions) -> None:
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise SourceOptionError(
            f"the pylog source has a fixed schema ({expected.simpleString()}) and cannot be given a "
            "custom one "
            f"({schema.simpleString()}); remove .schema(...) (includeHeaders=true adds the headers column)"
        )


def _planning_with_pushdown() -> bool:
    """Whether Spark creates this reader to push filters down.

    Spark refuses a reader that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true, and does not tell the data source the
    setting; it calls ``reader()`` from its pushdown worker only when the setting is on."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


# ============================================================================ batch


class BatchReader(DataSourceReader):
    """``spark.read.format("pylog")``: one fixed range per topic-partition (split further by
    ``minPartitions`` / ``maxRecordsPerPartition``), resolved when the query is planned."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.bounds = Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in plan_batch(self.opts, self.bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition.value, ReadTask):  # Spark reads one empty partition when there are none
            yield from read_task(partition.value)


class PushdownBatchReader(BatchReader):
    """A :class:`BatchReader` that takes filters on topic, partition, offset and timestamp."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.bounds, rest = push_filters(self.bounds, filters)
        yield from rest


def plan_batch(opts: SourceOptions, bounds: Bounds | None = None) -> list[ReadTask]:
    """The tasks of a batch read: starting to ending offsets of every selected topic-partition,
    narrowed by pushed-down filters, split by minPartitions / maxRecordsPerPartition."""
    bounds = bounds or Bounds()
    view = RootView(opts.path, opts.storage_options, opts.isolation_level)
    try:
        tps = listing(view, opts.subscription)
        starts = initial_spec(opts.starting, tps, default="earliest", subscription=opts.subscription)
        ends = ending_offsets(opts, view, tps)
        ranges = []
        for tp in tps:
            if not bounds.allows(*tp):
                continue
            start = resolve(view, tp, starts[tp], strategy=opts.timestamp_strategy)
            end = ends[tp]
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
        return [task_for(opts, r, bounds) for r in ranges]
    finally:
        view.close()


def task_for(opts: SourceOptions, r: OffsetRange, bounds: Bounds | None = None) -> ReadTask:
    return ReadTask(
        path=opts.path,
        topic=r.topic,
        partition=r.partition,
        start=r.start,
        end=r.end,
        fail_on_data_loss=opts.fail_on_data_loss,
        include_headers=opts.include_headers,
        isolation_level=opts.isolation_level,
        min_timestamp=None if bounds is None else bounds.timestamp_lo,
        max_timestamp=None if bounds is None else bounds.timestamp_hi,
        storage_options=opts.storage_options,
    )


def listing(view: RootView, subscription: Subscription) -> list[TopicPartition]:
    """The topic-partitions to read now; with ``assign`` every one of them must exist."""
    tps = view.topic_partitions(subscription)
    if subscription.kind == "assign":
        missing = [tp for tp in subscription.assignment if tp not in tps]
        if missing:
            root = view.root
            detail = "; ".join(
                f"{t}-{p} ("
                + (f"{t} has {root.partitions(t)} partitions" if t in root.topics() else "no such topic")
                + ")"
                for t, p in missing
            )
            raise UnknownTopicError(
                f"option assign: topic-partitions that do not exist in {view.path}: {detail}"
            )
    return tps
