"""I/O errors in the middle of a write (TESTING.md A12): the failing call raises, the failed log
refuses further writes until it is reopened (fail-stop), nothing of the failed call is ever
acknowledged, and a retry lands exactly once."""

from __future__ import annotations

import errno

import pytest

from pylog.storage.codec import records
from pylog.storage.errors import InvalidOffsetError, PylogError
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from tests.reliability.checker import read_storage
from tests.reliability.memfs import MemStorage

T0 = 1_700_000_000_000


class FailingStorage(MemStorage):
    """Writes to files whose path contains ``fail_on`` raise EIO (a bad disk, a full disk)."""

    fail_on: str | None = None

    def _step(self, op: str, path: str) -> None:
        if self.fail_on is not None and op == "write" and self.fail_on in path:
            raise OSError(errno.EIO, "simulated I/O error", path)
        super()._step(op, path)


def _stage(st: MemStorage, batch: int, attempt: int, parts: dict[int, list[bytes]]) -> list[pub.StagedFile]:
    files = []
    for p, vals in parts.items():
        name = pub.stage_name("q", batch, p, attempt)
        st.write_atomic(f"{partition_dir('t', p)}/{name}", records.encode(vals, timestamp=T0).tobytes())
        files.append(pub.StagedFile("t", p, name))
    return files


def test_a12_io_error_mid_append_is_fail_stop_and_a_retry_lands_once() -> None:
    st = FailingStorage()
    root = Root(st)
    root.create_topic("t", 2, {"index.interval.bytes": "0"})
    root.append("t", [b"before"], partition=0)
    st.fail_on = "t-0/00000000000000000000.index"  # the index path becomes unwritable
    with pytest.raises(OSError):
        root.append("t", [b"x" * 100, b"y"], partition=0)
    st.fail_on = None
    with pytest.raises(PylogError, match=r"an earlier (write|append or publish) failed"):
        root.append("t", [b"later"], partition=0)  # fail-stop until reopened
    with pytest.raises(InvalidOffsetError, match="an earlier write failed"):
        root.log("t", 0).append([b"later"])  # the log itself too
    assert [r[2] for r in read_storage(st, ["t"])[("t", 0)]] == [b"before"]
    reopened = Root(st.kill())
    reopened.append("t", [b"x" * 100, b"y"], partition=0)  # the client retries
    assert [r[2] for r in read_storage(reopened.storage, ["t"])[("t", 0)]] == [b"before", b"x" * 100, b"y"]


def test_a12_publish_failing_in_one_partition_leaves_nothing_to_acknowledge_later() -> None:
    """A publish that failed on partition 1 after appending to partition 0: the same root's
    next publish must not acknowledge the failed batch's records of partition 0, and the
    replay of the failed batch lands once."""
    st = FailingStorage()
    root = Root(st)
    root.create_topic("t", 2)
    st.fail_on = "t-1/00000000000000000000.log"
    with pytest.raises(OSError):
        root.publish("q", 0, _stage(st, 0, 0, {0: [b"a0"], 1: [b"a1"]}))
    st.fail_on = None
    assert root.last_committed_batch("q") == -1
    with pytest.raises(PylogError, match="close and reopen"):
        root.publish("q", 1, _stage(st, 1, 0, {0: [b"b0"]}))  # the same root goes on: refused
    root.close()
    assert read_storage(st, ["t"]) == {("t", 0): [], ("t", 1): []}
    again = Root(st)  # reopened: batch 0 is replayed, then batch 1
    again.publish("q", 0, _stage(st, 0, 1, {0: [b"a0"], 1: [b"a1"]}))
    again.publish("q", 1, _stage(st, 1, 1, {0: [b"b0"]}))
    served = read_storage(st, ["t"])
    assert [r[2] for r in served[("t", 0)]] == [b"a0", b"b0"] and [r[2] for r in served[("t", 1)]] == [b"a1"]


def test_a_rejected_append_leaves_the_root_usable() -> None:
    """Fail-stop is for errors after bytes were written; an append refused up front (a null key
    on a compacted topic, D30) changes nothing and the root goes on."""
    st = MemStorage()
    root = Root(st)
    root.create_topic("c", 1, {"cleanup.policy": "compact"})
    with pytest.raises(InvalidOffsetError, match="null key"):
        root.append("c", [b"v"], key=[None])
    root.append("c", [b"v"], key=[b"k"])
    assert [r[2] for r in read_storage(st, ["c"])[("c", 0)]] == [b"v"]
