"""``pylog dump``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments) for segment files.

Output follows Kafka's ``core/src/main/scala/kafka/tools/DumpLogSegments.scala`` line for
line (index mismatches go to stderr after all files, as there).  Where Kafka would die with a
stack trace (a corrupt entry, a missing file, a failed sanity check) one line naming the file
goes to stderr and the next file is dumped.  Not supported: producer ``.snapshot`` and KRaft
``.checkpoint`` files (ignored as unknown), decoder classes, and the JSON form of KRaft
control records (printed as ``controlType: NAME(id)``).

This module reads the files, checks indexes against their ``.log`` and collects the problems;
the lines printed for the batches and records of a ``.log`` are made by
:mod:`pylog.tools.dump_lines`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.codec.batch import BatchHeaders, as_uint8
from pylog.storage.errors import CorruptIndexError, CorruptRecordError, DumpError, PylogError
from pylog.storage.partition.index import OffsetIndex, TimeIndex
from pylog.storage.partition.txnindex import TxnIndex
from pylog.tools.dump_lines import (
    HEADER_SIZE_UP_TO_MAGIC,
    INT32_MAX,
    Chunks,
    OffsetTracker,
    batch_line,
    record_lines,
    scan_log,
)

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
_NUMERIC = re.compile(r"[+-]?\d+")


@dataclass
class _Problems:
    """Verification results that Kafka prints to stderr after all files, keyed by absolute path."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    failed: bool = False

    def print(self, err: TextIO) -> None:
        w = err.write
        for name, pairs in self.index_mismatches.items():
            w(f"Mismatches in :{name}\n")
            for index_offset, log_offset in reversed(pairs):  # Kafka prepends to a List
                w(f"  Index offset: {index_offset}, log offset: {log_offset}\n")
        for name, pairs in self.time_mismatches.items():
            w(f"Found timestamp mismatch in :{name}\n")
            for index_ts, log_ts in pairs:
                w(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}\n")
        for name, pairs in self.time_out_of_order.items():
            w(f"Found out of order timestamp in :{name}\n")
            for index_ts, prev_ts in pairs:
                w(f"  Index timestamp: {index_ts}, Previously indexed timestamp: {prev_ts}\n")
        for pairs in self.time_not_found.values():
            w("The following indexed offsets are not found in the log.\n")
            for index_offset, log_offset in pairs:
                w(f"Indexed offset: {index_offset}, found log offset: {log_offset}\n")
        for name, pairs in self.non_consecutive.items():
            w(f"Non-consecutive offsets in {name}\n")
            for first, second in reversed(pairs):
                w(f"  {first} is followed by {second}\n")


@dataclass
class _Options:
    print_data_log: bool
    deep: bool
    verify_only: bool
    sanity_only: bool
    max_bytes: int
    max_message_size: int
    skip_record_metadata: bool
    out: TextIO
    err: TextIO
    problems: _Problems


