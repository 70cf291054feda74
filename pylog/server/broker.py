"""``pylog serve``: one process that is a single-node Kafka cluster for one root.

Node 0 leads every partition and coordinates every group.  The network side is one asyncio
event loop: each connection reads frames as they come and hands each request to its handler
as a task, so a producer's pipelined requests reach the group commit together; responses are
written in the order the requests arrived, as Kafka requires.  Every storage call runs on the
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
import contextlib
import logging
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pylog.server import cluster, fetch, groups, offsets, produce, protocol
from pylog.server.context import Request
from pylog.server.node import Node
from pylog.server.protocol import FRAME, MAX_FRAME, ProtocolError
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
        self._server = await asyncio.start_server(
            self._serve_connection, self.host, self.port, backlog=1024, limit=MAX_FRAME
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        if self.advertised_host in ("0.0.0.0", "::", ""):
            self.advertised_host = "127.0.0.1"
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
        queue: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send(queue, writer))
        try:
            while not self.stopping.is_set():
                prefix = await reader.readexactly(FRAME.size)
                (size,) = FRAME.unpack(prefix)
                if size < protocol.HEADER_FIXED.size or size > MAX_FRAME:
                    raise ProtocolError(f"a frame of {size} bytes (allowed: 8 to {MAX_FRAME})")
                frame = await reader.readexactly(size)
                await queue.put(self._dispatch(frame, host))
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
        self, queue: asyncio.Queue[asyncio.Task[bytes | None] | None], writer: asyncio.StreamWriter
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
                        writer.write(data)
                        await writer.drain()
                    except ConnectionError:  # the peer is gone
                        return
        finally:
            _abandon(queue)  # frees the queue: the reading side never waits on it

    def _dispatch(self, frame: bytes, host: str) -> asyncio.Task[bytes | None]:
        return asyncio.create_task(self._handle(memoryview(frame), host))

    async def _handle(self, frame: memoryview, host: str) -> bytes | None:
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
        return protocol.encode_response(header, result)


def _abandon(queue: asyncio.Queue[asyncio.Task[bytes | None] | None]) -> None:
    """Drop the requests queued on a connection that ends: they run to their end unanswered, and
    their errors (bad frames after the one that closed the connection) are retrieved, not logged
    by asyncio as never retrieved."""
    while not queue.empty():
        task = queue.get_nowait()
        if task is not None:
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[bytes | None]) -> None:
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
            "metrics: %s; store commits=%d appends=%d bytes=%d",
            broker.metrics.line(),
            st.commits,
            st.appends,
            st.bytes_appended,
        )
