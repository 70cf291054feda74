"""``pylog`` subcommands for what Kafka's operator tools do to topics and groups:
``list-topics`` (``kafka-topics.sh --list/--describe``), ``delete-topic`` (``kafka-topics.sh
--delete``), ``alter-config`` (``kafka-configs.sh --alter --add-config``), ``add-partitions``
(``kafka-topics.sh --alter --partitions``), ``list-groups``, ``describe-group`` and
``delete-group`` (``kafka-consumer-groups.sh --list``, ``--describe --group``, ``--delete
--group``).  Registered with :func:`pylog.cli.registry.command`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pylog.cli.registry import (
    Runner,
    add_root_argument,
    command,
    config_pair,
    open_args_root,
    partition_count_arg,
)
from pylog.storage.errors import ConfigError
from pylog.storage.root.consumers import read_consumer_offsets
from pylog.storage.root.groups import delete_group, describe_group

JSON_HELP = "print one JSON object, for scripts"


def _topic_info(root: Any, topic: str) -> dict[str, Any]:
    explicit = root._topic(topic).get("config") or {}
    return {"topic": topic, "partitions": root.partitions(topic), "config": dict(sorted(explicit.items()))}


@command(
    "list-topics",
    "list the topics of a root, with their partitions and configs (kafka-topics.sh --describe)",
    "List the topics of a root with their partition counts and the configs set on them (the "
    "others have Kafka's defaults; `pylog describe` shows offsets and sizes). Reads only: no lock. "
    "Exit status: 0, or 1 when the root cannot be read.",
)
def list_topics_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=True) as root:
            topics = [_topic_info(root, t) for t in root.topics()]
        if args.json:
            print(json.dumps({"topics": topics}))
            return 0
        for t in topics:
            configs = ",".join(f"{k}={v}" for k, v in t["config"].items())
            print(f"{t['topic']}\tpartitions={t['partitions']}" + (f"\t{configs}" if configs else ""))
        return 0

    return run


@command(
    "delete-topic",
    "delete a topic with its data and its consumer groups' offsets (kafka-topics.sh --delete)",
    "Delete a topic: its partitions' data, its high watermarks and checkpoint entries, and the "
    "offsets consumer groups committed on it (a group left without offsets is removed), as "
    "Kafka's DeleteTopics. Readers see the topic whole or gone; a deletion a crash interrupted is "
    "completed by the next writer (or `pylog recover`). A running Spark query reading the topic "
    "reports it gone as lost data (failOnDataLoss). Takes the root's writer lock. Exit status: 0 "
    "when the topic was deleted (or did not exist, with --if-exists), 1 for an unknown topic "
    "(named, with the root's topics) or when the root cannot be written, 2 for bad arguments.",
)
def delete_topic_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("topic", help="the topic")
    parser.add_argument(
        "--if-exists", action="store_true", help="succeed when there is no such topic (deleting nothing)"
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=False) as root:
            partitions = root.partitions(args.topic) if args.topic in root.topics() else 0
            deleted = root.delete_topic(args.topic, if_exists=args.if_exists)
        info = {"topic": args.topic, "deleted": deleted, "partitions": partitions}
        if args.json:
            print(json.dumps(info))
        elif deleted:
            print(f"deleted topic {args.topic} ({partitions} partitions)")
        else:
            print(f"topic {args.topic} does not exist in {args.root}: nothing deleted", file=sys.stderr)
        return 0

    return run


@command(
    "alter-config",
    "set Kafka topic configs of a topic (kafka-configs.sh --alter --add-config)",
    "Set Kafka topic configs (e.g. retention.ms, cleanup.policy) on a topic; the others keep their "
    "values. Takes the root's writer lock. Exit status: 0, or 1 for an unknown topic or a bad "
    "config (named, with the valid keys).",
)
def alter_config_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("topic", help="the topic")
    parser.add_argument(
        "--add-config",
        "--config",
        dest="config",
        action="append",
        type=config_pair,
        required=True,
        metavar="KEY=VALUE",
        help="a Kafka topic config to set, e.g. retention.ms=86400000 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=False) as root:
            root.alter_config(args.topic, dict(args.config))
            info = _topic_info(root, args.topic)
        print(json.dumps(info) if args.json else f"altered {args.topic}: {info['config']}")
        return 0

    return run


@command(
    "add-partitions",
    "add partitions to a topic (kafka-topics.sh --alter --partitions)",
    "Add partitions to a topic, as Kafka's CreatePartitions: partitions are never removed, and keys "
    "may map to other partitions afterwards. Takes the root's writer lock. Exit status: 0, or 1 "
    "for an unknown topic or a count beyond the limit.",
)
def add_partitions_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("topic", help="the topic")
    parser.add_argument(
        "--partitions",
        type=partition_count_arg,
        required=True,
        help="the new total of partitions, more than the topic has (as kafka-topics.sh --partitions)",
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=False) as root:
            old = root.partitions(args.topic)
            if args.partitions <= old:
                raise ConfigError(
                    f"--partitions {args.partitions}: topic {args.topic!r} has {old} partitions; "
                    "give a larger total (partitions are never removed)"
                )
            total = root.add_partitions(args.topic, args.partitions - old)
        info = {"topic": args.topic, "partitions": total, "added": total - old}
        print(json.dumps(info) if args.json else f"{args.topic}: {old} -> {total} partitions")
        return 0

    return run


@command(
    "list-groups",
    "list the consumer groups that committed offsets in a root (kafka-consumer-groups.sh --list)",
    "List the consumer groups with offsets in the root: Kafka consumer groups of `pylog serve` and "
    "the Spark source's queries alike (`pylog describe-group` shows one's offsets and lag). Reads "
    "only. "
    "Exit status: 0, or 1 when the root cannot be read.",
)
def list_groups_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=True) as root:
            groups = read_consumer_offsets(root.storage)
        listed: list[dict[str, Any]] = [
            {"group": g, "partitions": len(offsets), "topics": sorted({t for t, _ in offsets})}
            for g, offsets in sorted(groups.items())
        ]
        if args.json:
            print(json.dumps({"groups": listed}))
        else:
            for g in listed:
                print(f"{g['group']}\t{','.join(g['topics'])}")
        return 0

    return run


@command(
    "describe-group",
    "show a consumer group's offsets, log end offsets and lag (kafka-consumer-groups.sh --describe)",
    "Show what a consumer group (a Kafka consumer group of `pylog serve` or a Spark query's "
    "groupId) committed: per partition of the topics it consumes, the committed offset, the log "
    "end offset and the lag between them (`-`: no committed offset, the lag then counts from 0; "
    "or a topic that no longer exists). A Spark query commits a micro-batch's offsets when it "
    "plans the next one. Reads only: no lock. Exit status: 0, or 1 for an unknown group (named, "
    "with the root's groups) or when the root cannot be read; 2 for bad arguments.",
)
def describe_group_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("group", help="the consumer group id")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=True) as root:
            info = describe_group(root, args.group)
        if args.json:
            print(json.dumps(info))
            return 0

        def show(v: int | None) -> str:
            return "-" if v is None else str(v)

        rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")]
        rows += [
            (
                p["topic"],
                str(p["partition"]),
                show(p["committed_offset"]),
                show(p["log_end_offset"]),
                show(p["lag"]),
            )
            for p in info["partitions"]
        ]
        widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
        print(f"GROUP {info['group']}  lag {info['lag']}")
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        return 0

    return run


@command(
    "delete-group",
    "delete a consumer group's committed offsets (kafka-consumer-groups.sh --delete --group)",
    "Remove a consumer group's committed offsets (and the metadata committed with them): a "
    "consumer of the group then starts where auto.offset.reset (startingOffsets for Spark) says. "
    "Takes the root's writer lock, which `pylog serve` holds while it coordinates groups (as "
    "Kafka refuses to delete a group with members); a Spark query still running under the "
    "groupId writes it again at its next commit. Exit status: 0, or 1 for an unknown group "
    "(named, with the root's groups) or when the root cannot be written; 2 for bad arguments.",
)
def delete_group_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser)
    parser.add_argument("group", help="the consumer group id")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)

    def run(args: argparse.Namespace) -> int:
        with open_args_root(args, read_only=False) as root:
            delete_group(root, args.group)
        print(
            json.dumps({"group": args.group, "deleted": True}) if args.json else f"deleted group {args.group}"
        )
        return 0

    return run
