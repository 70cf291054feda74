"""``pylog`` subcommands that create topics and move records: create-topic, produce,
consume, recover.  Registered with :func:`pylog.cli.registry.command` on import.

Record lines (``--format jsonl``, the default) are one JSON object per record::

    {"key": "user-1", "value": "{\\"n\\": 1}", "headers": [["source", "web"]],
     "timestamp": 1700000000000, "partition": 0}

Text fields are UTF-8; binary data that is not valid UTF-8 goes in ``key_b64`` / ``value_b64``
(and header values as ``{"b64": "..."}``), so any record survives ``produce`` → ``consume``
exactly.  ``--format kv`` reads ``key<TAB>value`` lines (like
``kafka-console-producer --property parse.key=true``) and ``--format value`` plain values.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any, TextIO, TypedDict

import numpy as np
import pyarrow as pa

from pylog.cli.registry import (
    Runner,
    add_root_argument,
    command,
    config_pair,
    fail,
    non_negative_int,
    open_args_root,
    partition_count_arg,
)
from pylog.storage.codec.columns import RECORD_TIMESTAMP_RANGE
from pylog.storage.codec.records import HEADER_TYPE
from pylog.storage.errors import ConfigError, OffsetOutOfRangeError, PylogError
from pylog.storage.root.manager import Root
from pylog.storage.root.metadata import MAX_PARTITIONS

FORMATS = ("jsonl", "kv", "value")


class InputRecord(TypedDict, total=False):
    """One record read by ``produce``; what is absent takes its default when appended
    (timestamp: the time of the append; partition: chosen by the partitioner)."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int
    partition: int


# ============================================================================ create-topic


@command(
    "create-topic",
    "create a topic with partitions and Kafka topic configs (kafka-topics.sh --create)",
    "Create a topic with a number of partitions and Kafka topic configs (the others keep Kafka's "
    "defaults); the root directory is created if missing. Takes the root's writer lock. Exit "
    "status: 0 when the topic was created (or exists, with --if-not-exists), 1 when it exists, a "
    "name or config is invalid (named, with the valid keys) or the root cannot be written, 2 for "
    "bad arguments.",
)
def create_topic_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser, "the pylog root directory (created if missing)")
    parser.add_argument("topic", help="topic name: [a-zA-Z0-9._-], at most 249 characters")
    parser.add_argument(
        "--partitions",
        type=partition_count_arg,
        default=1,
        help=f"number of partitions, 1..{MAX_PARTITIONS} (default 1)",
    )
    parser.add_argument(
        "--config",
        action="append",
        type=config_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a Kafka topic config, e.g. cleanup.policy=compact (repeatable)",
    )
    parser.add_argument("--if-not-exists", action="store_true", help="succeed if the topic exists")
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        try:
            with open_args_root(args, read_only=False, create=True) as root:
                existed = args.topic in root.topics()
                root.create_topic(args.topic, args.partitions, dict(args.config), exist_ok=args.if_not_exists)
                info = {
                    "topic": args.topic,
                    "created": not existed,
                    "partitions": root.partitions(args.topic),
                    "config": dict(sorted(root.config(args.topic).to_dict().items())),
                }
        except PylogError as e:
            return fail("create-topic", e)
        if args.json:
            print(json.dumps(info))
        elif existed:
            print(f"topic {args.topic} already exists in {args.root}", file=sys.stderr)
        else:
            msg = f"created topic {args.topic} with {args.partitions} partition(s) in {args.root}"
            print(msg, file=sys.stderr)
        return 0

    return run


# ============================================================================ produce


def _text_or_b64(obj: dict[str, Any], name: str, line_no: int) -> bytes | None:
    if f"{name}_b64" in obj:
        raw = obj[f"{name}_b64"]
        return None if raw is None else base64.b64decode(raw, validate=True)
    v = obj.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        v = json.dumps(v)  # a JSON object/number value is stored as its JSON text
    return v.encode()


def _headers(raw: Any, line_no: int) -> list[tuple[str, bytes | None]]:
    if raw is None:
        return []
    items = raw.items() if isinstance(raw, dict) else raw
    out = []
    for item in items:
        k, v = item
        if isinstance(v, dict):
            v = base64.b64decode(v["b64"], validate=True)
        elif isinstance(v, str):
            v = v.encode()
        elif v is not None:
            raise ValueError(f'line {line_no}: header {k!r} must be a string, null or {{"b64": ...}}')
        out.append((str(k), v))
    return out


