"""Linking a staged segment (a sink commit's large staging) into a log of many segments makes no
object for the sealed segments it does not use: a commit's cost does not grow with them."""

from __future__ import annotations

from pathlib import Path

import pylog
from pylog.storage.codec import records
from pylog.storage.partition.segments import SegmentList
from pylog.storage.root import publish as pub
from pylog.storage.root.stage import open_stager


def test_a_linked_staged_segment_makes_no_sealed_segment(tmp_path: Path) -> None:
    with pylog.open(tmp_path) as root:
        root.create_topic("t", 1, {"segment.bytes": "200"})
        many = records.encode([b"x" * 80] * 200, base_offset=0, batch_bytes=100)
        root.append_batches({("t", 0): many.buffer.tobytes()})
        root.alter_config("t", {"segment.bytes": str(256 << 20)})
    with pylog.open(tmp_path) as root:
        lg = root.writable_log("t", 0)
        stager = open_stager(
            root.storage, "t", 0, pub.stage_name("q", 0, 0, 0), root.config("t"), direct=False
        )
        big = records.encode([b"v" * 100_000] * 90, base_offset=0, timestamp=1000)  # linked, not copied
        assert big.buffer.nbytes >= pub.COPY_BELOW_BYTES
        stager.write(big.buffer, big.batches)
        staged = pub.StagedFile.from_dict(stager.finish(inline=False).to_dict())
        assert root.publish("q", 0, [staged]) is not None
        assert isinstance(lg.segments, SegmentList) and len(lg.segments) > 200
        assert len(lg.segments.made()) <= 4, lg.segments
        assert root.read_table("t", start_offset=199)["offset"].to_pylist() == list(range(199, 290))
