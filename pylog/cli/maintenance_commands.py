"""``pylog`` subcommands that run maintenance: ``compact`` (the log cleaner) and ``retain``
(retention).  Registered with :func:`pylog.cli.registry.command` on import.

Both run :func:`pylog.storage.maintenance.runner.maintain` at ``--now`` (default: the current
time) as the root's writer, write its checkpoints and close it cleanly; ``compact`` on a local
root instead reads and rewrites each partition without the writer lock and takes it only to
swap the result in (:func:`pylog.storage.maintenance.detached.maintain_detached`), so that a
running sink is not held up for the whole pass.  A progress
bar is drawn on stderr when it is a terminal (:mod:`pylog.cli.progress`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from pylog.cli.progress import BytesProgress
from pylog.cli.registry import Runner, add_root_argument, command, fail, open_args_root
from pylog.storage.backends.objectstore.client import is_object_url
from pylog.storage.config import CleanerConfig
from pylog.storage.errors import ConfigError, PylogError
from pylog.storage.maintenance.cleaner import Cleaner
from pylog.storage.maintenance.detached import maintain_detached
from pylog.storage.maintenance.runner import MaintenanceReport, maintain


def _non_negative(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
        return value

    return parse


def _common(parser: argparse.ArgumentParser) -> None:
    add_root_argument(parser)
    parser.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC",
        help="only this topic (repeatable; default: every topic)",
    )
    parser.add_argument(
        "--now",
        type=_non_negative(int),
        metavar="MS",
        help="the time to apply the policies at, in ms since the epoch (default: now)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, for scripts")


def _run(
    args: argparse.Namespace,
    name: str,
    *,
    retention: bool = True,
    compaction: bool = True,
    force: bool = False,
    budget_s: float | None = None,
    cleaner: Cleaner | None = None,
) -> int:
    if not is_object_url(args.root) and not os.path.isdir(args.root):
        return fail(name, f"{args.root}: no such directory")
    try:
        if is_object_url(args.root):
            open_args_root(args, read_only=True).close()  # no root there: a clear error, nothing created
        elif compaction and not retention:
            report = _compact_detached(args, force, budget_s, cleaner)
            return _print(args, report)
        with open_args_root(args, read_only=False) as root, BytesProgress(enabled=not args.json) as progress:
            for t in args.topic or ():
                root.partitions(t)  # unknown topic: a clear error before any work
            now = int(time.time() * 1000) if args.now is None else args.now
            report = maintain(
                root,
                now=now,
                topics=args.topic,
                progress=progress if progress.active else None,
                retention=retention,
                compaction=compaction,
                force=force,
                budget_s=budget_s,
                cleaner=cleaner,
            )
    except PylogError as e:
        return fail(name, e)
    return _print(args, report)


LOCK_WAIT_S = 60.0
"""How long ``pylog compact`` waits for a running writer (a sink's commit) to release a local
root's lock before each swap."""


def _compact_detached(
    args: argparse.Namespace, force: bool, budget_s: float | None, cleaner: Cleaner | None
) -> MaintenanceReport:
    """Compaction of a local root beside its writers: each partition is read and rewritten
    without the writer lock, which is taken only to swap the result in
    (:func:`~pylog.storage.maintenance.detached.maintain_detached`)."""
    with open_args_root(args, read_only=True) as root:
        for t in args.topic or ():
            root.partitions(t)  # unknown topic: a clear error before any work
    now = int(time.time() * 1000) if args.now is None else args.now
    with BytesProgress(enabled=not args.json) as progress:
        return maintain_detached(
            lambda read_only: open_args_root(args, read_only=read_only, lock_timeout=LOCK_WAIT_S),
            now=now,
            topics=args.topic,
            force=force,
            budget_s=budget_s,
            cleaner=cleaner,
            progress=progress if progress.active else None,
        )


def _print(args: argparse.Namespace, report: MaintenanceReport) -> int:
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(report.summary())
    return 1 if report.uncleanable else 0


@command(
    "compact",
    "compact the topics with cleanup.policy=compact (Kafka's log cleaner)",
    "Run the log cleaner on the compacted topics of a root: every log whose dirty ratio exceeds "
    "min.cleanable.dirty.ratio (or that holds a segment older than max.compaction.lag.ms) is "
    "cleaned, the filthiest first: for each key only its latest record below the cleanable point "
    "stays, tombstones until delete.retention.ms has passed, offsets unchanged. Exit status 0 "
    "when every log could be cleaned, 1 if one is corrupt (it is left untouched) or on error.",
)
def compact_command(parser: argparse.ArgumentParser) -> Runner:
    _common(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="clean every compacted log with dirty data, whatever its dirty ratio",
    )
    parser.add_argument(
        "--budget",
        type=_non_negative(float),
        metavar="SECONDS",
        help="stop starting new work after this long (default: no limit)",
    )
    parser.add_argument(
        "--dedupe-buffer-size",
        type=_non_negative(int),
        metavar="BYTES",
        help="memory of the offset map, log.cleaner.dedupe.buffer.size (default 134217728)",
    )

    def run(args: argparse.Namespace) -> int:
        props = {}
        if args.dedupe_buffer_size is not None:
            props["log.cleaner.dedupe.buffer.size"] = args.dedupe_buffer_size
        try:
            cleaner = Cleaner(CleanerConfig.from_dict(props))
            cleaner.offset_map  # noqa: B018 - a dedupe buffer too small for one key is a usage error
        except ConfigError as e:
            fail("compact", e)
            return 2  # a usage error, as argparse's
        return _run(args, "compact", retention=False, force=args.force, budget_s=args.budget, cleaner=cleaner)

    return run


@command(
    "retain",
    "delete old segments by retention.ms and retention.bytes",
    "Apply the retention policies of a root's logs: with cleanup.policy=delete, the oldest "
    "segments whose records are all older than retention.ms, or beyond retention.bytes, are "
    "deleted and the log start offset advances (written to log-start-offset-checkpoint); data not "
    "yet flushed is never deleted. Takes the root's writer lock. Exit status: 0 when every log "
    "could be processed, 1 if one is corrupt (it is left untouched) or on error, 2 for bad "
    "arguments.",
)
def retain_command(parser: argparse.ArgumentParser) -> Runner:
    _common(parser)

    def run(args: argparse.Namespace) -> int:
        return _run(args, "retain", compaction=False)

    return run
