"""``pylog dump``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments) for segment files.

Legacy (magic 0/1) entry header, read for the shallow ``offset: …`` line (v2 batch header:
see :mod:`batch`, index entries: see :mod:`index`), big-endian:

    +------+-------------+--------+-------------------------------------------------+
    | byte | field       | type   | notes                                           |
    +------+-------------+--------+-------------------------------------------------+
    |    0 | offset      | int64  | a wrapper's is the offset of its last message   |
    |    8 | messageSize | int32  | entry size = this + 12                          |
    |   12 | crc         | uint32 | CRC-32 (IEEE) of bytes [16, end)                |
    |   16 | magic       | int8   | 0 or 1                                          |
    |   17 | attributes  | int8   | codec bits 0-2, timestamp type bit 3 (magic 1)  |
    |   18 | timestamp   | int64  | magic 1 only                                    |
    +------+-------------+--------+-------------------------------------------------+

Output follows Kafka's ``core/src/main/scala/kafka/tools/DumpLogSegments.scala`` line for
line (index mismatches go to stderr after all files, as there).  Where Kafka would die with a
stack trace (a corrupt entry, a missing file, a failed sanity check) one line naming the file
goes to stderr and the next file is dumped.  Not supported: producer ``.snapshot`` and KRaft
``.checkpoint`` files (ignored as unknown), decoder classes, and the JSON form of KRaft
control records (printed as ``controlType: NAME(id)``).
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from pylog.storage.backends.fs import LocalStorage
from pylog.storage.codec import compression, records
from pylog.storage.codec.batch import (
    CONTROL_KEY,
    CONTROL_TYPES,
    BatchHeaders,
    Scan,
    as_uint8,
    control_type,
    end_txn_marker,
    parse_headers,
    scan_entries,
    verify_crcs,
)
from pylog.storage.errors import CorruptIndexError, CorruptRecordError, DumpError, PylogError
from pylog.storage.partition.index import OffsetIndex, TimeIndex, TxnIndex

LEGACY_V0 = struct.Struct(">qiIbb")  # offset, messageSize, crc, magic, attributes
LEGACY_V1 = struct.Struct(">qiIbbq")  # ... timestamp
LENGTH = struct.Struct(">i")

INT32_MAX = 2**31 - 1
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
HEADER_SIZE_UP_TO_MAGIC = 17  # FileLogInputStream stops when no more than this is left
DECODE_CHUNK = 32 << 20  # bytes of batches decoded at once for --deep-iteration
TIMESTAMP_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
LEGACY_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
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
    ``.index`` entry may point at.  Returns the exit status: 0 if every file was read and
    found sound; 1 if any file is missing or unreadable, holds a corrupt entry, a batch whose
    CRC does not match (``isvalid: false``) or invalid bytes at its end, fails
    ``--index-sanity-check``, or does not match its ``.log`` (index verification).  Unknown
    file kinds are ignored with a message (as Kafka does) and do not change the status;
    neither do non-consecutive offsets, which compaction produces.
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


class _OffsetTracker:
    """Kafka's non-consecutive offset check over the records of one ``.log`` file."""

    def __init__(self) -> None:
        self.last = -1
        self.pairs: list[tuple[int, int]] = []

    def see(self, offset: int) -> None:
        if self.last != -1 and offset != self.last + 1:
            self.pairs.append((self.last, offset))
        self.last = offset


# ============================================================================ .log


@dataclass
class _Entries:
    """The complete entries at the start of a buffer, with their printable batch fields."""

    headers: BatchHeaders
    last_offset: np.ndarray
    valid: np.ndarray  # stored CRC matches
    end: int  # where the complete entries stop
    error: CorruptRecordError | None  # what stopped the walk before the end of the data


def _scan(data: np.ndarray, path: str) -> _Entries:
    """Walk the entries as Kafka's ``FileLogInputStream`` does, stopping at the first bad one."""
    n = data.shape[0]
    end, error = n, None
    scan: Scan | None = None
    while scan is None:
        try:
            scan = scan_entries(data, end=end, path=path)
        except CorruptRecordError as e:
            bad = int(e.position or 0)
            if n - bad > HEADER_SIZE_UP_TO_MAGIC:  # Kafka stops silently at <= 17 bytes left
                error = e
            end = bad
    h = parse_headers(data, scan.position, scan.size, scan.magic)
    last = h.base_offset + h.last_offset_delta
    valid = verify_crcs(data, h)
    for i in np.nonzero(h.magic < 2)[0].tolist():  # legacy: fill in the fields Kafka prints
        p, size = int(h.position[i]), int(h.size[i])
        fields = (LEGACY_V1 if h.magic[i] == 1 else LEGACY_V0).unpack_from(data.data, p)
        last[i] = fields[0]
        h.crc[i] = fields[2]
        h.attributes[i] = fields[4] & 0xFF
        h.max_timestamp[i] = fields[5] if h.magic[i] == 1 else -1
        valid[i] = zlib.crc32(data.data[p + 16 : p + size]) == fields[2]
    return _Entries(h, last, valid, scan.end, error)


