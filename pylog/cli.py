"""The ``pylog`` command for operators: ``pylog <command> [options]``; ``--help`` everywhere.

Each subcommand is one function registered with :func:`command`: it receives its
``argparse`` parser, adds its arguments, and returns the function that runs it (taking the
parsed arguments, returning the exit status).  Adding ``describe``, ``verify``,
``create-topic``, ... is one more such function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

Runner = Callable[[argparse.Namespace], int]
Builder = Callable[[argparse.ArgumentParser], Runner]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    build: Builder


COMMANDS: dict[str, Command] = {}
"""The registered subcommands, in the order they are listed by ``pylog --help``."""


def command(name: str, help: str, description: str | None = None) -> Callable[[Builder], Builder]:
    """Register the decorated builder as subcommand ``name``."""

    def register(build: Builder) -> Builder:
        if name in COMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        COMMANDS[name] = Command(name, help, description or help, build)
        return build

    return register


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2147483647], got {value}")
    return value


# ============================================================================ dump


@command(
    "dump",
    "print the contents of segment files, as kafka-dump-log.sh does",
    "Print .log, .index, .timeindex and .txnindex files in the output format of Kafka's "
    "kafka-dump-log.sh (DumpLogSegments), and verify indexes against their .log. "
    "Exit status 0 if every file was read and verified, 1 if a file is missing, unreadable or "
    "corrupt (including batches whose CRC does not match and invalid bytes at the end of a "
    ".log), or an index fails its sanity check or verification, 2 for bad arguments.",
)
def dump_command(parser: argparse.ArgumentParser) -> Runner:
    parser.add_argument(
        "--files",
        required=True,
        action="extend",
        nargs="+",
        metavar="FILE",
        help="the segment files to dump (space or comma separated)",
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
        type=_non_negative_int,
        default=2**31 - 1,
        metavar="N",
        help="read at most N bytes of each .log (default: all)",
    )
    parser.add_argument(
        "--max-message-size",
        type=_non_negative_int,
        default=5 * 1024 * 1024,
        metavar="N",
        help="largest batch an .index entry may point at (default: 5242880)",
    )
    parser.add_argument(
        "--skip-record-metadata",
        action="store_true",
        help="with --print-data-log, print only keys and payloads",
    )

    def run(args: argparse.Namespace) -> int:
        from pylog.tools.dump import dump

        files = [f for arg in args.files for f in arg.split(",") if f]
        if not files:
            print("pylog dump: error: --files names no file", file=sys.stderr)
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
        )

    return run


# ============================================================================ describe / verify


STORAGE_OPTION_HELP = (
    "an fsspec storage option of an object-store root, KEY=VALUE (repeatable): endpoint_url, key, "
    "secret, anon, client_kwargs.region_name, pylog.retry_timeout_s...; also read from "
    "PYLOG_STORAGE_OPTIONS as JSON. Never printed"
)


def add_root_argument(parser: argparse.ArgumentParser, help: str = "the pylog root directory") -> None:
    """The ``root`` argument (a directory or an object-store URL) and its storage options."""
    parser.add_argument("root", help=f"{help}, or an object-store URL such as s3://bucket/prefix")
    parser.add_argument(
        "--storage-option", "-S", action="append", default=[], metavar="KEY=VALUE", help=STORAGE_OPTION_HELP
    )


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    import json

    from pylog.storage.errors import ConfigError

    opts: dict[str, str] = {}
    env = os.environ.get("PYLOG_STORAGE_OPTIONS")
    if env:
        try:
            opts.update({str(k): str(v) for k, v in json.loads(env).items()})
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"PYLOG_STORAGE_OPTIONS is not a JSON object: {e}") from None
    for item in getattr(args, "storage_option", None) or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ConfigError(f"--storage-option {item.split('=')[0]!r}: expected KEY=VALUE")
        opts[k] = v
    return opts or None


def open_root(args: argparse.Namespace, *, read_only: bool):  # type: ignore[no-untyped-def]
    """The root named by ``args.root``; a missing local directory is an error when reading."""
    import pylog
    from pylog.storage.backends.objectstore import is_object_url
    from pylog.storage.errors import PylogError

    if read_only and not is_object_url(args.root) and not os.path.isdir(args.root):
        raise PylogError(f"{args.root}: no such directory")
    return pylog.open(args.root, storage_options(args), read_only=read_only)


def _open_read_only(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    return open_root(args, read_only=True)


def _progress(enabled: bool) -> Callable[[str], None] | None:
    """A one-line progress display on a terminal's stderr; nothing when piped."""
    if not (enabled and sys.stderr.isatty()):
        return None
    count = [0]

    def show(item: str) -> None:
        count[0] += 1
        sys.stderr.write(f"\r\033[K[{count[0]}] {item}"[:200])
        sys.stderr.flush()

    return show


@command(
    "describe",
    "show the topics, partitions, segments, offsets and sizes of a root",
    "Describe a pylog root (or a Kafka log directory): topics with their partition count and "
    "config overrides, and per partition the log start and end offsets, segments and bytes. "
    "Opens the root read-only: safe beside a running writer.",
)
def describe_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        import json

        from pylog.storage.errors import PylogError
        from pylog.tools.inspect import describe, format_describe

        try:
            info = describe(_open_read_only(args))
        except PylogError as e:
            print(f"pylog describe: error: {e}", file=sys.stderr)
            return 1
        print(json.dumps(info, indent=1) if args.json else format_describe(info))
        return 0

    return run


@command(
    "verify",
    "validate every file of a root; exit status 1 if anything is wrong",
    "Check every checkpoint file, every batch of every segment (CRC, sizes, records, offsets "
    "increasing) and every index against its log, without modifying anything. Prints the "
    "problems found; exit status 0 when there are none, 1 otherwise, 2 for bad arguments.",
)
def verify_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")

    def run(args: argparse.Namespace) -> int:
        import json

        from pylog.storage.errors import PylogError
        from pylog.tools.inspect import problems_as_json, verify

        try:
            problems, counts = verify(_open_read_only(args), progress=_progress(not args.json))
        except PylogError as e:
            print(f"pylog verify: error: {e}", file=sys.stderr)
            return 1
        if sys.stderr.isatty() and not args.json:
            sys.stderr.write("\r\033[K")
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


# ============================================================================ entry point

import pylog.cli_maintenance  # noqa: E402, F401 - registers compact, retain
from pylog import cli_data  # noqa: E402, F401 - registers create-topic, produce, consume, recover


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    """The ``pylog`` parser with every registered subcommand, and each one's runner."""
    parser = argparse.ArgumentParser(
        prog="pylog", description="Operate pylog roots: Kafka-format segmented logs on plain storage."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners: dict[str, Runner] = {}
    for cmd in COMMANDS.values():
        runners[cmd.name] = cmd.build(sub.add_parser(cmd.name, help=cmd.help, description=cmd.description))
    return parser, runners


def main(argv: list[str] | None = None) -> int:
    """Run ``pylog``; returns the exit status (2 for bad arguments, as argparse does)."""
    parser, runners = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or an argument error argparse has already reported
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return runners[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `pylog dump ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover - `python -m pylog.cli`: use the registered module
    from pylog.cli import main as _registered_main

    sys.exit(_registered_main())
