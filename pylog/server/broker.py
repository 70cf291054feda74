"""``pylog serve``: one process that is a single-node Kafka cluster for one root.

Node 0 leads every partition and coordinates every group.  The network side is one asyncio
event loop.  A connection's requests run one at a time, in the order they arrived, as on a
Kafka broker (which reads a connection's next request once it answered the last): a commit, a
join and an offset fetch of one consumer happen in its order.  The one exception is a run of
Produce requests: each is queued for the group commit as soon as it is read, so a producer's
pipelined requests share commits; a request of another kind waits until they are answered.
Responses are written in the order the requests arrived.  Every storage call runs on the
store's one thread (:mod:`~pylog.server.store`), so the loop never blocks on a disk or an
object store.

Frames that cannot be requests (a size below a header or above ``MAX_FRAME``, a truncated or
unparseable body, an API this server does not speak) close their connection, as a Kafka broker
does; an ApiVersions request of an unknown version gets KIP-511's v0 answer listing what is
supported.  A handler's unexpected error is logged and closes its connection; the server goes on.

Stopping (SIGTERM, SIGINT): no new connections; requests already read are answered (appends in
the queue committed first), then the root is closed cleanly (checkpoints, the clean-shutdown
marker).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pylog.server import cluster, fetch, groups, offsets, produce, protocol, records
from pylog.server.context import Request
from pylog.server.node import Node
from pylog.server.protocol import FRAME, MAX_FRAME, Frame, ProtocolError
from pylog.storage.root.manager import Root

log = logging.getLogger("pylog.server")

Handler = Callable[[Node, Request], Awaitable[Any]]
"""An API's handler: the response body, or None for no response (Produce with acks=0)."""

HANDLERS: dict[int, Handler] = {
    0: produce.handle_produce,
    1: fetch.handle_fetch,
    2: fetch.handle_list_offsets,
    3: cluster.handle_metadata,
    8: offsets.handle_offset_commit,
    9: offsets.handle_offset_fetch,
    10: cluster.handle_find_coordinator,
    11: groups.handle_join_group,
    12: groups.handle_heartbeat,
    13: groups.handle_leave_group,
    14: groups.handle_sync_group,
    15: groups.handle_describe_groups,
    16: groups.handle_list_groups,
    18: cluster.handle_api_versions,
    19: cluster.handle_create_topics,
    22: produce.handle_init_producer_id,
    23: fetch.handle_offset_for_leader_epoch,
    32: cluster.handle_describe_configs,
}
"""The one router: api key -> handler (protocol.SUPPORTED lists their versions)."""

STOP_TIMEOUT_S = 30.0
"""How long a stop waits for the connections to answer what they read."""

PRODUCE = 0
"""The API key of Produce: the one request that may run before the ones read ahead of it end."""

MAX_IN_FLIGHT = 64
"""Requests of one connection read ahead of their responses (Kafka clients send at most 5)."""


@dataclass
class Metrics:
    """Request counts and latencies since start, and connections (``--metrics``)."""

    requests: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    errors: int = 0
    connections: int = 0
    open_connections: int = 0
    closed_for_bad_frames: int = 0

    def line(self) -> str:
        parts = [
            f"{name}={n} ({1000 * self.seconds[name] / n:.1f} ms avg)"
            for name, n in sorted(self.requests.items())
        ]
        return (
            f"connections open={self.open_connections} total={self.connections} "
            f"bad_frames={self.closed_for_bad_frames} errors={self.errors}; " + ", ".join(parts)
        )


