"""A stream whose root is gone after it planned offsets on it (deleted, or the query restarted
with another path): the partitions it read are data loss, as deleted topics are, never a query
that silently reads nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pylog
from pylog.connector.offsets import DataLossError
from pylog.connector.options import parse_options
from pylog.connector.stream import StreamReader


def _reader(path: Path, **kw: str) -> StreamReader:
    return StreamReader(parse_options({"path": str(path), "subscribe": "t", **kw}).for_stream())


def _make(path: Path, values: list[bytes]) -> None:
    with pylog.open(path) as r:
        r.create_topic("t", 1)
        r.append("t", pa.table({"value": values}), partition=0)


def test_offsets_of_a_root_that_is_gone_are_data_loss(tmp_path: Path) -> None:
    path = tmp_path / "root"
    _make(path, [b"a", b"b", b"c"])
    first = _reader(path)
    planned = first.latestOffset(first.initialOffset(), ReadAllAvailable())
    assert planned == {"t": {"0": 3}}
    first.stop()
    shutil.rmtree(path)

    rd = _reader(path)  # a restart: the offsets come from the checkpoint
    end = rd.latestOffset(planned, ReadAllAvailable())
    assert end != planned  # a batch runs (an unchanged offset would plan none, forever)
    with pytest.raises(DataLossError, match="t-0 are gone"):
        rd.partitions(planned, end)

    lenient = _reader(path, failOnDataLoss="false")
    end = lenient.latestOffset(planned, ReadAllAvailable())
    assert list(lenient.partitions(planned, end)) == []
    assert lenient.latestOffset(end, ReadAllAvailable()) == end  # then nothing new, no batch
    _make(path, [b"x"])  # a root made again there: its topics read from their earliest offsets
    again = lenient.latestOffset(end, ReadAllAvailable())
    assert [(p.value.start, p.value.end) for p in lenient.partitions(end, again)] == [(0, 1)]
