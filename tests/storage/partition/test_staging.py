"""Staged segments (what the sink's tasks write on a local disk) and the commit that links them
into a log: offsets assigned by patching each batch's baseOffset, files renamed, indexes valid
as built at staging time; small ones copied into the active segment; bad staged bytes refused
before anything changes."""

from __future__ import annotations

from pathlib import Path

import pytest

import pylog
from pylog.storage.backends import local
from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.errors import CorruptRecordError, RecordTooLargeError
from pylog.storage.partition.loader import load_log
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root
from pylog.storage.root.stage import SegmentStager, open_stager
from pylog.tools.inspect import verify

CONFIG = {"segment.bytes": "20000", "index.interval.bytes": "100"}
PAD = b"x" * 100


def value(batch: int, task: int, i: int) -> bytes:
    return b"b%d-t%d-%05d" % (batch, task, i) + PAD


def stage(
    root: Root, batch: int, task: int, n: int, *, attempt: int = 0, topic: str = "t", writer: str = "q1"
) -> pub.StagedFile:
    """One task's staging of ``n`` records for partition 0, written in chunks of 50."""
    st = open_stager(root.storage, topic, 0, pub.stage_name(writer, batch, task, attempt), root.config(topic))
    for c in range(0, n, 50):
        vals = [value(batch, task, i) for i in range(c, min(n, c + 50))]
        enc = records.encode(vals, None, 1000 + c, base_offset=st.next_offset, batch_bytes=2000)
        st.write(enc.buffer, enc.batches)
    return st.finish()


def values(path: Path, topic: str = "t") -> tuple[list[int], list[bytes]]:
    with pylog.open(path, read_only=True) as r:
        t = r.read_table(topic)
    return t["offset"].to_pylist(), t["value"].to_pylist()


class CountingStorage(LocalStorage):
    """A local disk that counts the bytes read."""

    bytes_read = 0

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        data = super().read(path, start, end)
        self.bytes_read += len(data)
        return data


