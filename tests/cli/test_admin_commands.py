"""delete-topic, describe-group and delete-group (kafka-topics.sh --delete,
kafka-consumer-groups.sh --describe/--delete --group), on local disk and S3, run through
``pylog.cli.main`` as the ``pylog`` command runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pylog.cli import main
from pylog.storage.root.consumers import (
    read_consumer_offsets,
    write_consumer_metadata,
    write_consumer_offsets,
)
from tests.conftest import Backend


def run(capsys: pytest.CaptureFixture[str], backend: Backend, *args: str) -> tuple[int, str, str]:
    command, rest = args[0], args[1:]
    status = main([command, backend.url, *rest, *backend.cli_args()])
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys: pytest.CaptureFixture[str], backend: Backend, *args: str) -> Any:
    status, out, err = run(capsys, backend, *args, "--json")
    assert status == 0, (out, err)
    return json.loads(out)


def make_root(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("events", partitions=2)
        root.create_topic("other")
        root.append("events", [b"a", b"b", b"c"], partition=0)
        root.append("events", [b"d"], partition=1)
        root.append("other", [b"e", b"f"])
        write_consumer_offsets(root.storage, "app", {("events", 0): 1, ("other", 0): 2})
        write_consumer_metadata(root.storage, "app", {("events", 0): "m"})
        write_consumer_offsets(root.storage, "only-events", {("events", 1): 1})


def test_delete_topic_removes_it_and_its_group_offsets_and_if_exists_is_quiet(
    capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    make_root(backend)
    assert run_json(capsys, backend, "delete-topic", "events") == {
        "topic": "events",
        "deleted": True,
        "partitions": 2,
    }
    assert run_json(capsys, backend, "list-topics") == {
        "topics": [{"topic": "other", "partitions": 1, "config": {}}]
    }
    with backend.open(read_only=True) as root:
        assert read_consumer_offsets(root.storage) == {"app": {("other", 0): 2}}  # "only-events" is gone
        assert root.read_table("other").num_rows == 2
    status, out, err = run(capsys, backend, "delete-topic", "events")
    assert status == 1 and out == ""
    assert "pylog delete-topic: error: unknown topic 'events'" in err and "topics: other" in err
    status, out, _ = run(capsys, backend, "delete-topic", "events", "--json")
    assert status == 1 and json.loads(out)["error"]["type"] == "UnknownTopicError"
    assert run_json(capsys, backend, "delete-topic", "events", "--if-exists") == {
        "topic": "events",
        "deleted": False,
        "partitions": 0,
    }
    status, out, err = run(capsys, backend, "delete-topic", "other")
    assert status == 0 and out == "deleted topic other (1 partitions)\n"


def test_describe_group_shows_committed_offsets_log_ends_and_lag(
    capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    make_root(backend)
    info = run_json(capsys, backend, "describe-group", "app")
    assert info == {
        "group": "app",
        "lag": 2 + 1 + 0,
        "partitions": [
            {"topic": "events", "partition": 0, "committed_offset": 1, "log_end_offset": 3, "lag": 2},
            {"topic": "events", "partition": 1, "committed_offset": None, "log_end_offset": 1, "lag": 1},
            {"topic": "other", "partition": 0, "committed_offset": 2, "log_end_offset": 2, "lag": 0},
        ],
    }
    status, out, _ = run(capsys, backend, "describe-group", "app")
    assert status == 0
    assert out.splitlines() == [
        "GROUP app  lag 3",
        "TOPIC   PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG",
        "events  0          1               3               2",
        "events  1          -               1               1",
        "other   0          2               2               0",
    ]
    # the same lag as `pylog describe` shows for the group
    described = run_json(capsys, backend, "describe")
    assert [c["lag"] for c in described["consumers"] if c["group"] == "app"] == [info["lag"]]
    status, _, err = run(capsys, backend, "describe-group", "nope")
    assert status == 1 and "unknown consumer group 'nope'" in err and "groups: app, only-events" in err


def test_delete_group_removes_its_offsets_and_metadata(
    capsys: pytest.CaptureFixture[str], backend: Backend
) -> None:
    make_root(backend)
    assert run_json(capsys, backend, "delete-group", "app") == {"group": "app", "deleted": True}
    assert run_json(capsys, backend, "list-groups") == {
        "groups": [{"group": "only-events", "partitions": 1, "topics": ["events"]}]
    }
    with backend.open(read_only=True) as root:
        assert not root.storage.exists("pylog-consumer-metadata.app")
    status, _, err = run(capsys, backend, "delete-group", "app")
    assert status == 1 and "unknown consumer group 'app'" in err


class Stop(Exception):
    """Raised at a named step of a deletion: the process stops there."""


def test_recover_completes_a_deletion_a_crash_interrupted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = Backend("local", str(tmp_path / "root"))
    make_root(backend)
    root = backend.open()

    def stop(step: str) -> None:
        if step == "partition-deleted":  # the first partition directory is gone, the second not
            raise Stop(step)

    root.faults.hook = stop
    with pytest.raises(Stop):
        root.delete_topic("events")
    assert root._writer is not None
    root._writer.close()  # the process is gone, and its lock with it
    assert sorted(n for n in os.listdir(backend.url) if n.startswith(("events-", "pylog-deleting"))) == [
        "events-1",
        "pylog-deleting-topics",
    ]
    assert run_json(capsys, backend, "list-topics")["topics"] == [
        {"topic": "other", "partitions": 1, "config": {}}
    ]
    assert run_json(capsys, backend, "recover")["ok"] is True
    assert not [n for n in os.listdir(backend.url) if n.startswith(("events-", "pylog-deleting"))]
    assert run_json(capsys, backend, "list-groups")["groups"] == [
        {"group": "app", "partitions": 1, "topics": ["other"]}
    ]