def dump(
    paths: list[str],
    *,
    print_data_log: bool = False,
    verify_index_only: bool = False,
    index_sanity_check: bool = False,
    deep_iteration: bool = False,
    max_bytes: int = INT32_MAX,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    skip_record_metadata: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Dump ``.log``, ``.index``, ``.timeindex`` and ``.txnindex`` files as Kafka's tool does.

    ``paths`` are OS paths.  ``print_data_log`` implies ``deep_iteration``; ``max_bytes``
    limits how much of each ``.log`` is read; ``max_message_size`` bounds the batch an
    ``.index`` entry may point at.

    Returns the exit status, Kafka's where Kafka's tool completes: 0 when every file was
    dumped, including a ``.log`` with batches whose CRC does not match (printed
    ``isvalid: false``) or with invalid bytes at its end (a torn tail: ``Found N invalid bytes
    at the end of <file>`` on stdout, after the complete entries), and non-consecutive offsets
    (which compaction produces).  1 where Kafka's tool dies: a file missing or unreadable, an
    entry whose header is corrupt, a failed ``--index-sanity-check``; and, as a check of
    pylog's own, when an index does not match its ``.log`` (the mismatches Kafka lists on
    stderr).  ``pylog verify`` is the command that fails on every problem.  Unknown file kinds
    are ignored with a message, as Kafka does, and do not change the status.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    if max_message_size < 0:
        raise ValueError(f"max_message_size must be >= 0, got {max_message_size}")
    opts = _Options(
        print_data_log=print_data_log,
        deep=deep_iteration or print_data_log,
        verify_only=verify_index_only,
        sanity_only=index_sanity_check,
        max_bytes=max_bytes,
        max_message_size=max_message_size,
        skip_record_metadata=skip_record_metadata,
        out=sys.stdout if out is None else out,
        err=sys.stderr if err is None else err,
        problems=_Problems(),
    )
    handlers = {".log": _dump_log, ".index": _dump_index, ".timeindex": _dump_time_index}
    handlers[".txnindex"] = _dump_txn_index
    for path in paths:
        opts.out.write(f"Dumping {path}\n")
        name = os.path.basename(path)
        suffix = name[name.rfind(".") :] if "." in name else ""
        handler = handlers.get(suffix)
        if handler is None:
            opts.err.write(f"Ignoring unknown file {path}\n")
            continue
        try:
            handler(path, opts)
        except BrokenPipeError:
            raise  # the reader of the output went away (`| head`): not the file's problem
        except (PylogError, OSError) as e:
            opts.problems.failed = True
            opts.out.flush()
            opts.err.write(f"{_describe(e, path)}\n")
    opts.out.flush()
    p = opts.problems
    p.print(opts.err)
    verification = p.index_mismatches or p.time_mismatches or p.time_out_of_order or p.time_not_found
    return 1 if p.failed or verification else 0


def _describe(e: BaseException, path: str) -> str:
    """One line naming the file given on the command line and the problem."""
    if isinstance(e, CorruptRecordError):
        return str(e if e.path else e.with_context(path=path))
    if isinstance(e, CorruptIndexError):
        msg = str(e)
        if e.path and msg.startswith(f"{e.path}: "):  # the index knows the file by its name only
            msg = msg[len(e.path) + 2 :]
        return f"{path}: {msg}"
    if isinstance(e, OSError):
        return f"{path}: {e.strerror or e}"
    return str(e)


# ============================================================================ files


def _open(path: str) -> tuple[LocalStorage, str]:
    """The file's directory as a storage, and the file's name in it; the file must exist."""
    directory, name = os.path.split(path)
    if not os.path.isdir(directory or "."):
        raise DumpError(f"{path}: no such file")
    storage = LocalStorage(directory or ".", create=False)
    if not storage.exists(name):
        raise DumpError(f"{path}: no such file")
    if storage.isdir(name):
        raise DumpError(f"{path}: is a directory, not a segment file")
    return storage, name


def _base_offset(path: str) -> int:
    stem = os.path.basename(path).split(".")[0]
    if not _NUMERIC.fullmatch(stem):
        raise DumpError(f"{path}: cannot take a base offset from the file name (expected <offset>.<suffix>)")
    return int(stem)


def _absolute(path: str) -> str:
    """``java.io.File.getAbsolutePath``: the working directory joined, nothing normalised."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


# ============================================================================ .log


def _dump_log(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    opts.out.write(f"Log starting offset: {_base_offset(path)}\n")
    size = storage.size(name)
    data = as_uint8(storage.read(name, 0, min(size, opts.max_bytes)))
    e = scan_log(data, path)
    chunks = Chunks(data, e.headers, path)
    tracker = OffsetTracker()
    w = opts.out.write
    try:
        for i in range(len(e.headers)):
            w(batch_line(e, i, path) + "\n")  # a CRC mismatch is shown (isvalid: false), not a failure
            if opts.deep:  # a batch whose records are corrupt raises here, as Kafka dies here
                lines = record_lines(
                    e,
                    i,
                    chunks,
                    tracker,
                    print_data_log=opts.print_data_log,
                    skip_record_metadata=opts.skip_record_metadata,
                )
                for line in lines:
                    w(line + "\n")
    finally:
        if tracker.pairs:
            opts.problems.non_consecutive.setdefault(_absolute(path), []).extend(tracker.pairs)
    if e.error is not None:
        raise e.error
    trailing = data.shape[0] - e.end  # a torn tail, or bytes that are no entry: reported, as Kafka does
    if trailing > 0 and opts.max_bytes == INT32_MAX:
        w(f"Found {trailing} invalid bytes at the end of {name}\n")


# ============================================================================ indexes


def _require_log(path: str, storage: LocalStorage, name: str) -> str:
    """The name of the index's sibling ``.log``, which must exist (Kafka opens it first)."""
    log_name = name.split(".")[0] + ".log"
    if not storage.exists(log_name):
        log_path = os.path.join(os.path.dirname(path), log_name)
        raise DumpError(f"{path}: the segment's log file {log_path} does not exist")
    return log_name


