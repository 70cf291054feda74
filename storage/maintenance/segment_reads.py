"""How a cleaning pass reads a segment: whole chunks of complete batches, their records
located, read ahead by a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

from pylog.storage.codec import batch as B
from pylog.storage.codec import rewrite
from pylog.storage.errors import CorruptRecordError
from pylog.storage.partition.segment import Located, LogSegment


def _relative(loc: Located) -> B.BatchHeaders:
    h = loc.headers.take(slice(None))
    h.position = h.position - loc.start
    return h


def walked(
    seg: LogSegment, position: int, trusted: tuple[int, int] | None
) -> Iterator[tuple[Located, rewrite.Spans]]:
    """The segment's chunks from ``position`` with their records located."""
    for loc in read_all(seg, position):
        yield (
            loc,
            rewrite.walk(
                loc.data, _relative(loc), path=seg.log_path, base_position=loc.start, trusted=trusted
            ),
        )


T = TypeVar("T")


def prefetched(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items``, produced by a background thread at most ``depth`` ahead: reading the next
    chunk and walking its records (``pread`` and the compiled kernels release the GIL) overlaps
    with the work on the current one.  Errors are raised in the consumer; closing the iterator
    stops the thread."""
    q: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, object]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for it in items:
                if not put(("item", it)):
                    return
            put(("done", None))
        except BaseException as e:  # handed to the consumer
            put(("error", e))

    worker = threading.Thread(target=produce, name="pylog-cleaner-read", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "done":
                return
            if kind == "error":
                assert isinstance(value, BaseException)
                raise value
            yield value  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()


def read_all(seg: LogSegment, position: int) -> Iterator[Located]:
    """The segment's batches from ``position``; a tail that is not a complete batch raises
    (a segment being cleaned is never the active one, so it must end on a batch boundary)."""
    end = position
    for loc in seg.iter_batches(position):
        end = loc.start + int(loc.data.shape[0])
        yield loc
    if end != seg.size:
        raise CorruptRecordError(
            f"{seg.size - end} bytes at the end of the segment do not form a complete batch "
            "(a declared size runs past the end of the file)",
            position=end,
            path=seg.log_path,
        )


__all__ = ["prefetched", "read_all", "walked"]