def parse_lines(lines: Iterable[str], fmt: str, separator: str) -> Iterator[InputRecord]:
    """Records from input lines; raises ValueError naming the line on bad input."""
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n").rstrip("\r")
        if not line and fmt != "value":
            continue
        if fmt == "value":
            yield {"value": line.encode()}
        elif fmt == "kv":
            key, sep, value = line.partition(separator)
            if not sep:
                raise ValueError(f"line {n}: no {separator!r} separating key and value")
            yield {"key": key.encode(), "value": value.encode()}
        else:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n}: not JSON: {e.msg} at column {e.colno}") from e
            if not isinstance(obj, dict):
                raise ValueError(f"line {n}: expected a JSON object")
            if "value" not in obj and "value_b64" not in obj:  # (not silently a tombstone)
                raise ValueError(
                    f'line {n}: no "value" (or "value_b64") field; give "value": null for a tombstone '
                    f"(fields: {', '.join(sorted(map(str, obj))) or 'none'})"
                )
            try:
                rec: InputRecord = {
                    "key": _text_or_b64(obj, "key", n),
                    "value": _text_or_b64(obj, "value", n),
                    "headers": _headers(obj.get("headers"), n),
                }
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"line {n}: {e}") from e
            if "timestamp" in obj:
                expected = f"{RECORD_TIMESTAMP_RANGE} (Kafka's producer refuses negative timestamps)"
                rec["timestamp"] = _json_int(obj["timestamp"], "timestamp", n, expected)
            if "partition" in obj:
                rec["partition"] = _json_int(obj["partition"], "partition", n, "a partition number (>= 0)")
            yield rec


def _json_int(raw: Any, name: str, line_no: int, expected: str) -> int:
    """A JSON integer field of an input line, not negative (``1.0`` is taken, ``0.5``, ``"0"``,
    ``-1`` and values outside 64 bits are not: nothing is coerced silently)."""
    v = int(raw) if isinstance(raw, float) and raw.is_integer() else raw
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        raise ValueError(f"line {line_no}: {name} {json.dumps(raw)} is not {expected}")
    return v


def _to_table(recs: list[InputRecord], now: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([r.get("key") for r in recs], pa.binary()),
            "value": pa.array([r.get("value") for r in recs], pa.binary()),
            "timestamp": pa.array([r.get("timestamp", now) for r in recs], pa.int64()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.get("headers", [])] for r in recs],
                pa.list_(HEADER_TYPE),
            ),
        }
    )


def _positive_int(text: str) -> int:
    """An ``argparse`` type: an integer in [1, 2**31 - 1]."""
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected an integer of at least 1, got 0")
    return value


PRODUCE_INPUT = f"""\
input lines (--format jsonl, the default): one JSON object per record, with the fields
  value       required: a string (stored as UTF-8), any other JSON value (stored as its JSON
              text), or null for a tombstone (a record without a value); a line without it is
              an error
  value_b64   instead of value: the value in base64 (bytes that are not UTF-8)
  key         a string or other JSON value as for value; null or absent: no key
  key_b64     instead of key: the key in base64
  headers     [["name", "text"], ["name", {{"b64": "..."}}], ["name", null], ...] or
              {{"name": "text", ...}}
  timestamp   {RECORD_TIMESTAMP_RANGE} (default: the time of the append)
  partition   the partition (default: Kafka's murmur2 partition of the key); --partition overrides it
e.g. {{"key": "user-1", "value": "{{\\"plan\\": \\"pro\\"}}", "headers": [["source", "web"]]}}
(consume --format jsonl prints records in this form).
--format kv: KEY<separator>VALUE lines; --format value: one value per line, without key."""


