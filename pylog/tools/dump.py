"""``pylog dump``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments) for segment files.

Output follows Kafka's ``core/src/main/scala/kafka/tools/DumpLogSegments.scala`` line for
line (index mismatches go to stderr after all files, as there).  Where Kafka would die with a
stack trace (a corrupt entry, a missing file, a failed sanity check) one line naming the file
goes to stderr and the next file is dumped.  A file of another kind is such an error too (Kafka
ignores it).  Not supported: producer ``.snapshot`` and KRaft ``.checkpoint`` files, decoder
classes, and the JSON form of KRaft control records (printed as ``controlType: NAME(id)``).

Beyond Kafka's tool: a directory stands for the segment files in it (a partition directory), or
in its partition directories (a topic's, named ``<dir>/<topic>``, or a whole log directory);
with ``as_json`` the same content is one JSON object (:class:`_Report`).

This module finds the files, reads them, checks indexes against their ``.log`` and collects the
problems; the fields of the batches and records of a ``.log`` and their lines are made by
:mod:`pylog.tools.dump_lines`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

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
    batch_fields,
    batch_line,
    record_fields,
    record_line,
    scan_log,
)

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
_NUMERIC = re.compile(r"[+-]?\d+")
SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")
_SEGMENT_FILE = re.compile(r"(\d+)(\.log|\.index|\.timeindex|\.txnindex)")
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")


@dataclass
class _Problems:
    """Verification results that Kafka prints to stderr after all files, keyed by absolute path."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    failed: bool = False

    def as_json(self) -> list[dict[str, Any]]:
        """Every problem as an object with its ``file`` and ``kind``."""
        out: list[dict[str, Any]] = []
        kinds = (
            ("index-mismatch", self.index_mismatches, ("indexOffset", "logOffset")),
            ("timestamp-mismatch", self.time_mismatches, ("indexTimestamp", "logTimestamp")),
            ("timestamp-out-of-order", self.time_out_of_order, ("indexTimestamp", "previousTimestamp")),
            ("indexed-offset-not-found", self.time_not_found, ("indexOffset", "foundLogOffset")),
            ("non-consecutive-offsets", self.non_consecutive, ("offset", "followedBy")),
        )
        for kind, found, (a, b) in kinds:
            for name, pairs in found.items():
                out += [{"file": name, "kind": kind, a: x, b: y} for x, y in pairs]
        return out

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


