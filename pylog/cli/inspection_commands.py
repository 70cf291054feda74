"""``pylog`` subcommands that only read: ``dump`` (segment files, as Kafka's
kafka-dump-log.sh prints them), ``describe`` and ``verify`` (a whole root).  The work is done
by :mod:`pylog.tools.dump` and :mod:`pylog.tools.inspect`; this module is their command line.
"""

from __future__ import annotations

import argparse
import json

from pylog.cli.progress import ItemProgress
from pylog.cli.registry import (
    Runner,
    add_root_argument,
    command,
    fail,
    non_negative_int,
    open_args_root,
)
from pylog.storage.errors import PylogError
from pylog.tools.dump import dump
from pylog.tools.inspect import describe, format_describe, problems_as_json, verify


@command(
    "dump",
    "print the contents of segment files, as kafka-dump-log.sh does",
    "Print .log, .index, .timeindex and .txnindex files in the output format of Kafka's "
    "kafka-dump-log.sh (DumpLogSegments), and verify indexes against their .log. A directory "
    "stands for its segment files (a partition directory, in offset order) or for those of its "
    "partition directories (a log directory); ROOT/TOPIC for those of the topic's partitions. "
    "Exit status 0 when every file was dumped, as kafka-dump-log.sh, also with batches whose CRC "
    "does not match (isvalid: false) or invalid bytes at the end of a .log (printed as 'Found N "
    "invalid bytes at the end of FILE'); 1 if a file is missing, unreadable, not a segment file "
    "or has a corrupt entry, or an index fails its sanity check or does not match its .log; 2 for "
    "bad arguments. 'pylog verify' fails on every problem.",
)
def dump_command(parser: argparse.ArgumentParser) -> Runner:
    parser.add_argument(
        "--files",
        required=True,
        action="extend",
        nargs="+",
        metavar="FILE",
        help="the segment files to dump (space or comma separated), or directories of them",
    )
    parser.add_argument(
        "--print-data-log",
        action="store_true",
        help="print each record's key and payload (decoded as UTF-8); implies --deep-iteration",
    )
    parser.add_argument(
        "--verify-index-only",
        action="store_true",
        help="for index files, only report entries that do not match the .log",
    )
    parser.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="for index files, only run the sanity check a broker runs at startup",
    )
    parser.add_argument(
        "--deep-iteration", action="store_true", help="print every record, not only the batches"
    )
    parser.add_argument(
        "--max-bytes",
        type=non_negative_int,
        default=2**31 - 1,
        metavar="N",
        help="read at most N bytes of each .log (default: all)",
    )
    parser.add_argument(
        "--max-message-size",
        type=non_negative_int,
        default=5 * 1024 * 1024,
        metavar="N",
        help="largest batch an .index entry may point at (default: 5242880)",
    )
    parser.add_argument(
        "--skip-record-metadata",
        action="store_true",
        help="with --print-data-log, print only keys and payloads",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: per file its batches (with their records), index entries and "
        "errors, under Kafka's field names; then the problems found",
    )

    def run(args: argparse.Namespace) -> int:
        files = [f for arg in args.files for f in arg.split(",") if f]
        if not files:
            fail("dump", "--files names no file")
            return 2
        return dump(
            files,
            print_data_log=args.print_data_log,
            verify_index_only=args.verify_index_only,
            index_sanity_check=args.index_sanity_check,
            deep_iteration=args.deep_iteration,
            max_bytes=args.max_bytes,
            max_message_size=args.max_message_size,
            skip_record_metadata=args.skip_record_metadata,
            as_json=args.json,
        )

    return run


@command(
    "describe",
    "show the topics, partitions, segments, offsets and sizes of a root",
    "Describe a pylog root (or a Kafka log directory): topics with their partition count and "
    "config overrides, and per partition the log start and end offsets, segments and bytes; "
    "then each consumer group's lag. Topics named after the root limit it to those. "
    "Opens the root read-only: safe beside a running writer. Exit status: 0, or 1 when the root "
    "cannot be read or a topic named is unknown; 2 for bad arguments.",
)
def describe_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("topics", nargs="*", metavar="TOPIC", help="only these topics (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        try:
            info = describe(open_args_root(args, read_only=True), args.topics)
        except PylogError as e:
            return fail("describe", e)
        print(json.dumps(info, indent=1) if args.json else format_describe(info))
        return 0

    return run


@command(
    "verify",
    "validate every file of a root; exit status 1 if anything is wrong",
    "Check every checkpoint file and the state file, every batch of every segment (CRC, sizes, "
    "records, offsets increasing), that segments agree with their file names and do not overlap, "
    "that every offset up to the high watermark is held by a segment (offsets may be missing only "
    "where compaction can have removed them: below the active segment of a compacted topic), that "
    "the log start offset is not beyond the end, and every index against its log, without "
    "modifying anything. Prints the problems found (with --json, each with its file, message and "
    "kind); exit status 0 when there are none, 1 otherwise, 2 for bad arguments.",
)
def verify_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        try:
            root = open_args_root(args, read_only=True)
            with ItemProgress(unit="segments", enabled=not args.json) as progress:
                problems, counts = verify(root, progress=progress.callback)
        except PylogError as e:
            return fail("verify", e)
        if args.json:
            print(json.dumps({"ok": not problems, "checked": counts, "problems": problems_as_json(problems)}))
        else:
            for p in problems:
                print(f"{p.file}: {p.message}")
            status = "OK" if not problems else f"{len(problems)} problem(s)"
            print(
                f"{status}: checked {counts['segments']} segments, {counts['batches']} batches, "
                f"{counts['records']} records, {counts['bytes']:,} bytes"
            )
        return 0 if not problems else 1

    return run