def _timestamp_type(magic: int, attributes: int) -> str:
    return TIMESTAMP_TYPES[-1 if magic == 0 else (attributes >> 3) & 1]


def _increment_sequence(sequence: int, increment: int) -> int:
    """``DefaultRecordBatch.incrementSequence``: wraps at Integer.MAX_VALUE to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def _java_bool(b: object) -> str:
    return "true" if b else "false"


def _batch_line(e: _Entries, i: int, path: str) -> str:
    h = e.headers
    magic, attrs = int(h.magic[i]), int(h.attributes[i])
    codec = attrs & 0x07
    names = compression.CODEC_NAMES if magic >= 2 else LEGACY_CODECS
    if codec not in names:
        where = int(h.position[i])
        raise CorruptRecordError(f"unknown compression type id {codec}", position=where, path=path)
    if magic >= 2:
        base_seq = int(h.base_sequence[i])
        last_seq = -1 if base_seq == -1 else _increment_sequence(base_seq, int(h.last_offset_delta[i]))
        horizon = f"OptionalLong[{int(h.base_timestamp[i])}]" if attrs & 0x40 else "OptionalLong.empty"
        head = (
            f"baseOffset: {int(h.base_offset[i])} lastOffset: {int(e.last_offset[i])} "
            f"count: {int(h.records_count[i])} baseSequence: {base_seq} lastSequence: {last_seq} "
            f"producerId: {int(h.producer_id[i])} producerEpoch: {int(h.producer_epoch[i])} "
            f"partitionLeaderEpoch: {int(h.partition_leader_epoch[i])} "
            f"isTransactional: {_java_bool(attrs & 0x10)} isControl: {_java_bool(attrs & 0x20)} "
            f"deleteHorizonMs: {horizon}"
        )
    else:
        head = f"offset: {int(e.last_offset[i])}"
    return (
        f"{head} position: {int(h.position[i])} {_timestamp_type(magic, attrs)}: {int(h.max_timestamp[i])} "
        f"size: {int(h.size[i])} magic: {magic} compresscodec: {names[codec]} crc: {int(h.crc[i])} "
        f"isvalid: {_java_bool(e.valid[i])}"
    )


def _decode_prefix(
    data: np.ndarray, start: int, end: int, path: str
) -> tuple[records.RecordSet, CorruptRecordError | None]:
    """Decode the entries in ``data[start:end]``; on a corrupt entry, those before it and the error."""
    error = None
    while True:
        try:
            return records.decode(data, verify_crc=False, path=path, start=start, end=end), error
        except CorruptRecordError as e:
            error, end = e, max(start, int(e.position or start))


class _Chunks:
    """Records of consecutive batches, decoded ``DECODE_CHUNK`` bytes at a time (bounded memory)."""

    def __init__(self, data: np.ndarray, h: BatchHeaders, path: str):
        self.data, self.h, self.path = data, h, path
        self.ends = h.position + h.size
        self.lo = self.hi = 0  # batches [lo, hi) are decoded in rs
        self.rs: records.RecordSet | None = None
        self.bounds = np.zeros(1, np.int64)
        self.error: CorruptRecordError | None = None  # for batch hi, when set

    def rows(self, i: int) -> tuple[records.RecordSet, slice]:
        """The decoded records of batch ``i`` (batches are asked for in order)."""
        if i >= self.hi:
            if self.error is not None:
                raise self.error
            start = int(self.h.position[i])
            last = max(i + 1, int(np.searchsorted(self.ends, start + DECODE_CHUNK, side="right")))
            self.rs, self.error = _decode_prefix(self.data, start, int(self.ends[last - 1]), self.path)
            self.lo, self.hi = i, i + len(self.rs.batches)
            self.bounds = np.searchsorted(self.rs.batch_index, np.arange(self.hi - self.lo + 1))
            if i >= self.hi and self.error is not None:
                raise self.error
        assert self.rs is not None
        return self.rs, slice(int(self.bounds[i - self.lo]), int(self.bounds[i - self.lo + 1]))


def _legacy_inner(data: np.ndarray, pos: int, magic: int, codec: int) -> list[tuple[int, bool]]:
    """(stored crc, crc valid) of each message inside a compressed legacy wrapper."""
    mv = data.data
    p = pos + (LEGACY_V1 if magic == 1 else LEGACY_V0).size
    p += LENGTH.size + max(LENGTH.unpack_from(mv, p)[0], 0)
    size = LENGTH.unpack_from(mv, p)[0]
    raw = compression.decompress(codec, mv[p + 4 : p + 4 + size], magic=magic)
    out, q = [], 0
    while q + 16 <= len(raw):
        msg_size = LENGTH.unpack_from(raw, q + 8)[0]
        crc = struct.unpack_from(">I", raw, q + 12)[0]
        out.append((crc, msg_size >= 14 and zlib.crc32(raw[q + 16 : q + 12 + msg_size]) == crc))
        q += 12 + max(msg_size, 0)
    return out


def _record_lines(
    e: _Entries, i: int, chunks: _Chunks, opts: _Options, tracker: _OffsetTracker
) -> Iterator[str]:
    """The ``| offset: …`` lines of entry ``i``."""
    rs, rows = chunks.rows(i)
    h, data = e.headers, chunks.data
    magic, attrs = int(h.magic[i]), int(h.attributes[i])
    is_control = magic >= 2 and bool(attrs & 0x20)
    ts_type = _timestamp_type(magic, attrs)
    t = rs.records.slice(rows.start, rows.stop - rows.start).to_pydict()
    legacy: list[tuple[int, bool]] = []
    if magic < 2:
        codec = attrs & 0x07
        if codec == 0:  # the record is the entry itself
            legacy = [(int(h.crc[i]), bool(e.valid[i]))]
        else:
            legacy = _legacy_inner(data, int(h.position[i]), magic, codec)
    base_offset, base_seq = int(h.base_offset[i]), int(h.base_sequence[i])
    for r, (offset, ts, key, value, headers) in enumerate(
        zip(t["offset"], t["timestamp"], t["key"], t["value"], t["headers"], strict=True)
    ):
        tracker.see(offset)
        prefix, line = "| ", ""
        if not opts.skip_record_metadata:
            line = (
                f"| offset: {offset} {ts_type}: {ts} keySize: {-1 if key is None else len(key)} "
                f"valueSize: {-1 if value is None else len(value)}"
            )
            prefix = " "
            if magic >= 2:
                seq = _increment_sequence(base_seq, offset - base_offset) if base_seq >= 0 else -1
                line += f" sequence: {seq} headerKeys: [{','.join(hd['key'] for hd in headers)}]"
            elif r < len(legacy):
                line += f" isValid: {_java_bool(legacy[r][1])} crc: {legacy[r][0]}}}"
            if is_control:
                line += _control_text(key, value, int(h.position[i]))
        if opts.print_data_log and not is_control:
            if key is not None:
                line += f"{prefix}key: {key.decode('utf-8', 'replace')}"
            if value is not None:
                line += f" payload: {value.decode('utf-8', 'replace')}"
        yield line


def _control_text(key: bytes | None, value: bytes | None, position: int) -> str:
    control_type(key, position=position)  # raises on a short key or a negative version
    assert key is not None
    type_id = CONTROL_KEY.unpack_from(key)[1]
    name = CONTROL_TYPES.get(type_id, "UNKNOWN")
    if name in ("ABORT", "COMMIT"):
        version, epoch = end_txn_marker(value, position=position)
        if version < 0:
            raise CorruptRecordError(
                f"invalid version {version} found for end transaction marker", position=position
            )
        return f" endTxnMarker: {name} coordinatorEpoch: {epoch}"
    return f" controlType: {name}({type_id})"


def _dump_log(path: str, opts: _Options) -> None:
    storage, name = _open(path)
    opts.out.write(f"Log starting offset: {_base_offset(path)}\n")
    size = storage.size(name)
    data = as_uint8(storage.read(name, 0, min(size, opts.max_bytes)))
    e = _scan(data, path)
    chunks = _Chunks(data, e.headers, path)
    tracker = _OffsetTracker()
    w = opts.out.write
    try:
        for i in range(len(e.headers)):
            w(_batch_line(e, i, path) + "\n")
            if not e.valid[i]:
                opts.problems.failed = True
            if opts.deep:  # a batch whose records are corrupt raises here, as Kafka dies here
                for line in _record_lines(e, i, chunks, opts, tracker):
                    w(line + "\n")
    finally:
        if tracker.pairs:
            opts.problems.non_consecutive.setdefault(_absolute(path), []).extend(tracker.pairs)
    if e.error is not None:
        raise e.error
    trailing = data.shape[0] - e.end
    if trailing > 0 and opts.max_bytes == INT32_MAX:
        w(f"Found {trailing} invalid bytes at the end of {name}\n")
        opts.problems.failed = True


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
    e = _scan(data, path)
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
