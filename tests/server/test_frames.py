"""The server's framing on the hot paths: Fetch responses whose records are sent from the buffers
they were read into (protocol.Splices), and request frames received straight into their own
buffers (broker.FrameProtocol)."""

from __future__ import annotations

import asyncio
import random
import struct
import time
from typing import Any

import pyarrow.compute as pc
import pytest

pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")

from kio.schema.errors import ErrorCode

from pylog.server import protocol
from pylog.server.broker import RECEIVE_BUFFER, FrameProtocol, FrameReader
from pylog.server.fetch import SPLICE_MIN, PartitionRead, _response


def reads(sizes: dict[tuple[str, int], int]) -> list[PartitionRead]:
    rng = random.Random(1)
    return [
        PartitionRead(topic, p, ErrorCode.none, 10, 10, 0, memoryview(rng.randbytes(n)), None)
        for (topic, p), n in sizes.items()
    ]


@pytest.mark.parametrize("version", [4, 11, 12])  # (v13+: topic ids, answered unknown)
def test_a_spliced_fetch_response_is_the_encoded_response_byte_for_byte(version: int) -> None:
    got = reads({("a", 0): SPLICE_MIN, ("b", 1): 100, ("a", 1): 3 * SPLICE_MIN + 1, ("b", 0): 0})
    mod = protocol.response_module(1, version)
    header = protocol.RequestHeader(1, version, 77, "c", 0)
    body = _response(mod, got)
    assert isinstance(body, protocol.Spliced) and len(body.splices.data) == 2
    parts = protocol.encode_frame(header, body)
    assert isinstance(parts, list)
    want = protocol.encode_response(header, _plain(mod, got))
    assert b"".join(parts) == want
    assert struct.unpack(">i", want[:4])[0] == len(want) - 4
    # the records go out as the buffers they were read into, not copies
    assert any(p is r.records for p in parts for r in got if len(r.records) >= SPLICE_MIN)


def _plain(mod: object, got: list[PartitionRead]) -> object:
    """The response of ``got`` with every record set copied into it (no placeholders)."""
    import pylog.server.fetch as F

    old, F.SPLICE_MIN = F.SPLICE_MIN, 1 << 62
    try:
        body = _response(mod, got)
    finally:
        F.SPLICE_MIN = old
    assert not isinstance(body, protocol.Spliced)
    return body


def test_small_records_are_not_spliced() -> None:
    mod = protocol.response_module(1, 12)
    assert not isinstance(_response(mod, reads({("a", 0): SPLICE_MIN - 1})), protocol.Spliced)


def frames_of(sizes: list[int]) -> tuple[list[bytes], bytes]:
    rng = random.Random(2)
    frames = [rng.randbytes(n) for n in sizes]
    return frames, b"".join(struct.pack(">i", len(f)) + f for f in frames)


def receive(stream: bytes, chunks: list[int]) -> FrameReader:
    """``stream`` through a FrameProtocol as the transport would hand it in ``chunks``."""
    reader = FrameReader()
    proto = FrameProtocol(reader, lambda r, w: None)
    pos, i = 0, 0
    while pos < len(stream):
        buf = proto.get_buffer(-1)
        n = min(len(buf), chunks[i % len(chunks)], len(stream) - pos)
        i += 1
        buf[:n] = stream[pos : pos + n]
        proto.buffer_updated(n)
        pos += n
    return reader


@pytest.mark.parametrize("chunks", [[1], [7, 3, 1000], [65536], [RECEIVE_BUFFER], [1 << 22]])
def test_frames_are_received_whole_whatever_the_chunks(chunks: list[int]) -> None:
    sizes = [8, 100, RECEIVE_BUFFER - 4, RECEIVE_BUFFER - 3, RECEIVE_BUFFER, 3 * RECEIVE_BUFFER + 5, 9, 8]
    frames, stream = frames_of(sizes)

    async def run() -> list[bytes]:
        reader = receive(stream, chunks)
        reader.feed_eof()
        got = [bytes(await reader.read_frame()) for _ in frames]
        with pytest.raises(asyncio.IncompleteReadError):
            await reader.read_frame()
        return got

    assert asyncio.run(run()) == frames