def _stop_at_zero_entry(offsets: np.ndarray, base: int) -> int:
    """How many entries to read: Kafka stops at the first entry after the first whose offset is
    the base offset (the zero-filled tail of a preallocated file after a crash)."""
    hits = np.nonzero(offsets[1:] == base)[0]
    return int(hits[0]) + 1 if hits.size else int(offsets.shape[0])


def _first_batch_last_offset(
    data: np.ndarray, positions: np.ndarray, max_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each position: the last offset of the batch starting there, read as Kafka does from
    ``slice(position, max_size)``; and a status (0 found, 1 no batch fits, 2 corrupt size,
    3 position outside the file)."""
    n = data.shape[0]
    pos = positions.astype(np.int64)
    limit = np.minimum(pos + max_size, n)
    status = np.where((pos < 0) | (pos > n), 3, np.where(pos >= limit - HEADER_SIZE_UP_TO_MAGIC, 1, 0))
    last = np.full(pos.shape, -1, np.int64)
    ok = status == 0
    p = pos[ok]
    if p.size:

        def field_at(off: int, width: int) -> np.ndarray:
            raw = data[p[:, None] + off + np.arange(width)]
            return np.ascontiguousarray(raw).view(f">i{width}").reshape(-1).astype(np.int64)

        size = field_at(8, 4)
        magic = data[p + 16].astype(np.int64)
        st = np.where(size < 14, 2, np.where(p > limit[ok] - 12 - size, 1, 0))
        lod = np.zeros(p.shape, np.int64)
        v2 = (st == 0) & (magic >= 2) & (p + 27 <= n)
        if v2.any():
            raw = data[p[v2, None] + 23 + np.arange(4)]
            lod[v2] = np.ascontiguousarray(raw).view(">i4").reshape(-1)
        last[ok] = np.where(st == 0, field_at(0, 8) + lod, -1)
        status[ok] = st
    return last, status


def _dump_index(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    base = _base_offset(path)
    log_name = _require_log(path, storage, name)
    index = OffsetIndex(storage, name, base)
    if len(index) == 0:
        opts.out.write(f"{path} is empty.\n")
        return
    if opts.sanity_only:
        index.sanity_check()
        opts.out.write(f"{path} passed sanity check.\n")
        return
    offsets, positions = index.entries()
    n = _stop_at_zero_entry(offsets, base)
    data = as_uint8(storage.read(log_name))
    last, status = _first_batch_last_offset(data, positions[:n], opts.max_message_size)
    abs_path = _absolute(path)
    for i in range(n):
        o, p = int(offsets[i]), int(positions[i])
        if status[i] == 0 and last[i] != o:
            opts.problems.index_mismatches.setdefault(abs_path, []).append((o, int(last[i])))
        elif status[i] != 0:
            opts.problems.failed = True
            why = {1: "no complete batch starts there", 2: "the entry there has a corrupt size"}.get(
                int(status[i]), "it is outside the log"
            )
            opts.err.write(f"{path}: index entry {i} (offset {o}) points to log position {p}, but {why}\n")
        if not opts.verify_only:
            opts.out.write(f"offset: {o} position: {p}\n")


def _dump_time_index(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    base = _base_offset(path)
    log_name = _require_log(path, storage, name)
    time_index = TimeIndex(storage, name, base)
    if opts.sanity_only:
        time_index.sanity_check()
        opts.out.write(f"{path} passed sanity check.\n")
        return
    offset_index = OffsetIndex(storage, name.split(".")[0] + ".index", base)  # missing: empty
    timestamps, offsets = time_index.entries()
    n = _stop_at_zero_entry(offsets, base)
    _, start = offset_index.lookup_many(offsets[:n])
    data = as_uint8(storage.read(log_name))
    e = scan_log(data, path)
    if e.error is not None:  # batches past it cannot be found
        opts.problems.failed = True
        opts.err.write(f"{_describe(e.error, path)}\n")
    pos, last = e.headers.position, e.last_offset
    # the first batch at or after the indexed position whose last offset reaches the entry's
    j = (
        np.searchsorted(np.maximum.accumulate(last), offsets[:n], side="left")
        if last.size
        else np.zeros(n, int)
    )
    j0 = np.searchsorted(pos, start, side="left")
    for i in np.nonzero(j < j0)[0].tolist():  # offsets go backwards in the log: search linearly
        hit = np.nonzero(last[j0[i] :] >= offsets[i])[0]
        j[i] = j0[i] + int(hit[0]) if hit.size else len(pos)
    found = j < len(pos)
    max_ts, errors = _max_timestamps(data, e.headers, np.unique(j[found]), path)
    abs_path = _absolute(path)
    prev = -1
    for i in range(n):
        ts, o, b = int(timestamps[i]), int(offsets[i]), int(j[i])
        if b >= len(pos):
            opts.problems.time_not_found.setdefault(abs_path, []).append((o, -1))
        elif last[b] != o:
            opts.problems.time_not_found.setdefault(abs_path, []).append((o, int(last[b])))
        else:
            if b in errors:
                raise errors[b]
            if max_ts[b] != ts:
                opts.problems.time_mismatches.setdefault(abs_path, []).append((ts, int(max_ts[b])))
            if prev >= ts:
                opts.problems.time_out_of_order.setdefault(abs_path, []).append((ts, prev))
        if not opts.verify_only:
            opts.out.write(f"timestamp: {ts} offset: {o}\n")
        prev = ts


def _max_timestamps(
    data: np.ndarray, h: BatchHeaders, wanted: np.ndarray, path: str, chunk: int = 64 << 20
) -> tuple[np.ndarray, dict[int, CorruptRecordError]]:
    """The largest record timestamp (-1 if none) of each ``wanted`` batch, decoding runs of
    up to ``chunk`` bytes at once; batches that cannot be decoded are returned as errors."""
    out = np.full(len(h), -1, np.int64)
    errors: dict[int, CorruptRecordError] = {}
    ends = h.position[wanted] + h.size[wanted]
    i = 0
    while i < wanted.shape[0]:
        first = int(wanted[i])
        k = max(i + 1, int(np.searchsorted(ends, h.position[first] + chunk, side="right")))
        runs = [(first, int(wanted[k - 1]))]
        while runs:
            lo, hi = runs.pop()
            start, end = int(h.position[lo]), int(h.position[hi] + h.size[hi])
            try:
                rs = records.decode(data, verify_crc=False, path=path, start=start, end=end)
            except CorruptRecordError as err:
                if lo == hi:
                    errors[lo] = err
                else:  # split until the bad batch is alone
                    mid = (lo + hi) // 2
                    runs += [(lo, mid), (mid + 1, hi)]
                continue
            np.maximum.at(out, lo + rs.batch_index, rs.records.column("timestamp").to_numpy())
        i = k
    return out, errors


def _dump_txn_index(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    t = TxnIndex(storage, name, _base_offset(path)).entries()
    for i in range(t.version.shape[0]):
        version = int(t.version[i]) >> 8  # Kafka's AbortedTxn.version() reads the first byte only
        if version > 0:
            raise DumpError(
                f"Unexpected aborted transaction version {version} in transaction index "
                f"{_absolute(path)}, current version is 0"
            )
        opts.out.write(
            f"version: {version} producerId: {int(t.producer_id[i])} firstOffset: {int(t.first_offset[i])} "
            f"lastOffset: {int(t.last_offset[i])} lastStableOffset: {int(t.last_stable_offset[i])}\n"
        )


__all__ = ["DumpError", "dump"]
