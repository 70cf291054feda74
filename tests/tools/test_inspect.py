"""pylog describe (pylog/tools/inspect.py): the compaction backlog of compacted topics."""

from __future__ import annotations

import time

import pyarrow as pa

from pylog.storage.maintenance.runner import maintain
from pylog.tools.inspect import describe, format_describe
from tests.conftest import Backend


def test_describe_shows_the_compaction_backlog_until_the_cleaner_has_run(backend: Backend) -> None:
    with backend.open() as root:
        root.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": "16384"})
        root.create_topic("d", 1)
        for i in range(20):  # the same 4 keys again and again, over many segments
            keys = [b"k%d" % (j % 4) for j in range(8)]
            root.append("c", pa.table({"key": keys, "value": [b"v%d-" % i + b"x" * 600] * 8}))
            root.append("d", [b"x" * 600])
        info = describe(root)
        c, d = info["topics"]
        assert c["cleanable_bytes"] > 0 and d["cleanable_bytes"] == 0
        assert "compaction backlog" in format_describe(info)
        maintain(root, now=int(time.time() * 1000), force=True)
        after = describe(root)["topics"][0]
        assert after["cleanable_bytes"] == 0 and "compaction backlog" not in format_describe(describe(root))
