"""What every ``pylog`` subcommand is built from: the :class:`Command` registry, the
:func:`command` decorator, and the argument and root-opening helpers they share.

Each subcommand is one function registered with :func:`command`: it receives its
``argparse`` parser, adds its arguments, and returns the function that runs it (taking the
parsed arguments, returning the exit status).  The command modules of this package register
theirs when :mod:`pylog.cli` imports them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from pylog.storage.backends.objectstore.client import is_object_url
from pylog.storage.backends.objectstore.options import summary as pylog_storage_options
from pylog.storage.errors import ConfigError, PylogError, StorageError
from pylog.storage.root.manager import Root
from pylog.storage.root.metadata import partition_count_problem
from pylog.storage.root.opening import open_root

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
        COMMANDS[name] = Command(
            name, help, description or help, lambda parser: _guarded(name, build(parser))
        )
        return build

    return register


_json_errors = False
"""Whether the running subcommand was given ``--json``: its errors are then printed as JSON."""


def _guarded(name: str, run: Runner) -> Runner:
    """``run`` with the errors every subcommand shares reported as :func:`fail` does (exit
    status 1), never as a traceback: a :class:`PylogError` (which names the file, option or
    argument) and an ``OSError`` (named by its file)."""

    def guarded(args: argparse.Namespace) -> int:
        global _json_errors
        _json_errors = bool(getattr(args, "json", False))
        try:
            return run(args)
        except PylogError as e:
            return fail(name, e)
        except OSError as e:
            if isinstance(e, BrokenPipeError):
                raise
            where = f"{e.filename}: " if e.filename is not None else ""
            return fail(name, e, f"{where}{e.strerror or e} (errno {e.errno})")
        finally:
            _json_errors = False

    return guarded


def fail(cmd: str, error: object, message: str | None = None) -> int:
    """Report an error of subcommand ``cmd`` (an exception or a message); returns exit status 1.

    On stderr as ``pylog CMD: error: MESSAGE``; under ``--json`` on stdout as one JSON object
    ``{"error": {"command": CMD, "type": TYPE, "message": MESSAGE}}`` (TYPE: the exception's
    class, ``UsageError`` for a plain message), so scripts parse every outcome the same way."""
    text = message if message is not None else str(error)
    if _json_errors:
        kind = type(error).__name__ if isinstance(error, BaseException) else "UsageError"
        print(json.dumps({"error": {"command": cmd, "type": kind, "message": text}}))
    else:
        print(f"pylog {cmd}: error: {text}", file=sys.stderr)
    return 1


# ============================================================================ roots


STORAGE_OPTION_HELP = (
    "a storage option of an object-store root, KEY=VALUE (repeatable): fsspec's (endpoint_url, key, "
    f"secret, anon, client_kwargs.region_name...) and pylog's ({pylog_storage_options()}), the "
    "storage.* options of the Spark source and sink without the prefix; also read from "
    "PYLOG_STORAGE_OPTIONS as JSON. Never printed"
)


def add_root_argument(parser: argparse.ArgumentParser, help: str = "the pylog root directory") -> None:
    """The ``root`` argument (a directory or an object-store URL) and its storage options."""
    parser.add_argument("root", help=f"{help}, or an object-store URL such as s3://bucket/prefix")
    parser.add_argument(
        "--storage-option", "-S", action="append", default=[], metavar="KEY=VALUE", help=STORAGE_OPTION_HELP
    )


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """``PYLOG_STORAGE_OPTIONS`` (a JSON object) updated with every ``--storage-option``."""
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


def open_args_root(
    args: argparse.Namespace, *, read_only: bool, create: bool = False, lock_timeout: float = 0.0
) -> Root:
    """The root named by ``args.root``.  A missing local directory is an error unless
    ``create`` (``create-topic`` creates roots; other commands never do, so a mistyped path is
    not silently made a new, empty root).  An object-store root that cannot be opened (a
    storage option the filesystem does not take, a missing bucket...) is a
    :class:`ConfigError` naming the URL and the options' names (never their values)."""
    if not is_object_url(args.root):
        if not create and not os.path.isdir(args.root):
            raise StorageError(f"{args.root}: no such directory (create-topic creates a root)")
        return open_root(args.root, storage_options(args), read_only=read_only, lock_timeout=lock_timeout)
    opts = storage_options(args)
    try:
        return open_root(args.root, opts, read_only=read_only)
    except PylogError:
        raise
    except Exception as e:  # fsspec/botocore: TypeError on an unknown option, OSError...
        names = ", ".join(sorted(opts or {})) or "none"
        raise ConfigError(
            f"{args.root}: cannot open the object-store root: {type(e).__name__}: {e} "
            f"(storage options given: {names}; from --storage-option and PYLOG_STORAGE_OPTIONS)"
        ) from e


# ============================================================================ arguments


def non_negative_int(text: str) -> int:
    """An ``argparse`` type: an integer in [0, 2**31 - 1] (a Java int that is not negative)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2147483647], got {value}")
    return value


def config_pair(text: str) -> tuple[str, str]:
    """An ``argparse`` type: ``KEY=VALUE``, a Kafka topic config."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (a Kafka topic config), got {text!r}")
    return key.strip(), value.strip()


def partition_count_arg(text: str) -> int:
    """An ``argparse`` type: a partition count in [1, MAX_PARTITIONS], refused before the root is
    opened (nothing is written)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    problem = partition_count_problem(value, "the partition count")
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value
