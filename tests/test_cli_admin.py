"""The operator commands of Kafka's tools: list-topics, alter-config, add-partitions, list-groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pylog
from pylog.storage.root.consumers import write_consumer_offsets

pytestmark = pytest.mark.subprocess  # every test runs `python -m pylog`


def pylog_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pylog", *args], capture_output=True, text=True, timeout=300)


def test_topics_are_listed_altered_and_grown_as_kafkas_tools_do(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    assert pylog_cli("create-topic", root, "events", "--partitions", "2").returncode == 0
    altered = pylog_cli("alter-config", root, "events", "--add-config", "retention.ms=60000", "--json")
    assert altered.returncode == 0, altered.stderr
    assert json.loads(altered.stdout)["config"] == {"retention.ms": "60000"}
    grown = pylog_cli("add-partitions", root, "events", "--partitions", "5", "--json")
    assert json.loads(grown.stdout) == {"topic": "events", "partitions": 5, "added": 3}
    listed = json.loads(pylog_cli("list-topics", root, "--json").stdout)
    assert listed == {"topics": [{"topic": "events", "partitions": 5, "config": {"retention.ms": "60000"}}]}
    with pylog.open(root, read_only=True) as r:
        assert r.partitions("events") == 5 and r.config("events").retention_ms == 60000
    assert "events\tpartitions=5\tretention.ms=60000" in pylog_cli("list-topics", root).stdout


def test_bad_requests_are_refused_naming_what_is_wrong_and_change_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    pylog_cli("create-topic", root, "events", "--partitions", "3")
    fewer = pylog_cli("add-partitions", root, "events", "--partitions", "2")
    assert fewer.returncode == 1 and "has 3 partitions" in fewer.stderr
    bad = pylog_cli("alter-config", root, "events", "--add-config", "retention.msec=1")
    assert bad.returncode == 1 and "unknown config key 'retention.msec'" in bad.stderr
    unknown = pylog_cli("alter-config", root, "nope", "--add-config", "retention.ms=1")
    assert unknown.returncode == 1 and "unknown topic 'nope'" in unknown.stderr
    usage = pylog_cli("alter-config", root, "events", "--add-config", "no-equals-sign")
    assert usage.returncode == 2 and "KEY=VALUE" in usage.stderr
    with pylog.open(root, read_only=True) as r:
        assert r.partitions("events") == 3 and r.config("events").retention_ms == 7 * 24 * 3600 * 1000


def test_groups_of_kafka_clients_and_spark_queries_are_listed(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    with pylog.open(root) as r:
        r.create_topic("events", partitions=2)
        write_consumer_offsets(r.storage, "spark-query", {("events", 0): 1})
        write_consumer_offsets(r.storage, "team/app 1", {("events", 0): 2, ("events", 1): 3})
    listed = json.loads(pylog_cli("list-groups", root, "--json").stdout)["groups"]
    assert listed == [
        {"group": "spark-query", "partitions": 1, "topics": ["events"]},
        {"group": "team/app 1", "partitions": 2, "topics": ["events"]},
    ]