class _Report:
    """Where a dump goes: Kafka's lines on ``out`` (a file's errors on ``err``), or with
    ``as_json`` one object per file, printed as ``{"files": [...], "problems": [...], "ok": ...}``
    at the end.  A file's object: ``file``, ``baseOffset`` (from its name), ``batches`` (each
    with its ``records`` after --deep-iteration; ``key`` and ``payload`` as UTF-8 text, or
    ``key_b64``/``payload_b64``), ``entries`` (of an index), ``invalidBytesAtEnd``, ``empty``,
    ``sanityCheck``, ``errors``."""

    def __init__(self, out: TextIO, err: TextIO, as_json: bool):
        self.out, self.err, self.as_json = out, err, as_json
        self.files: list[dict[str, Any]] = []

    def file(self, path: str) -> None:
        if self.as_json:
            self.files.append({"file": path})
        else:
            self.out.write(f"Dumping {path}\n")

    def set(self, name: str, value: Any, line: str) -> None:
        """A fact about the file: ``name: value`` in JSON, ``line`` in text."""
        if self.as_json:
            self.files[-1][name] = value
        else:
            self.out.write(line + "\n")

    def add(self, name: str, fields: dict[str, Any], line: str | None) -> None:
        """One more item of the file's list ``name`` (``records`` go to its last batch)."""
        if self.as_json:
            into = self.files[-1]["batches"][-1] if name == "records" else self.files[-1]
            into.setdefault(name, []).append(_jsonable(fields))
        elif line is not None:
            self.out.write(line + "\n")

    def error(self, message: str) -> None:
        if self.as_json:
            self.files[-1].setdefault("errors", []).append(message)
        else:
            self.out.flush()
            self.err.write(message + "\n")

    def finish(self, problems: _Problems, ok: bool) -> None:
        if self.as_json:
            doc = {"files": self.files, "problems": problems.as_json(), "ok": ok}
            self.out.write(json.dumps(doc, ensure_ascii=False) + "\n")
        else:
            self.out.flush()
            problems.print(self.err)
        self.out.flush()


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with bytes as UTF-8 text, or in base64 under ``<name>_b64`` when not UTF-8."""
    out = {}
    for name, value in fields.items():
        if isinstance(value, bytes):
            try:
                out[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                out[f"{name}_b64"] = base64.b64encode(value).decode()
        else:
            out[name] = value
    return out


@dataclass
class _Options:
    print_data_log: bool
    deep: bool
    verify_only: bool
    sanity_only: bool
    max_bytes: int
    max_message_size: int
    skip_record_metadata: bool
    report: _Report
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
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Dump ``.log``, ``.index``, ``.timeindex`` and ``.txnindex`` files as Kafka's tool does.

    ``paths`` are OS paths: segment files, or directories (:func:`segment_files`).
    ``print_data_log`` implies ``deep_iteration``; ``max_bytes`` limits how much of each
    ``.log`` is read; ``max_message_size`` bounds the batch an ``.index`` entry may point at;
    ``as_json`` prints one JSON object instead of Kafka's lines (:class:`_Report`).

    Returns the exit status, Kafka's where Kafka's tool completes: 0 when every file was
    dumped, including a ``.log`` with batches whose CRC does not match (printed
    ``isvalid: false``) or with invalid bytes at its end (a torn tail: ``Found N invalid bytes
    at the end of <file>`` on stdout, after the complete entries), and non-consecutive offsets
    (which compaction produces).  1 where Kafka's tool dies: a file missing or unreadable, an
    entry whose header is corrupt, a failed ``--index-sanity-check``; and, as a check of
    pylog's own, when an index does not match its ``.log`` (the mismatches Kafka lists on
    stderr), and for a file of another kind (which Kafka ignores).  ``pylog verify`` is the
    command that fails on every problem.
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
        report=_Report(sys.stdout if out is None else out, sys.stderr if err is None else err, as_json),
        problems=_Problems(),
    )
    handlers = {".log": _dump_log, ".index": _dump_index, ".timeindex": _dump_time_index}
    handlers[".txnindex"] = _dump_txn_index
    report = opts.report
    for path in segment_files(paths):
        report.file(path)
        name = os.path.basename(path)
        suffix = name[name.rfind(".") :] if "." in name else ""
        handler = handlers.get(suffix)
        try:
            if handler is None:
                if not os.path.exists(path):
                    raise DumpError(f"{path}: no such file or directory")
                if os.path.isdir(path):
                    raise DumpError(f"{path}: no segment files in it or in its partition directories")
                raise DumpError(
                    f"{path}: not a segment file: pylog dump reads {', '.join(SUFFIXES)} files and "
                    "directories of them"
                )
            handler(path, opts)
        except BrokenPipeError:
            raise  # the reader of the output went away (`| head`): not the file's problem
        except (PylogError, OSError) as e:
            opts.problems.failed = True
            report.error(_describe(e, path))
    p = opts.problems
    verification = p.index_mismatches or p.time_mismatches or p.time_out_of_order or p.time_not_found
    status = 1 if p.failed or verification else 0
    report.finish(p, status == 0)
    return status


def segment_files(paths: list[str]) -> list[str]:
    """``paths`` with each directory replaced by the segment files it holds, in offset order
    (``.log``, ``.index``, ``.timeindex``, ``.txnindex`` of each base offset), or by those of
    its partition directories (``<topic>-<partition>``: a log directory) when it holds none.
    A path that does not exist but names a topic of its directory (``<dir>/<topic>``, with
    ``<dir>/<topic>-0``...) stands for the files of that topic's partitions.  Other paths are
    kept as they are (the dump reports what is wrong with them)."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = _partition_files(path)
            for d in [] if found else _partition_dirs(path):
                found += _partition_files(os.path.join(path, d))
            out += found or [path]
        elif not os.path.exists(path) and os.path.isdir(os.path.dirname(path) or "."):
            topic = os.path.basename(path)
            parts = [d for d in _partition_dirs(os.path.dirname(path) or ".") if d.rsplit("-", 1)[0] == topic]
            found = [f for d in parts for f in _partition_files(os.path.join(os.path.dirname(path), d))]
            out += found or [path]
        else:
            out.append(path)
    return out


