"""The ``pylog`` command for operators: ``pylog <command> [options]``; ``--help`` everywhere.

Every subcommand is registered in :mod:`pylog.cli.registry` by the module of its group,
imported here in the order ``pylog --help`` lists them:

* :mod:`~pylog.cli.inspection_commands` — ``dump``, ``describe``, ``verify`` (read only)
* :mod:`~pylog.cli.maintenance_commands` — ``compact``, ``retain``
* :mod:`~pylog.cli.data_commands` — ``create-topic``, ``produce``, ``consume``, ``recover``
* :mod:`~pylog.cli.admin_commands` — ``list-topics``, ``delete-topic``, ``alter-config``,
  ``add-partitions``, ``list-groups``, ``describe-group``, ``delete-group`` (what Kafka's
  operator tools do)
* :mod:`~pylog.cli.serve_command` — ``serve`` (Kafka's protocol, :mod:`pylog.server`)

Adding a subcommand is one more function decorated with :func:`~pylog.cli.registry.command`
in one of those modules (or a new module imported below).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from pylog.cli.registry import COMMANDS, Command, Runner, command

# imported to register their subcommands; the order of these imports is the order of --help
# isort: off
from pylog.cli import inspection_commands  # noqa: F401
from pylog.cli import maintenance_commands  # noqa: F401
from pylog.cli import data_commands  # noqa: F401
from pylog.cli import admin_commands  # noqa: F401
from pylog.cli import serve_command  # noqa: F401

# isort: on

__all__ = ["COMMANDS", "Command", "build_parser", "command", "main"]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    """The ``pylog`` parser with every registered subcommand, and each one's runner."""
    parser = argparse.ArgumentParser(
        prog="pylog", description="Operate pylog roots: Kafka-format segmented logs on plain storage."
    )
    parser.add_argument("--version", action="version", version=f"pylog {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners: dict[str, Runner] = {}
    for cmd in COMMANDS.values():
        subparser = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description)
        subparser.set_defaults(subparser=subparser)  # its usage, for the arguments it does not take
        runners[cmd.name] = cmd.build(subparser)
    return parser, runners


def _version() -> str:
    try:
        return importlib.metadata.version("pylog")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


def _parser_of(
    arg: str, args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]
) -> argparse.ArgumentParser:
    """The parser whose usage goes with ``arg``, an argument nobody took: the subcommand's when
    it comes after the subcommand's name, ``pylog``'s before."""
    sub: argparse.ArgumentParser | None = getattr(args, "subparser", None)
    if sub is None or args.command not in argv or arg in argv[: argv.index(args.command)]:
        return parser
    return sub


SIGPIPE_STATUS = 128 + 13
"""Exit status after the reader of the output went away (``pylog dump ... | head``): what a shell
reports for ``cat`` killed by SIGPIPE."""


def main(argv: list[str] | None = None) -> int:
    """Run ``pylog``; returns the exit status (2 for bad arguments, as argparse does)."""
    parser, runners = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # reported with the usage of the subcommand given them, as its own errors are
            _parser_of(unknown[0], args, parser, sys.argv[1:] if argv is None else argv).error(
                f"unrecognized arguments: {' '.join(unknown)}"
            )
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
        return SIGPIPE_STATUS