@command(
    "produce",
    "append records read from stdin or a file (JSON lines, key/value or values)",
    "Append records read from stdin (or --file) to a topic, as kafka-console-producer.sh: JSON "
    'lines {"key", "value", "headers", "timestamp", "partition"} ("key_b64"/"value_b64" for '
    "bytes), KEY<separator>VALUE lines (--format kv) or one value per line (--format value). A "
    "record goes to the partition of its key (murmur2, as Kafka's producer) unless given one; "
    "each --batch records are appended and acknowledged together. Takes the root's writer lock. "
    "Exit status: 0 when every record was appended, 1 for an unknown topic, a bad input line "
    "(named by its number; the batches before it stay appended) or a write error, 2 for bad "
    "arguments.",
)
def produce_command(parser: argparse.ArgumentParser) -> Runner:
    parser.epilog = PRODUCE_INPUT
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_root_argument(parser)
    parser.add_argument("topic", help="an existing topic")
    parser.add_argument("--file", help="read records from this file instead of stdin")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="input format (default jsonl)")
    parser.add_argument("--separator", default="\t", help="key/value separator for --format kv (default TAB)")
    parser.add_argument("--partition", type=non_negative_int, help="send every record to this partition")
    parser.add_argument(
        "--batch", type=_positive_int, default=10_000, help="records per append, at least 1 (default 10000)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (records and offsets per partition)"
    )

    def run(args: argparse.Namespace) -> int:
        src: TextIO = open(args.file, encoding="utf-8") if args.file else sys.stdin  # noqa: SIM115
        total = 0
        written: dict[int, dict[str, int]] = {}
        try:
            with open_args_root(args, read_only=False) as root:
                root.partitions(args.topic)  # unknown topic: fail before reading input
                pending: list[InputRecord] = []
                for rec in parse_lines(src, args.format, args.separator):
                    pending.append(rec)
                    if len(pending) >= args.batch:
                        total += _flush(root, args, pending, written)
                total += _flush(root, args, pending, written)
        except (PylogError, ValueError, OSError) as e:
            return fail("produce", e, f"{e} ({_records(total)} appended before the error)")
        finally:
            if args.file:
                src.close()
        if args.json:
            parts = {str(p): written[p] for p in sorted(written)}
            print(json.dumps({"topic": args.topic, "records": total, "partitions": parts}))
        else:
            print(f"appended {_records(total)} to {args.topic}", file=sys.stderr)
        return 0

    return run


def _flush(
    root: Root, args: argparse.Namespace, pending: list[InputRecord], written: dict[int, dict[str, int]]
) -> int:
    if not pending:
        return 0
    now = int(time.time() * 1000)
    by_part: dict[int | None, list[InputRecord]] = {}
    for r in pending:
        by_part.setdefault(args.partition if args.partition is not None else r.get("partition"), []).append(r)
    for part, recs in by_part.items():
        for p, info in root.append(args.topic, _to_table(recs, now), partition=part).items():
            w = written.setdefault(int(p), {"records": 0, "first_offset": info.first_offset})
            w["records"] += info.num_records
            w["last_offset"] = info.last_offset
    n = len(pending)
    pending.clear()
    return n


# ============================================================================ consume


def _utf8_or_b64(out: dict[str, Any], name: str, value: bytes | None) -> None:
    if value is None:
        out[name] = None
        return
    try:
        out[name] = value.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(value).decode()


def format_record(row: dict[str, Any], fmt: str, separator: str) -> str:
    if fmt == "value":
        return (row["value"] or b"").decode("utf-8", "replace")
    if fmt == "kv":
        return (
            f"{(row['key'] or b'').decode('utf-8', 'replace')}{separator}"
            f"{(row['value'] or b'').decode('utf-8', 'replace')}"
        )
    out: dict[str, Any] = {
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "timestamp": row["timestamp"],
        "timestampType": row["timestampType"],
    }
    _utf8_or_b64(out, "key", row["key"])
    _utf8_or_b64(out, "value", row["value"])
    headers = []
    for h in row["headers"] or []:
        v = h["value"]
        try:
            headers.append([h["key"], None if v is None else v.decode("utf-8")])
        except UnicodeDecodeError:
            headers.append([h["key"], {"b64": base64.b64encode(v).decode()}])
    out["headers"] = headers
    return json.dumps(out, ensure_ascii=False)


