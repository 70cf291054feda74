"""``pylog serve``: a Kafka endpoint over a root (:mod:`pylog.server`).  Registered on import."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from pylog.cli.registry import Runner, add_root_argument, command, non_negative_int, open_args_root
from pylog.storage.errors import ConfigError

DESCRIPTION = """\
Serve a root over Kafka's wire protocol: one process that is a single-node Kafka cluster for the
root (node 0, leader of every partition, coordinator of every group), so that Kafka clients
(librdkafka / confluent-kafka / kcat, kafka-python, aiokafka; the Java client's versions are
advertised but untested)
produce to and consume from the files Spark reads.  It holds the root's writer lock while it
runs, and runs retention and compaction between appends.  The first line on stdout says where it
listens (with --json, as one JSON object); SIGTERM or Ctrl-C stops it cleanly (exit status 0).
Exit status: 0 after a clean stop, 1 when the root cannot be opened or the port is taken."""


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


@command("serve", "serve a root over Kafka's wire protocol to Kafka clients", DESCRIPTION)
def serve_command(parser: argparse.ArgumentParser) -> Runner:
    add_root_argument(parser, "the pylog root to serve (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=non_negative_int, default=9092, help="port (default 9092; 0: any free one)"
    )
    parser.add_argument(
        "--advertised-host", help="host name clients are told to connect to (default: --host)"
    )
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=non_negative_int,
        default=3000,
        help="how long a new group's first rebalance waits for more members (Kafka's "
        "group.initial.rebalance.delay.ms, default 3000)",
    )
    parser.add_argument(
        "--maintenance-budget-ms",
        type=non_negative_int,
        default=250,
        help="time per maintenance run between appends (default 250)",
    )
    parser.add_argument(
        "--metrics", type=float, metavar="SECONDS", help="log request rates and latencies this often"
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="log lines on stderr")
    parser.add_argument("--log-level", choices=("debug", "info", "warning"), default="info")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print the first line (where it listens) as one JSON object {"host", "port", "root"}, '
        "and errors as JSON; log lines: --log-format json",
    )

    def run(args: argparse.Namespace) -> int:
        try:
            from pylog.server.broker import Broker
            from pylog.server.broker import run as run_broker
        except ImportError as e:
            raise ConfigError(
                f"pylog serve needs Python 3.11+ and the serve extra: pip install 'pylog[serve]' ({e})"
            ) from e
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            _JsonFormatter()
            if args.log_format == "json"
            else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
        )
        logger = logging.getLogger("pylog")
        logger.addHandler(handler)
        logger.setLevel(args.log_level.upper())
        from pylog.storage.backends import local

        local.LOCK_HOLDER = f"pylog serve on {args.host}:{args.port}"
        root = open_args_root(args, read_only=False, create=True)
        broker = Broker(
            root,
            host=args.host,
            port=args.port,
            advertised_host=args.advertised_host,
            maintenance_budget_s=args.maintenance_budget_ms / 1000,
        )
        broker.coordinator.initial_rebalance_delay_ms = args.group_initial_rebalance_delay_ms

        def ready(b: Any) -> None:
            where = root.storage.describe()
            if args.json:
                print(json.dumps({"host": b.advertised_host, "port": b.port, "root": where}), flush=True)
            else:
                print(f"pylog serve: listening on {b.advertised_host}:{b.port} for {where}", flush=True)

        try:
            asyncio.run(run_broker(broker, metrics_interval_s=args.metrics, ready=ready))
        except OSError:
            root.close()
            raise
        return 0

    return run