class Broker(Node):
    """The server of one root (see the module docstring)."""

    def __init__(self, root: Root, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.metrics = Metrics()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._readers: dict[asyncio.Task[None], asyncio.StreamReader] = {}
        self._background: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.store.call(self.root.become_writer)
        await self.committed.load()
        self._server = await asyncio.get_running_loop().create_server(
            lambda: FrameProtocol(FrameReader(), self._serve_connection), self.host, self.port, backlog=1024
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        if self.advertised_host in ("0.0.0.0", "::", ""):
            self.advertised_host = "127.0.0.1"
        self._background.append(asyncio.create_task(self.store.call(records.warm_up)))
        self._background.append(asyncio.create_task(self.store.periodic()))
        self._background.append(asyncio.create_task(self.coordinator.expire_loop()))

    def stop(self) -> None:
        """Begin a clean stop (safe from a signal handler)."""
        self.stopping.set()

    async def wait_stopped(self) -> None:
        await self.stopping.wait()
        log.info("stopping: no new connections; answering the requests in flight")
        if self._server is not None:
            self._server.close()
        # answer what was read: long-polling fetches answer now, the connections read no more
        # requests and end after the responses to those they read
        self.store.wake([], every=True)
        for reader in self._readers.values():
            reader.feed_eof()
        if self._connections:
            _, late = await asyncio.wait(set(self._connections), timeout=STOP_TIMEOUT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.store.drain()
        await asyncio.get_running_loop().run_in_executor(None, self.store.close)
        log.info("stopped: the root was closed cleanly")

    # ------------------------------------------------------------------ connections

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._readers[task] = reader
        self.metrics.connections += 1
        self.metrics.open_connections += 1
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if peer else "unknown"
        queue: asyncio.Queue[asyncio.Task[Frame | None] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send(queue, writer))
        in_flight: dict[asyncio.Task[Frame | None], bool] = {}  # task -> is a Produce
        try:
            assert isinstance(reader, FrameReader)
            while not self.stopping.is_set():
                frame = await reader.read_frame()
                produce = len(frame) >= 2 and frame[0] == 0 and frame[1] == PRODUCE
                if in_flight and not (produce and all(in_flight.values())):
                    await asyncio.wait(list(in_flight))  # requests run one at a time (see above)
                request = self._dispatch(frame, host)
                in_flight[request] = produce
                request.add_done_callback(lambda t: in_flight.pop(t, None))
                await queue.put(request)
                if sender.done():
                    break
        except ProtocolError as e:
            self.metrics.closed_for_bad_frames += 1
            log.info("closing the connection of %s: %s", host, e)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            try:
                if not sender.done():
                    await queue.put(None)  # the sender writes what is queued, then ends
                    await sender
            except BaseException:
                sender.cancel()
            _abandon(queue)  # what was read after the sender ended
            writer.close()
            with contextlib.suppress(BaseException):  # (a reset peer, or a cancelled stop)
                await writer.wait_closed()
            self.metrics.open_connections -= 1
            self._connections.discard(task)
            self._readers.pop(task, None)

    async def _send(
        self, queue: asyncio.Queue[asyncio.Task[Frame | None] | None], writer: asyncio.StreamWriter
    ) -> None:
        """Write the responses in request order; a request that closes the connection ends it
        (the requests read after it are abandoned: not answered, their errors not logged)."""
        try:
            while True:
                task = await queue.get()
                if task is None:
                    return
                try:
                    data = await task
                except ProtocolError as e:
                    self.metrics.closed_for_bad_frames += 1
                    log.info("closing a connection: %s", e)
                    writer.transport.abort()
                    return
                except Exception:
                    self.metrics.errors += 1
                    log.exception("closing a connection after an unexpected error")
                    writer.transport.abort()
                    return
                if data is not None:
                    try:
                        await _write(writer, data)
                    except ConnectionError:  # the peer is gone
                        return
        finally:
            _abandon(queue)  # frees the queue: the reading side never waits on it

    def _dispatch(self, frame: bytes | memoryview, host: str) -> asyncio.Task[Frame | None]:
        return asyncio.create_task(self._handle(memoryview(frame).toreadonly(), host))

    async def _handle(self, frame: memoryview, host: str) -> Frame | None:
        header = protocol.read_header(frame)
        name = protocol.api_name(header.api_key)
        if not protocol.supported(header):
            if header.api_key == protocol.API_VERSIONS:  # KIP-511: answer in v0 with the ranges
                return cluster.unsupported_api_versions(header)
            raise ProtocolError(f"{name} v{header.api_version} is not supported")
        body = protocol.parse_request(header, frame)
        t0 = time.perf_counter()
        handler = HANDLERS[header.api_key]
        result: Any = await handler(self, Request(header, body, host))
        self.metrics.requests[name] += 1
        self.metrics.seconds[name] += time.perf_counter() - t0
        if result is None:
            return None
        return protocol.encode_frame(header, result)


RECEIVE_BUFFER = 256 << 10
"""Frames up to this size are received into one buffer per connection and copied out of it;
larger ones straight into their own."""
QUEUED_FRAME_BYTES = 64 << 20
"""A connection stops reading while this much of its frames wait to be handled."""


class FrameReader(asyncio.StreamReader):
    """A connection's request frames (without their size), as :class:`FrameProtocol` receives
    them; EOF and errors as a StreamReader's (``feed_eof`` ends :meth:`read_frame` after the
    frames already received)."""

    def __init__(self) -> None:
        super().__init__(limit=MAX_FRAME)
        self.frames: collections.deque[bytes | memoryview] = collections.deque()
        self.queued = 0
        self.paused: asyncio.BaseTransport | None = None
        self._waiting: asyncio.Future[None] | None = None

    def feed_frame(self, frame: bytes | memoryview) -> None:
        self.frames.append(frame)
        self.queued += len(frame)
        self._wake()

    def feed_eof(self) -> None:
        super().feed_eof()
        self._wake()

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def read_frame(self) -> bytes | memoryview:
        """The next frame; raises the connection's error, or IncompleteReadError at its end."""
        while not self.frames:
            exc = self.exception()
            if exc is not None:
                raise exc
            if self.at_eof():
                raise asyncio.IncompleteReadError(b"", None)
            self._waiting = asyncio.get_running_loop().create_future()
            await self._waiting
        frame = self.frames.popleft()
        self.queued -= len(frame)
        if self.paused is not None and self.queued <= QUEUED_FRAME_BYTES // 2:
            transport, self.paused = self.paused, None
            if isinstance(transport, asyncio.ReadTransport) and not transport.is_closing():
                transport.resume_reading()
        return frame


class FrameProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """Receives a connection's frames (asyncio's StreamReader would copy each byte twice more, a
    third of the server's time when producers send megabytes): small ones into one buffer they
    are copied out of, large ones straight into a buffer of their own, which the handler gets.
    A size below a request header or above ``MAX_FRAME`` ends the reading with a
    :class:`ProtocolError` (the connection is closed, as Kafka does).  Writing is the
    StreamReaderProtocol's (``asyncio.StreamWriter``)."""

    def __init__(self, reader: FrameReader, connected: Callable[..., Any]) -> None:
        super().__init__(reader, connected)
        self._frames = reader
        self._head = bytearray(RECEIVE_BUFFER)
        self._have = 0
        self._large: memoryview | None = None
        self._filled = 0
        self._receiving: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._receiving = transport
        super().connection_made(transport)

    def _pause(self) -> None:
        if isinstance(self._receiving, asyncio.ReadTransport) and not self._receiving.is_closing():
            self._receiving.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._filled :]
        return memoryview(self._head)[self._have :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._filled += nbytes
            if self._filled == len(self._large):
                frame, self._large = self._large, None
                self._frames.feed_frame(frame)
        else:
            self._have += nbytes
            self._split()
        if self._frames.queued > QUEUED_FRAME_BYTES and self._frames.paused is None:
            self._frames.paused = self._receiving
            self._pause()

    def _split(self) -> None:
        head, have, pos = self._head, self._have, 0
        while have - pos >= FRAME.size:
            (size,) = FRAME.unpack_from(head, pos)
            if size < protocol.HEADER_FIXED.size or size > MAX_FRAME:
                self._frames.set_exception(
                    ProtocolError(f"a frame of {size} bytes (allowed: 8 to {MAX_FRAME})")
                )
                self._pause()
                self._have = 0
                return
            start = pos + FRAME.size
            if have - start >= size:
                self._frames.feed_frame(bytes(head[start : start + size]))
                pos = start + size
                continue
            if FRAME.size + size > len(head):  # too large for the buffer: into its own
                frame = np.empty(size, np.uint8).data  # (not zeroed; large: huge pages)
                frame[: have - start] = head[start:have]
                self._large, self._filled, pos = frame, have - start, have
            break
        if pos:
            head[: have - pos] = head[pos:have]
            self._have = have - pos

    def data_received(self, data: bytes) -> None:  # pragma: no cover - a BufferedProtocol's
        raise AssertionError("FrameProtocol receives with get_buffer")


SEND_SLICE = 1 << 20
"""A large part of a response frame is handed to the socket this much at a time."""


async def _write(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Send one response frame.  A frame in parts (a Fetch response's records, see
    :class:`~pylog.server.protocol.Splices`) is never joined: a part that is a range of a segment
    file goes out with ``sendfile``; other large parts a slice at a time, each handed to the
    socket once the transport's buffer is empty, so the kernel copies them straight from the
    buffers the log was read into (asyncio's transport keeps a copy of whatever the socket does
    not take at once)."""
    if isinstance(frame, bytes):
        writer.write(frame)
        await writer.drain()
        return
    writer.transport.set_write_buffer_limits(high=0)  # drain() waits for an empty buffer
    try:
        for part in frame:
            if isinstance(part, protocol.FileRange):
                await writer.drain()
                await asyncio.get_running_loop().sendfile(
                    writer.transport, part.file, part.offset, part.count
                )
                part.close()
            elif len(part) <= SEND_SLICE:
                writer.write(part)
            else:
                view = memoryview(part)
                for i in range(0, len(view), SEND_SLICE):
                    await writer.drain()
                    writer.write(view[i : i + SEND_SLICE])
        await writer.drain()
    finally:
        for part in frame:
            if isinstance(part, protocol.FileRange):
                part.close()


def _abandon(queue: asyncio.Queue[asyncio.Task[Frame | None] | None]) -> None:
    """Drop the requests queued on a connection that ends: they run to their end unanswered, and
    their errors (bad frames after the one that closed the connection) are retrieved, not logged
    by asyncio as never retrieved."""
    while not queue.empty():
        task = queue.get_nowait()
        if task is not None:
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[Frame | None]) -> None:
    if not task.cancelled():
        task.exception()


async def run(broker: Broker, *, metrics_interval_s: float | None = None, ready: Any = None) -> None:
    """Start ``broker``, stop it on SIGTERM / SIGINT, and return once it stopped cleanly."""
    await broker.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, broker.stop)
    if ready is not None:
        ready(broker)
    ticker: asyncio.Task[None] | None = None
    if metrics_interval_s:
        ticker = asyncio.create_task(_metrics(broker, metrics_interval_s))
    await broker.wait_stopped()
    if ticker is not None:
        ticker.cancel()


async def _metrics(broker: Broker, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        st = broker.store.stats
        log.info(
            "metrics: %s; store commits=%d appends=%d bytes=%d commit_ms=%d maintenance_runs=%d "
            "maintenance_ms=%d",
            broker.metrics.line(),
            st.commits,
            st.appends,
            st.bytes_appended,
            round(st.commit_seconds * 1000),
            st.maintenance_runs,
            round(st.maintenance_seconds * 1000),
        )