def test_staged_segments_roll_and_link_with_consecutive_offsets_and_valid_indexes(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    root.append("t", [b"before-%d" % i for i in range(5)], partition=0)
    big, small = stage(root, 0, 0, 400), stage(root, 0, 1, 40)
    assert big.segments is not None and len(big.segments) >= 3  # rolled at segment.bytes
    assert all(s.size <= 20000 for s in big.segments)
    assert [s.base for s in big.segments] == [0, *[s.next_offset for s in big.segments[:-1]]]
    out = root.publish("q1", 0, [big, small], copy_below=1)
    info = out[("t", 0)] if out else None
    assert info is not None and (info.first_offset, info.last_offset, info.num_records) == (5, 444, 440)
    root.append("t", [b"after"], partition=0)
    root.close()

    offsets, vals = values(tmp_path)
    assert offsets == list(range(446))
    want = [b"before-%d" % i for i in range(5)]
    want += [value(0, 0, i) for i in range(400)] + [value(0, 1, i) for i in range(40)] + [b"after"]
    assert vals == want
    names = sorted(p.name for p in (tmp_path / "t-0").iterdir())
    assert not [n for n in names if n.startswith(".pylog")], names  # every staged file linked
    bases = [5 + s.base for s in big.segments] + [405]
    assert all(f"{b:020d}.index" in names and f"{b:020d}.timeindex" in names for b in bases), names
    with pylog.open(tmp_path, read_only=True) as r:
        problems, _ = verify(r)
    assert not problems, problems
    with pylog.open(tmp_path, read_only=True) as r:  # index-guided reads in the linked segments
        for lo in (5, 123, 300, 404, 405, 444):
            assert r.read_table("t", start_offset=lo, end_offset=lo + 1)["value"].to_pylist() == [want[lo]]


def test_linking_reads_headers_only(tmp_path: Path) -> None:
    """The commit moves metadata: a 4 MiB staging is linked reading about 61 bytes per batch."""
    storage = CountingStorage(tmp_path)
    root = Root(storage)
    root.create_topic("t", 1, {"segment.bytes": str(64 << 20)})
    st = open_stager(storage, "t", 0, pub.stage_name("q1", 0, 0, 0), root.config("t"))
    for _ in range(4):
        enc = records.encode([PAD * 100] * 1000, None, 1000, base_offset=st.next_offset, batch_bytes=64 << 10)
        st.write(enc.buffer, enc.batches)
    staged = st.finish()
    assert staged.size is not None and staged.size > 4 << 20
    storage.bytes_read = 0
    root.publish("q1", 0, [staged], copy_below=1 << 20)
    batches = root.writable_log("t", 0).segments[-1].offset_index
    # ~64 batch headers, the indexes, the state: a small fraction of the bytes staged
    assert storage.bytes_read < staged.size / 20, (storage.bytes_read, staged.size)
    assert len(batches) > 0
    root.close()
    assert len(values(tmp_path)[1]) == 4000


def test_small_stagings_are_copied_into_the_active_segment(tmp_path: Path) -> None:
    """Micro-batches below copy_below do not make a segment each."""
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    for b in range(4):
        root.publish("q1", b, [stage(root, b, 0, 10)])
    root.close()
    assert sorted(p.name for p in (tmp_path / "t-0").glob("*.log")) == [f"{0:020d}.log"]
    assert values(tmp_path)[1] == [value(b, 0, i) for b in range(4) for i in range(10)]


def test_an_interrupted_link_runs_again(tmp_path: Path) -> None:
    """Patching sets each baseOffset (idempotent): a link stopped after the patch, or after the
    rename of the indexes, is completed by the next publish of the batch."""
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    root.append("t", [b"a", b"b"], partition=0)
    staged = stage(root, 0, 0, 100)
    lg = root.writable_log("t", 0)

    def stop(step: str) -> None:
        if step == "link-renamed-index":
            raise KeyboardInterrupt  # the process stops here

    lg.faults.hook = stop
    with pytest.raises(KeyboardInterrupt):
        root.publish("q1", 0, [staged], copy_below=1)
    root.close()
    with pylog.open(tmp_path) as writer:  # the half-linked segment lies past the high watermark
        assert writer.writable_log("t", 0).log_end_offset == 2
        out = writer.publish("q1", 0, [stage(writer, 0, 0, 100, attempt=1)], copy_below=1)
        assert out is not None and out[("t", 0)].first_offset == 2
    offsets, vals = values(tmp_path)
    assert offsets == list(range(102)) and vals == [b"a", b"b", *[value(0, 0, i) for i in range(100)]]


def _corrupt(path: Path, position: int, byte: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] = byte
    path.write_bytes(bytes(data))


def test_damaged_staged_segment_is_refused_before_anything_changes(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    root.append("t", [b"a"], partition=0)
    staged = stage(root, 0, 0, 100)
    assert staged.segments is not None
    first = staged.segments[0]
    staged_log = tmp_path / "t-0" / f"{pub.stage_name('q1', 0, 0, 0)}.{first.base:020d}.log.staged"
    size = int.from_bytes(staged_log.read_bytes()[8:12], "big") + 12
    _corrupt(staged_log, size + B.HEADER_AT["magic"], 7)  # the second batch
    with pytest.raises(CorruptRecordError) as info:
        root.publish("q1", 0, [staged], copy_below=1)
    assert staged_log.name in str(info.value) and f"byte {size}" in str(info.value)
    assert root.last_committed_batch("q1") == -1
    assert root.append("t", [b"b"], partition=0)[0].first_offset == 1  # the root is still usable
    root.close()
    assert values(tmp_path)[1] == [b"a", b"b"]


def test_link_enforces_max_message_bytes_of_the_log(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    staged = stage(root, 0, 0, 100)
    root.alter_config("t", {"max.message.bytes": "1000"})
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=1000"):
        root.publish("q1", 0, [staged], copy_below=1)
    root.close()


def test_restaging_an_attempt_removes_what_an_earlier_run_left(tmp_path: Path) -> None:
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    stage(root, 0, 0, 400)  # a driver that died before its commit
    again = stage(root, 0, 0, 30)  # the restarted query stages the batch again, attempt 0
    left = sorted(p.name for p in (tmp_path / "t-0").iterdir() if p.name.startswith(".pylog"))
    assert left == sorted(Path(p).name for p in again.paths() if (tmp_path / p).exists()), (
        left
    )  # only the new staging's files
    root.publish("q1", 0, [again])
    root.close()
    assert values(tmp_path)[1] == [value(0, 0, i) for i in range(30)]


def test_staged_segments_go_around_the_page_cache_unless_the_sink_says_otherwise(tmp_path: Path) -> None:
    """The sink option directWrites (default true): staged ``.log`` files are appended with
    ``O_DIRECT`` (where the file system allows it); false appends them through the page cache,
    so that readers soon after the commit read from memory.  Either way the rows land alike."""
    probe = LocalStorage(tmp_path).open_append("probe", direct=True)
    supported = isinstance(probe, local._DirectAppend)
    probe.close()
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    staged = []
    for batch, direct in ((0, True), (1, False)):
        st = open_stager(
            root.storage, "t", 0, pub.stage_name("q1", batch, 0, 0), root.config("t"), direct=direct
        )
        enc = records.encode(
            [value(batch, 0, i) for i in range(40)], None, 1000, base_offset=0, batch_bytes=2000
        )
        st.write(enc.buffer, enc.batches)
        appender = st._log._seg._file  # type: ignore[attr-defined]
        assert isinstance(appender, local._DirectAppend) == (direct and supported), (direct, appender)
        staged.append(st.finish())
    for batch, files in enumerate(staged):
        root.publish("q1", batch, [files])
    root.close()
    assert values(tmp_path)[1] == [value(b, 0, i) for b in (0, 1) for i in range(40)]


def test_stage_names_parse_and_sweep(tmp_path: Path) -> None:
    name = pub.stage_name("q-1", 3, 2, 1)
    assert pub.parse_stage_name(name) == ("q-1", 3, 2, 1)
    assert pub.parse_stage_name(f"{name}.{40:020d}.timeindex.staged") == ("q-1", 3, 2, 1)
    assert pub.parse_stage_name(f"{name}.{40:020d}.timeindex") is None
    for odd in (".pylog-stage.q.1.2.\u00b2", ".pylog-stage.q.1.2.--3"):  # digits int() refuses: not ours
        assert pub.parse_stage_name(odd) is None
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    staged = stage(root, 5, 0, 300)
    assert len(staged.paths()) >= 6
    assert root.sweep_staged("q1", 4) == 0
    written = [p for p in staged.paths() if (tmp_path / p).exists()]
    assert root.sweep_staged("q1", 5) == len(written) > 0
    assert not [p for p in (tmp_path / "t-0").iterdir() if p.name.startswith(".pylog")]
    root.close()


def test_linked_segments_survive_an_unclean_restart(tmp_path: Path) -> None:
    """The loader recovers linked segments like any other (CRCs, offsets, rebuilt indexes)."""
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    root.publish("q1", 0, [stage(root, 0, 0, 300), stage(root, 0, 1, 300)], copy_below=1)
    # no close: an unclean shutdown; every segment from the recovery point on is recovered
    result = load_log(
        LocalStorage(tmp_path), "t-0", root.config("t"), recovery_point=0, had_clean_shutdown=False
    )
    assert result.recovery.lost_bytes == 0 and not result.recovery.problems
    assert result.log.log_end_offset == 600


def test_object_stores_stage_one_flat_file(tmp_path: Path) -> None:
    """Where files cannot be modified in place, a task stages one file of batches (copied by
    the commit, or carried in the commit message when small)."""

    class NoInPlace(LocalStorage):
        writes_in_place = False

    storage = NoInPlace(tmp_path)
    root = Root(storage)
    root.create_topic("t", 1, CONFIG)
    st = open_stager(storage, "t", 0, pub.stage_name("q1", 0, 0, 0), root.config("t"))
    assert not isinstance(st, SegmentStager)
    enc = records.encode([b"v1", b"v2"], None, 1000, base_offset=st.next_offset)
    st.write(enc.buffer, enc.batches)
    staged = st.finish()
    assert staged.segments is None and staged.paths() == [f"t-0/{pub.stage_name('q1', 0, 0, 0)}"]
    root.publish("q1", 0, [staged])
    root.close()
    assert values(tmp_path)[1] == [b"v1", b"v2"]


def _staged_names(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "t-0").iterdir() if p.name.startswith(".pylog"))


def test_stagings_no_commit_will_publish_are_swept(tmp_path: Path) -> None:
    """A reset checkpoint is a new query: what the old one staged for a batch it never
    committed is removed by a later commit once older than the query retention; a staging of a
    batch its query already published is removed at once; anything else is kept."""
    root = pylog.open(tmp_path)
    root.create_topic("t", 1, CONFIG)
    root.publish("q1", 4, [stage(root, 4, 0, 10)])
    replayed = stage(root, 3, 1, 10)  # a replayed batch of q1 (already published): garbage
    st = open_stager(root.storage, "t", 0, pub.stage_name("q0", 7, 0, 0), root.config("t"))
    enc = records.encode([b"old"], None, 1000, base_offset=0)
    st.write(enc.buffer, enc.batches)
    st.finish()  # q0 died before committing batch 7, and its checkpoint was reset
    assert replayed.paths()
    young = _staged_names(tmp_path)
    now = int(tmp_path.stat().st_mtime * 1000)
    root.publish("q2", 0, [stage(root, 0, 0, 5, writer="q2")], now=now, retention_ms=60_000)
    left = _staged_names(tmp_path)
    assert all(".q0." in n for n in left) and left, left  # q1's replay removed, q0's too young
    assert set(left) <= set(young)
    root.publish("q2", 1, [stage(root, 1, 0, 5, writer="q2")], now=now + 120_000, retention_ms=60_000)
    assert _staged_names(tmp_path) == []
    root.close()
    assert len(values(tmp_path)[1]) == 20