def _partition_files(directory: str) -> list[str]:
    keyed = []
    for name in os.listdir(directory):
        m = _SEGMENT_FILE.fullmatch(name)
        if m and os.path.isfile(os.path.join(directory, name)):
            keyed.append((int(m.group(1)), SUFFIXES.index(m.group(2)), os.path.join(directory, name)))
    return [path for *_, path in sorted(keyed)]


def _partition_dirs(directory: str) -> list[str]:
    """The partition directories in ``directory``, by topic and partition number."""
    keyed = []
    for name in os.listdir(directory):
        m = _PARTITION_DIR.fullmatch(name)
        if m and os.path.isdir(os.path.join(directory, name)):
            keyed.append((m.group(1), int(m.group(2)), name))
    return [name for *_, name in sorted(keyed)]


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
    report = opts.report
    base = _base_offset(path)
    report.set("baseOffset", base, f"Log starting offset: {base}")
    size = storage.size(name)
    data = as_uint8(storage.read(name, 0, min(size, opts.max_bytes)))
    e = scan_log(data, path)
    chunks = Chunks(data, e.headers, path)
    tracker = OffsetTracker()
    text = not report.as_json
    if report.as_json:
        report.files[-1]["batches"] = []
    try:
        for i in range(len(e.headers)):
            fields = batch_fields(e, i, path)  # a CRC mismatch is shown (isvalid: false), not a failure
            report.add("batches", fields, batch_line(fields) if text else None)
            if opts.deep:  # a batch whose records are corrupt raises here, as Kafka dies here
                for record in record_fields(
                    e,
                    i,
                    chunks,
                    tracker,
                    data=opts.print_data_log,
                    metadata=not opts.skip_record_metadata,
                ):
                    report.add("records", record, record_line(record) if text else None)
    finally:
        if tracker.pairs:
            opts.problems.non_consecutive.setdefault(_absolute(path), []).extend(tracker.pairs)
    if e.error is not None:
        raise e.error
    trailing = data.shape[0] - e.end  # a torn tail, or bytes that are no entry: reported, as Kafka does
    if trailing > 0 and opts.max_bytes == INT32_MAX:
        report.set("invalidBytesAtEnd", trailing, f"Found {trailing} invalid bytes at the end of {name}")


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
        opts.report.set("empty", True, f"{path} is empty.")
        return
    if opts.sanity_only:
        index.sanity_check()
        opts.report.set("sanityCheck", "passed", f"{path} passed sanity check.")
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
            opts.report.error(f"{path}: index entry {i} (offset {o}) points to log position {p}, but {why}")
        if not opts.verify_only:
            opts.report.add("entries", {"offset": o, "position": p}, f"offset: {o} position: {p}")


def _dump_time_index(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    base = _base_offset(path)
    log_name = _require_log(path, storage, name)
    time_index = TimeIndex(storage, name, base)
    if opts.sanity_only:
        time_index.sanity_check()
        opts.report.set("sanityCheck", "passed", f"{path} passed sanity check.")
        return
    offset_index = OffsetIndex(storage, name.split(".")[0] + ".index", base)  # missing: empty
    timestamps, offsets = time_index.entries()
    n = _stop_at_zero_entry(offsets, base)
    _, start = offset_index.lookup_many(offsets[:n])
    data = as_uint8(storage.read(log_name))
    e = scan_log(data, path)
    if e.error is not None:  # batches past it cannot be found
        opts.problems.failed = True
        opts.report.error(_describe(e.error, path))
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
            opts.report.add("entries", {"timestamp": ts, "offset": o}, f"timestamp: {ts} offset: {o}")
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
        fields = {
            "version": version,
            "producerId": int(t.producer_id[i]),
            "firstOffset": int(t.first_offset[i]),
            "lastOffset": int(t.last_offset[i]),
            "lastStableOffset": int(t.last_stable_offset[i]),
        }
        opts.report.add("entries", fields, " ".join(f"{k}: {v}" for k, v in fields.items()))


__all__ = ["DumpError", "dump", "segment_files"]
