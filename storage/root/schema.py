"""The table a root's records are read as: the columns of Spark's Kafka source.

:meth:`Root.read_table <pylog.storage.root.manager.Root.read_table>`, its streamed variant and
the Spark source all give these columns, in this order.
"""

from __future__ import annotations

import pyarrow as pa

from pylog.storage.codec import records

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
TABLE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field("headers", records.RECORD_SCHEMA.field("headers").type),
    ]
)
"""Columns of :meth:`Root.read_table`: those of Spark's Kafka source, in its order."""


_CONSTANT_ROWS = 1 << 16
_constants: dict[tuple[object, pa.DataType], pa.Array] = {}


def constant_column(value: object, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of ``value``: a slice of one array built once per value (for up to 65,536
    rows, about an 8 MiB record set of small records; each record set would otherwise build
    the same topic and partition columns again)."""
    if n > _CONSTANT_ROWS or (isinstance(value, str) and len(value) > 64):  # long names: not kept
        return pa.repeat(pa.scalar(value, type_), n)
    key = (value, type_)
    built = _constants.get(key)
    if built is None:
        if len(_constants) >= 32:  # many topics or partitions read in one process: start again
            _constants.clear()
        built = _constants[key] = pa.repeat(pa.scalar(value, type_), _CONSTANT_ROWS)
    return built.slice(0, n)


def kafka_columns(t: pa.Table, topic: str, partition: int) -> pa.Table:
    """Decoded records of one partition (``records.RECORD_SCHEMA``) as Spark's Kafka source
    columns (:data:`TABLE_SCHEMA`), without a Python object per row (the Spark source uses it too)."""
    n = t.num_rows
    return pa.Table.from_arrays(
        [
            t.column("key"),
            t.column("value"),
            constant_column(topic, pa.string(), n),
            constant_column(partition, pa.int32(), n),
            t.column("offset"),
            t.column("timestamp").cast(TIMESTAMP_TYPE),
            t.column("timestampType"),
            t.column("headers"),
        ],
        schema=TABLE_SCHEMA,
    )
