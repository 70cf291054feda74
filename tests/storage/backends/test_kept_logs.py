"""A writer on an object store keeps its logs open across its own commits, and takes another
writer's state whenever it loads one: its appends continue that state's offsets, every record
lands once, and what it reads is what the store holds."""

from __future__ import annotations

import pyarrow as pa

from pylog.storage.backends.objectstore.storage import ObjectStorage
from tests.conftest import Backend


def _values(backend: Backend, partition: int) -> list[bytes]:
    with backend.open(read_only=True) as r:
        t = r.read_table("t")
    mask = pa.compute.equal(t.column("partition"), partition)
    return t.filter(mask).column("value").to_pylist()


def test_appends_after_own_commits_continue_the_log_in_the_store(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", partitions=2)
    opened = [root.log("t", p) for p in (0, 1)]
    for i in range(40):  # sealed segments (4 KiB each) and inline active ones across commits
        info = root.append("t", [b"%03d-" % i + b"x" * 400] * 3, partition=i % 2)
        assert info[i % 2].first_offset == 3 * (i // 2)
    assert [root.log("t", p) for p in (0, 1)] == opened  # kept open, not reopened per operation
    assert len(root.log("t", 0).segments) > 2
    root.close()
    for p in (0, 1):
        assert _values(s3_backend, p) == [
            b"%03d-" % i + b"x" * 400 for i in range(p, 40, 2) for _ in range(3)
        ]


def test_a_writer_takes_what_another_committed_before_it_appends_again(s3_backend: Backend) -> None:
    a = s3_backend.open()
    a.create_topic("t", partitions=2)
    a.append("t", [b"a0"], partition=0)
    a.append("t", [b"a1"], partition=1)
    kept = a.log("t", 1)
    b = s3_backend.open()
    for i in range(3):  # the same partition: a's next commit conflicts and runs again
        b.append("t", [b"b-%d" % i], partition=1)
    assert a.append("t", [b"a2"], partition=1)[1].first_offset == 4
    assert a.log("t", 1) is not kept
    b.append("t", [b"b-3"], partition=0)  # another partition: a's next commit re-bases on it
    kept = a.log("t", 0)
    a.append("t", [b"a3"], partition=1)
    assert isinstance(a.storage, ObjectStorage) and a.storage.rebases >= 1
    assert a.log("t", 0) is not kept  # a state a did not write: reopened from it
    assert a.read_table("t", partitions=[0]).column("value").to_pylist() == [b"a0", b"b-3"]
    assert a.append("t", [b"a4"], partition=0)[0].first_offset == 2
    a.close()
    b.close()
    assert _values(s3_backend, 0) == [b"a0", b"b-3", b"a4"]
    assert _values(s3_backend, 1) == [b"a1", b"b-0", b"b-1", b"b-2", b"a2", b"a3"]