@command(
    "consume",
    "print records from an offset or timestamp; --follow waits for new ones",
    "Print a topic's records, as kafka-console-consumer.sh: from the log start, an offset, a "
    "timestamp or the end, one line per record (--json/--format jsonl: one JSON object per record "
    "with its partition, offset, timestamp, key, value and headers; kv; value), in offset order "
    "per partition. Reads only: no lock, safe beside a running writer; --follow polls for new "
    "records until Ctrl-C. Exit status: 0 after the last record (or --max-messages, or Ctrl-C), 1 "
    "for an unknown topic or partition, an offset out of range or a damaged log (the records "
    "before the damage are printed), 2 for bad arguments; 141 when the reader of the output "
    "closed it.",
)
def consume_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("topic", help="the topic to read")
    parser.add_argument("--partition", type=int, action="append", help="only these partitions (repeatable)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start (default)")
    start.add_argument(
        "--offset",
        type=int,
        help="start at this offset in every partition (an error if it is beyond the log end of every "
        "partition read, as the API's start_offset; partitions it is beyond start at their end)",
    )
    start.add_argument(
        "--from-timestamp",
        type=int,
        metavar="MS",
        help="start at the first record with timestamp >= MS (epoch milliseconds)",
    )
    start.add_argument("--from-end", action="store_true", help="start at the log end (with --follow)")
    parser.add_argument(
        "--max-messages",
        type=_record_count,
        metavar="N",
        help="stop after N records, N >= 0 (default: read everything)",
    )
    parser.add_argument("--follow", action="store_true", help="keep waiting for new records (Ctrl-C stops)")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between polls (--follow)")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="output format (default jsonl)")
    parser.add_argument("--separator", default="\t", help="key/value separator for --format kv")
    parser.add_argument("--json", action="store_true", help="one JSON object per record (= --format jsonl)")

    def run(args: argparse.Namespace) -> int:
        if args.json:
            args.format = "jsonl"
        try:
            return _consume(args)
        except PylogError as e:
            return fail("consume", e)

    return run


