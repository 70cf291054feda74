"""``pylog`` subcommands for what Kafka's operator tools do to topics and groups:
``list-topics`` (``kafka-topics.sh --list/--describe``), ``alter-config``
(``kafka-configs.sh --alter --add-config``), ``add-partitions`` (``kafka-topics.sh --alter
--partitions``) and ``list-groups`` (``kafka-consumer-groups.sh --list``; ``pylog describe``
shows each group's offsets and lag).  Registered with :func:`pylog.cli.registry.command`.
"""

from __future__ import annotations

import argparse
import json
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
    "the Spark source's queries alike (`pylog describe` shows their offsets and lag). Reads only. "
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
