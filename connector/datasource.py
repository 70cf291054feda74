"""The Spark Data Source ``pylog``: ``spark.read`` / ``spark.readStream`` ``.format("pylog")``,
a drop-in for Spark's Kafka source over a pylog root (same schema, options and offsets), and
``df.write`` / ``df.writeStream`` ``.format("pylog")``.

    df = (spark.readStream.format("pylog")
          .option("path", "/data/events")            # instead of kafka.bootstrap.servers
          .option("subscribe", "clicks,views")
          .option("startingOffsets", "earliest")
          .load())

``DefaultSource`` is registered automatically by the top-level module ``pyspark_pylog``
(``spark.dataSource.register(DefaultSource)`` works too).  It only checks the options and the
schema and hands over to the readers and writers below it:

    datasource                          DefaultSource (this module)
    source | stream | sink              batch reader | micro-batch reader | writers
    scan | sink_commit | sink_task      reading a planned range | a write's commit | staging (executors)
    offsets | pushdown                  listing, resolving and splitting offsets | filter pushdown
    options | sink_options              source options | sink options, columns
    optionspec                          every option of the source and the sink, declared once

Each module imports only from the lines below its own (an import-linter contract in
pyproject.toml checks it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
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

from pylog.connector.options import SourceOptions, parse_options
from pylog.connector.sink import PylogBatchWriter, PylogStreamWriter, make_writer
from pylog.connector.source import BatchReader, PushdownBatchReader
from pylog.connector.stream import StreamReader
from pylog.storage.errors import PylogError, SourceOptionError


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


class DefaultSource(DataSource):
    """The ``pylog`` data source: batch and streaming reads, and writes (see :mod:`.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "pylog"

    def _parsed(self) -> SourceOptions:
        return parse_options(self.options)

    def schema(self) -> StructType:
        opts = self._parsed()  # invalid options fail here, at load() (a missing root when read:
        # a batch read fails naming it, a stream waits for it)
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._parsed().for_batch()
        _check_schema(schema, opts)
        return PushdownBatchReader(opts) if _planning_with_pushdown() else BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            opts = self._parsed().for_stream()
            _check_schema(schema, opts)
        except PylogError as e:
            # raised from here, the error reaches the user chained to PySpark 4.3's own
            # UnboundLocalError (its stream runner calls ``reader.stop()`` in a ``finally`` where
            # ``reader`` was never assigned): a reader that raises it from its first call instead
            return _RefusedStreamReader(e)
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> PylogBatchWriter:
        return make_writer(self.options, schema, overwrite, streaming=False)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PylogStreamWriter:
        return make_writer(self.options, schema, overwrite, streaming=True)


class _RefusedStreamReader(DataSourceStreamReader):
    """The stream reader of options refused when the query starts: every call raises why."""

    def __init__(self, error: PylogError):
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, Any]:
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        self._refuse()


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
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False