def _record_count(text: str) -> int:
    """An ``argparse`` type: a number of records >= 0 (``--max-messages -1`` is refused, not
    taken as "read nothing"; without the option everything is read)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of records, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected a number of records >= 0, got {value} (leave the option out to read everything)"
        )
    return value


def _starting_offsets(root: Root, args: argparse.Namespace, parts: list[int]) -> dict[int, int]:
    out = {}
    beyond: dict[int, tuple[int, int]] = {}
    for p in parts:
        lg = root.log(args.topic, p)
        if args.offset is not None:  # as the API's start_offset (clamped up to the log start)
            if args.offset < 0:
                raise ConfigError(
                    f"--offset {args.offset}: an offset is never negative (see --from-beginning)"
                )
            if args.offset > lg.log_end_offset:
                beyond[p] = (lg.log_start_offset, lg.log_end_offset)
            out[p] = min(max(args.offset, lg.log_start_offset), lg.log_end_offset)
        elif args.from_timestamp is not None:
            hit = lg.offset_for_timestamp(args.from_timestamp)
            out[p] = lg.log_end_offset if hit is None else hit.offset
        elif args.from_end:
            out[p] = lg.log_end_offset
        else:
            out[p] = lg.log_start_offset
    if beyond:
        ranges = ", ".join(f"partition {p}: [{lo}, {hi}]" for p, (lo, hi) in beyond.items())
        if len(beyond) == len(parts):  # as the API: nothing there (a mistyped offset)
            raise OffsetOutOfRangeError(
                f"--offset {args.offset} is out of range for {args.topic!r} (beyond the log end "
                f"offset): {ranges}"
            )
        print(
            f"pylog consume: --offset {args.offset} is beyond the log end of {ranges}: from their end",
            file=sys.stderr,
        )
    return out


def _consume(args: argparse.Namespace) -> int:
    root = open_args_root(args, read_only=True)
    n_parts = root.partitions(args.topic)
    parts = args.partition or list(range(n_parts))
    for p in parts:
        if not 0 <= p < n_parts:
            return fail(
                "consume", f"partition {p} is out of range for topic {args.topic!r} (0..{n_parts - 1})"
            )
    positions = _starting_offsets(root, args, parts)
    printed = 0
    limit = args.max_messages
    try:
        while True:
            for p in parts:
                # streamed: what precedes damage (a bad CRC, say) is printed before the error
                # naming the file and byte
                for batch in root.read_batches(args.topic, [p], start_offset=positions[p]):
                    table = pa.Table.from_batches([batch])
                    if limit is not None:
                        table = table.slice(0, max(0, limit - printed))
                    for row in _rows(table):
                        print(format_record(row, args.format, args.separator))
                        printed += 1
                    if table.num_rows:
                        positions[p] = int(table.column("offset")[-1].as_py()) + 1
                    if limit is not None and printed >= limit:
                        return 0
            if not args.follow:
                return 0
            sys.stdout.flush()
            time.sleep(args.poll_interval)
            root.close()
            root = open_args_root(args, read_only=True)  # see what the writer appended since
    except KeyboardInterrupt:
        return 0
    finally:
        print(f"consumed {_records(printed)}", file=sys.stderr)


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    ts = table.column("timestamp").cast(pa.int64()).to_numpy()
    cols = {
        name: table.column(name).to_pylist()
        for name in ("key", "value", "topic", "partition", "offset", "timestampType", "headers")
    }
    for i in range(table.num_rows):
        row = {k: v[i] for k, v in cols.items()}
        row["timestamp"] = int(ts[i]) if isinstance(ts[i], np.integer) else ts[i]
        yield row


# ============================================================================ recover


@command(
    "recover",
    "take the writer lock, recover every log after an unclean stop, and repair damaged ones",
    "Open every partition as the writer does: what a crash left half done is completed or removed "
    "(only bytes that are not valid batches are truncated). A partition damaged from outside "
    "(segment files removed, renamed or copied; a log-start checkpoint beyond the end), which "
    "writers refuse, is repaired: what loses nothing (renaming a misnamed segment, dropping the "
    "checkpoint entry) is done; what loses data (removing a segment whose offsets another holds, "
    "lowering the high watermark to the log end) is stated, and done only with "
    "--accept-data-loss. Exit status 0 when every partition is writable, 1 otherwise.",
)
def recover_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="also carry out the repairs that lose data (they are listed without this flag)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        try:
            with open_args_root(args, read_only=False) as root:
                repairs = root.recover(accept_data_loss=args.accept_data_loss)
                report = [asdict(r) | {"lost_bytes": r.lost_bytes} for r in root.recoveries]
        except PylogError as e:
            return fail("recover", e)
        pending = [r for r in repairs if not r.applied]
        if args.json:
            damaged = [asdict(r) | {"steps": r.describe()} for r in repairs]
            print(json.dumps({"ok": not pending, "logs": report, "damaged": damaged}))
            return 1 if pending else 0
        lost = [r for r in report if r["lost_bytes"]]
        for r in report:
            if r["lost_bytes"] or r["rebuilt_indexes"] or r["removed_files"] or r["completed_swaps"]:
                print(
                    f"{r['directory']}: lost {r['lost_bytes']} bytes; rebuilt indexes of "
                    f"{len(r['rebuilt_indexes'])} segments; removed {len(r['removed_files'])} files; "
                    f"completed {len(r['completed_swaps'])} swaps"
                )
        for rep in repairs:
            where = f"{rep.topic}-{rep.partition}"
            print(f"{where}: damaged: {'; '.join(rep.problems)}")
            verb = "repaired" if rep.applied else "would"
            for step in rep.describe():
                print(f"{where}: {verb}: {step}")
        logs = len({r["directory"] for r in report})  # (a repaired log is opened twice)
        losing = {r["directory"] for r in lost} | {f"{r.topic}-{r.partition}" for r in repairs if r.lost}
        if pending:
            print(f"recovered {logs} logs; {len(pending)} damaged, not repaired (see above)")
        elif losing:
            print(f"recovered {logs} logs; {len(losing)} lost data (see above)")
        else:
            print(f"recovered {logs} logs; nothing lost")
        if pending:
            names = ", ".join(f"{r.topic}-{r.partition}" for r in pending)
            print(
                f"pylog recover: {names} still damaged: run again with --accept-data-loss to carry out "
                "the repairs listed, losing what they state",
                file=sys.stderr,
            )
            return 1
        return 0

    return run


def _records(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"
