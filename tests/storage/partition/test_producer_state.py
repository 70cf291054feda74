"""Transactions on read: .txnindex maintenance, last stable offset, read_committed
(Kafka's ProducerStateManager/TransactionIndex tests; TESTING.md E39)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.errors import CorruptRecordError, OffsetOutOfRangeError, PylogError
from pylog.storage.partition import producer_state
from pylog.storage.partition.loader import load_log
from pylog.tools.dump import dump
from tests.storage.compaction_util import DIR, T0, config, open_log, put, reopen

Txn = producer_state.AbortedTxn


def txn(lg, pid: int, value: bytes, key: bytes = b"k") -> int:  # type: ignore[no-untyped-def]
    return put(lg, key, value, producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True)


def marker(lg, kind: int, pid: int) -> int:  # type: ignore[no-untyped-def]
    batch = records.control_batch(kind, offset=0, producer_id=pid, producer_epoch=0, timestamp=T0)
    return lg.append_batches(batch).first_offset


def values(t) -> list[bytes]:  # type: ignore[no-untyped-def]
    return t.column("value").to_pylist()


def all_index_entries(lg) -> list[tuple[int, int, int, int]]:  # type: ignore[no-untyped-def]
    out = []
    for seg in lg.segments:
        e = seg.txn_index.entries()
        cols = (e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
        out += list(zip(*(c.tolist() for c in cols), strict=True))
    return out


def interleaved(root: Path):  # type: ignore[no-untyped-def]
    """0 plain, 1 txn A, 2 txn B, 3 txn A, 4 ABORT A, 5 plain, 6 txn B, 7 COMMIT B, 8 plain."""
    lg = open_log(root, cleanup_policy="delete", segment_bytes=300)
    put(lg, b"p", b"plain-0")
    txn(lg, 1, b"a-1")
    txn(lg, 2, b"b-1")
    txn(lg, 1, b"a-2")
    marker(lg, B.ABORT, 1)
    put(lg, b"p", b"plain-5")
    txn(lg, 2, b"b-2")
    marker(lg, B.COMMIT, 2)
    put(lg, b"p", b"plain-8")
    return lg


def test_txnindex_written_on_abort_with_last_stable_offset(tmp_path: Path) -> None:
    lg = interleaved(tmp_path)
    # aborted A spans [1, 4]; B (open since 2) was the next open transaction: LSO 2
    assert all_index_entries(lg) == [(1, 1, 4, 2)]
    holder = next(s for s in lg.segments if s.base_offset <= 4 < s.read_next_offset())
    assert holder.txn_index.entries().last_offset.tolist() == [4]
    lg.flush()
    out, err = io.StringIO(), io.StringIO()
    path = str(tmp_path / holder.txn_index.path)
    assert dump([path], out=out, err=err) == 0
    assert "producerId: 1 firstOffset: 1 lastOffset: 4 lastStableOffset: 2" in out.getvalue()


def test_read_committed_skips_aborted_data_and_markers(tmp_path: Path) -> None:
    lg = interleaved(tmp_path)
    assert producer_state.last_stable_offset(lg) == lg.log_end_offset == 9
    t = producer_state.read_table(lg)
    assert values(t) == [b"plain-0", b"b-1", b"plain-5", b"b-2", b"plain-8"]
    assert t.column("offset").to_pylist() == [0, 2, 5, 6, 8]
    unc = producer_state.read_table(lg, isolation_level="read_uncommitted")
    assert values(unc) == [b"plain-0", b"a-1", b"b-1", b"a-2", b"plain-5", b"b-2", b"plain-8"]
    assert values(producer_state.read_table(lg, 3, 6)) == [b"plain-5"]
    assert producer_state.read_table(lg, 3, 5).num_rows == 0  # only aborted data and a marker
    with pytest.raises(PylogError, match="isolation level"):
        producer_state.read_table(lg, isolation_level="serializable")
    with pytest.raises(OffsetOutOfRangeError):
        producer_state.read_table(lg, 100)


def test_open_transaction_holds_back_the_last_stable_offset(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="delete")
    put(lg, b"p", b"before")
    first = txn(lg, 5, b"open-1")
    put(lg, b"p", b"after")  # not transactional, but above the LSO: invisible to read_committed
    assert producer_state.last_stable_offset(lg) == first
    assert values(producer_state.read_table(lg)) == [b"before"]
    marker(lg, B.COMMIT, 5)
    assert producer_state.last_stable_offset(lg) == lg.log_end_offset
    assert values(producer_state.read_table(lg)) == [b"before", b"open-1", b"after"]


def test_state_survives_reopen_and_recovery_repairs_the_index(tmp_path: Path) -> None:
    lg = interleaved(tmp_path)
    txn(lg, 3, b"c-open")  # still open at the crash
    lg.flush()
    expected = values(producer_state.read_table(lg))
    lg.close()
    # unclean reopen: recovery rebuilds every segment's indexes, emptying the .txnindex files
    again = reopen(tmp_path, cleanup_policy="delete", segment_bytes=300)
    assert all_index_entries(again) == []
    assert values(producer_state.read_table(again)) == expected  # the scan restores the entry ...
    assert all_index_entries(again) == [(1, 1, 4, 2)]  # ... on disk too
    assert producer_state.last_stable_offset(again) == 9
    marker(again, B.ABORT, 3)  # the first offset of the reopened producer's transaction is known
    assert all_index_entries(again)[-1] == (3, 9, 10, 11)
    assert values(producer_state.read_table(again)) == expected


def test_read_only_reader_uses_scanned_state(tmp_path: Path) -> None:
    lg = interleaved(tmp_path)
    lg.flush()
    for seg in lg.segments:  # as if the index had been lost
        seg.txn_index.delete()
    ro = load_log(LocalStorage(tmp_path), DIR, config(cleanup_policy="delete"), read_only=True).log
    assert values(producer_state.read_table(ro)) == [b"plain-0", b"b-1", b"plain-5", b"b-2", b"plain-8"]
    assert not [n for n in os.listdir(tmp_path / DIR) if n.endswith(".txnindex")]  # nothing written


def test_truncation_invalidates_producer_state(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="delete")
    put(lg, b"p", b"x")
    first = txn(lg, 4, b"open")
    assert producer_state.last_stable_offset(lg) == first
    lg.truncate_to(first)
    assert producer_state.last_stable_offset(lg) == lg.log_end_offset == first
    txn(lg, 4, b"again")
    marker(lg, B.ABORT, 4)
    assert all_index_entries(lg) == [(4, first, first + 1, first + 2)]
    assert values(producer_state.read_table(lg)) == [b"x"]


def test_control_types_and_corrupt_control_key() -> None:
    enc = records.encode([b"v"], [b"k"], T0)
    abort = records.control_batch(B.ABORT, offset=1, producer_id=1, producer_epoch=0, timestamp=T0)
    commit = records.control_batch(B.COMMIT, offset=2, producer_id=1, producer_epoch=0, timestamp=T0)
    data = np.frombuffer(enc.tobytes() + abort + commit, np.uint8)
    h = records.decode(data).batches
    assert producer_state.control_types(data, h).tolist() == [-3, B.ABORT, B.COMMIT]
    bad = records.encode([b"v"], [b"xy"], T0, is_control=True, is_transactional=True, producer_id=1)
    with pytest.raises(CorruptRecordError, match="control record key"):
        producer_state.control_types(bad.buffer, bad.batches)


def test_aborted_batches_by_producer_and_range() -> None:
    enc = records.encode(
        [b"a", b"b", b"c"], None, T0, base_offset=10, is_transactional=True, producer_id=1, batch_bytes=70
    )
    h = enc.batches
    assert len(h) == 3
    aborted = (np.array([1, 2]), np.array([11, 10]), np.array([11, 12]))
    assert producer_state.aborted_batches(h, aborted).tolist() == [False, True, False]


def test_scan_of_large_batches_reads_headers_only(tmp_path: Path) -> None:
    lg = open_log(tmp_path, cleanup_policy="delete", segment_bytes=1 << 20)
    big = b"x" * (producer_state.HOP_MIN_BATCH + 100)
    put(lg, b"p", big)
    txn(lg, 6, big)
    txn(lg, 6, big)
    marker(lg, B.ABORT, 6)
    first = txn(lg, 7, big)  # open at the end
    lg.flush()
    lg.close()
    again = reopen(tmp_path, cleanup_policy="delete", segment_bytes=1 << 20)
    reads: list[tuple[int, int]] = []
    real = again.storage.read

    def spy(path: str, start: int = 0, end: int | None = None) -> bytes:
        reads.append((start, (end or 0) - start))
        return real(path, start, end)

    again.storage.read = spy  # type: ignore[method-assign]
    assert producer_state.last_stable_offset(again) == first
    assert max(n for _, n in reads) < producer_state.HOP_MIN_BATCH  # never a whole data batch
    assert all_index_entries(again) == [(6, 1, 3, 4)]
    assert producer_state.read_table(again).column("offset").to_pylist() == [0]


def test_producer_state_keeps_the_sequences_of_each_producers_last_five_batches(tmp_path: Path) -> None:
    """Idempotent producers: the last five data batches of each producer id, with their sequence
    ranges and offsets, rebuilt from the log (what ``pylog serve`` checks retries against);
    a new epoch starts them over."""
    lg = open_log(tmp_path, cleanup_policy="delete")
    offsets = [put(lg, b"k", b"v%d" % i, producer_id=9, producer_epoch=0, base_sequence=i) for i in range(7)]
    put(lg, b"k", b"other", producer_id=4, producer_epoch=2, base_sequence=0)
    lg.flush()
    lg.close()
    lg = reopen(tmp_path, cleanup_policy="delete")  # the state is scanned from the files
    entry = producer_state.state_of(lg).producers[9]
    assert [(b.first_seq, b.last_seq, b.base_offset) for b in entry.batches] == [
        (i, i, offsets[i]) for i in range(2, 7)
    ]
    assert [b.first_seq for b in producer_state.state_of(lg).producers[4].batches] == [0]
    put(lg, b"k", b"new-epoch", producer_id=9, producer_epoch=1, base_sequence=0)
    assert [b.first_seq for b in producer_state.state_of(lg).producers[9].batches] == [0]
