"""A root that does not exist yet: a stream waits for it, as Kafka's subscribe to a topic that does
not exist; a batch read is an error naming the path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pylog.storage.errors import NoRootError
from tests.conftest import Backend
from tests.connector.source_helpers import Collector, reader, start_stream


def test_a_stream_of_a_root_that_does_not_exist_yet_reads_its_topics_as_they_appear(
    spark: Any, backend: Backend, tmp_path: Path
) -> None:
    """The README's Quickstart starts a reader right after a sink that creates the root as it
    starts: the reader loads, reads nothing until the root exists (a local directory, or an
    object-store prefix with a commit), then every record of the topic (partitions that appear
    after the query started are read from their earliest offsets, as Kafka does), and a
    partition added later."""
    later = backend.child("made-later")
    c = Collector()
    q = start_stream(spark, later, tmp_path / "ck", c, subscribe="t")  # startingOffsets: latest
    try:
        q.processAllAvailable()
        assert c.rows() == []
        with pytest.raises(NoRootError):  # the reader created nothing
            later.open(read_only=True)
        with later.open() as r:
            r.create_topic("t", partitions=2)
            r.append("t", pa.table({"value": [b"a", b"b"]}), partition=0)
            r.append("t", pa.table({"value": [b"c"]}), partition=1)
        q.processAllAvailable()
        assert sorted(c.values()) == [b"a", b"b", b"c"]
        with later.open() as r:
            r.add_partitions("t", 1)
            r.append("t", pa.table({"value": [b"d"]}), partition=2)
        q.processAllAvailable()
        assert sorted((r[1], bytes(r[3])) for r in c.rows()) == [(0, b"a"), (0, b"b"), (1, b"c"), (2, b"d")]
    finally:
        q.stop()


def test_a_batch_read_of_a_missing_root_fails_naming_it(spark: Any, tmp_path: Path) -> None:
    """A Python data source is not told at load() whether it is read as a batch or a stream, so
    the batch read fails when it is planned."""
    df = reader(spark, tmp_path / "missing", stream=False, subscribe="t")
    with pytest.raises(Exception, match=f"option path: '{tmp_path / 'missing'}' is not a directory"):
        df.collect()