@pytest.mark.parametrize("bad", [0, 7, protocol.MAX_FRAME + 1, -1])
def test_a_bad_frame_size_ends_the_reading_after_the_frames_before_it(bad: int) -> None:
    frames, stream = frames_of([20, 30])

    async def run() -> None:
        reader = receive(stream + struct.pack(">i", bad) + b"x" * 50, [13])
        assert [bytes(await reader.read_frame()) for _ in frames] == frames
        with pytest.raises(protocol.ProtocolError, match="a frame of"):
            await reader.read_frame()

    asyncio.run(run())


def test_fetches_of_segment_file_ranges_return_every_record_once(serve: Any) -> None:
    """Fetches of local segments go out as file ranges (sendfile): cut at index entries inside a
    segment (``max.partition.fetch.bytes`` below a segment) and at segment ends (rolls every
    ~1 MiB), and the records read are those appended, each once, in order."""
    ck = pytest.importorskip("confluent_kafka")
    import pylog

    n, size = 6000, 700
    serve.stop()  # (the root's writer lock)
    with pylog.open(serve.root) as root:
        root.create_topic("ranges", 2, {"segment.bytes": 1 << 20, "max.message.bytes": 16384})
        for i in range(0, n, 500):  # batches of ~16 KiB, each an index entry, ~70 a segment
            values = [b"%06d" % j + bytes(size - 6) for j in range(i, i + 500)]
            root.append("ranges", values, partition=(i // 500) % 2)
        want = root.read_table("ranges")
    serve.start()
    c = ck.Consumer(
        {
            "bootstrap.servers": serve.bootstrap,
            "group.id": "ranges",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 200_000,
            "fetch.max.bytes": 1 << 20,
        }
    )
    c.assign([ck.TopicPartition("ranges", p, 0) for p in range(2)])
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        for m in c.consume(100, timeout=1.0):
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.value()))
    c.close()
    assert len(got) == n
    by_partition = {p: [(o, v) for q, o, v in got if q == p] for p in range(2)}
    for p in range(2):
        rows = want.filter(pc.equal(want.column("partition"), p))
        assert by_partition[p] == list(
            zip(rows.column("offset").to_pylist(), rows.column("value").to_pylist(), strict=True)
        )


@pytest.mark.parametrize("limit", [50_000, 200_000, 1 << 20])
def test_a_file_range_is_whole_batches_from_the_offset_within_the_limit(tmp_path: Any, limit: int) -> None:
    import numpy as np

    import pylog
    from pylog.server.fetch import _file_range
    from pylog.server.protocol import FileRange
    from pylog.storage.codec import batch as B

    with pylog.open(tmp_path / "root") as root:
        root.create_topic("ranges", 1, {"segment.bytes": 1 << 20, "max.message.bytes": 16384})
        for i in range(0, 3000, 500):
            root.append("ranges", [b"%06d" % j + bytes(694) for j in range(i, i + 500)], partition=0)
        lg, hw = root.log("ranges", 0), 3000
        offset, ranges = 0, 0
        while offset < hw:
            got = _file_range(lg, offset, limit, hw)
            assert got is not None  # (every segment is below the high watermark)
            if not isinstance(got, FileRange):  # a segment's tail under SPLICE_MIN: its bytes
                data = bytes(got)
                assert len(data) < SPLICE_MIN
            else:
                ranges += 1
                with got.file:
                    got.file.seek(got.offset)
                    data = got.file.read(got.count)
                assert len(data) == got.count <= limit
            buf = np.frombuffer(data, np.uint8)
            scan = B.scan_entries(buf, allow_torn_tail=False)
            h = B.parse_headers(buf, scan.position, scan.size, scan.magic)
            assert scan.end == len(data) and int(h.base_offset[0]) <= offset <= int(h.last_offset[0])
            offset = int(h.last_offset[-1]) + 1
        assert ranges >= 3
        # not below the high watermark, or past the limit with its first batch: read instead
        assert _file_range(lg, 0, limit, 10) is None
        assert _file_range(lg, 0, 100, hw) is None
