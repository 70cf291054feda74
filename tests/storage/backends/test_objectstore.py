"""Object-store specifics (storage/backends/objectstore/: storage, keys, orphans, client), on moto.

What a local root has no equivalent of: the commit log (one commit per change, none for a
no-op; more in test_commitlog.py), reader snapshots, ranged GETs, merging the small segments
that sealed commits leave, the delete delay of superseded objects, the orphan sweep, storage options and
credentials, and the put-if-absent probe.  Faults (server restarts, racing writers, lost
responses, crashes at each commit step) are in test_objectstore_faults.py; behaviour shared with
local roots is in the ``backend``-parametrized tests of the other modules."""

from __future__ import annotations

import errno
import logging
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pylog
from pylog.cli import main
from pylog.storage.backends.objectstore import client as objectstore
from pylog.storage.backends.objectstore.client import (
    ConditionalWritesUnsupportedError,
    ObjectClient,
    ObjectStoreError,
)
from pylog.storage.backends.objectstore.commitlog import CHECKPOINT_INTERVAL
from pylog.storage.backends.objectstore.orphans import SWEEP_MARK
from pylog.storage.backends.objectstore.snapshot import LOG, Snapshot, commit_key, commit_number
from pylog.storage.errors import ConfigError, PylogError, StorageError
from pylog.storage.maintenance.runner import maintain
from pylog.storage.root.consumers import read_consumer_offsets, write_consumer_offsets
from pylog.storage.root.manager import Root
from tests.conftest import Backend

T0 = 1_700_000_000_000
SECRET = "S3CRET-XYZ"


# ------------------------------------------------------------------ helpers


_CLIENTS: dict[str, Any] = {}


def client(backend: Backend) -> Any:
    """An s3fs filesystem of the test server, independent of pylog's (no listing cache)."""
    assert backend.server is not None
    fs = _CLIENTS.get(backend.server.endpoint)
    if fs is None:
        fs = _CLIENTS[backend.server.endpoint] = backend.server.filesystem()
    return fs


def keys(backend: Backend, prefix: str = "") -> dict[str, int]:
    """Every object under the root (key relative to it -> size), listed straight from the server."""
    base = backend.url[len("s3://") :]
    found = client(backend).find(f"{base}/{prefix}".rstrip("/"), detail=True)
    return {p[len(base) + 1 :]: int(info["size"]) for p, info in found.items()}


def commit_numbers(backend: Backend) -> list[int]:
    return sorted(n for k in keys(backend, LOG) if (n := commit_number(k)) is not None)


def newest_state(backend: Backend) -> Snapshot:
    with backend.open(read_only=True) as reader:
        return reader.storage.snapshot


def cold_cache() -> None:
    """Forget the process-wide cache of small objects, so that reads go to the server (the cache
    is sound, objects being immutable, but it would hide what is really fetched or deleted)."""
    with objectstore._CACHE._lock:
        objectstore._CACHE._items.clear()
        objectstore._CACHE._bytes = 0


def with_options(backend: Backend, **options: str) -> Backend:
    return Backend(backend.name, backend.url, {**backend.options, **options}, backend.server)


def everything(root: Root, topic: str = "t") -> pa.Table:
    return root.read_table(topic)


def segment_objects(backend: Backend) -> set[str]:
    return {k for k in keys(backend) if ".log." in k and not k.startswith("_pylog/")}


def now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------ manifests


def test_one_commit_per_change_and_none_for_a_no_op(s3_backend: Backend) -> None:
    from tests.storage.root.test_publish import stage

    root = s3_backend.open()
    assert commit_numbers(s3_backend) == [] and root.commits == 0
    expected = 0

    def committed(n: int) -> None:
        nonlocal expected
        expected += n
        assert root.commits == expected
        assert commit_numbers(s3_backend) == list(range(expected))  # 0, 1, ... one per commit
        assert newest_state(s3_backend).number == expected - 1 == root.storage.number

    root.create_topic("t", partitions=2)
    committed(1)
    root.append("t", [b"a", b"b"], key=[b"1", b"2"])  # two partitions, one commit
    committed(1)
    root.alter_config("t", {"retention.ms": 3_600_000})
    committed(1)
    assert root.add_partitions("t", 1) == 3
    committed(1)
    assert root.publish("q", 0, [stage(root, "t", 2, "q", 0, 0, [b"c"])]) is not None
    committed(1)
    root.create_topic("c", config={"cleanup.policy": "compact"})
    for i in range(3):  # each larger than INLINE_MAX: sealed, so the cleaner may clean it
        root.append("c", [b"v%d" % i + b"x" * 5000], key=[b"same"])
    committed(4)
    report = maintain(root, now=now_ms())  # compaction and merging: one commit for the whole run
    assert report.records_removed == 2
    committed(1)

    # no-ops: nothing changes, so nothing is published
    root.create_topic("t", exist_ok=True)
    root.alter_config("t", {"retention.ms": 3_600_000})
    assert root.publish("q", 0, [stage(root, "t", 2, "q", 0, 0, [b"c"], attempt=1)]) is None  # replay
    report = maintain(root, now=now_ms(), force=True)
    assert report.cleaning == [] and report.segments_merged == 0 and report.orphans_deleted == 0
    maintain(root, now=now_ms())
    root.transaction(lambda: root.writable_log("t", 0).read_table())  # a transaction that only reads
    root.close()
    committed(0)
    assert not [k for k in keys(s3_backend) if ".pylog-stage." in k]  # the replay's staged file is gone


# ------------------------------------------------------------------ readers


def test_readers_keep_their_snapshot_until_they_reopen(s3_backend: Backend) -> None:
    writer = s3_backend.open()
    writer.create_topic("t", partitions=2)
    writer.append("t", [b"v%03d" % i for i in range(100)], key=[b"k%d" % i for i in range(100)])
    reader = s3_backend.open(read_only=True)
    before = everything(reader)
    assert before.num_rows == 100
    batches = reader.read_batches("t", max_records=10)  # a scan started before the commits below
    first = next(batches)

    writer.append("t", [b"w%03d" % i for i in range(50)], key=[b"j%d" % i for i in range(50)])  # both parts
    for i in range(8):  # then sealed commits, merged away: the reader's segments are superseded
        writer.append("t", [b"x%d" % i + b"x" * 5000], partition=0)
    assert maintain(writer, now=now_ms()).segments_merged > 0
    cold_cache()

    assert everything(reader).equals(before)  # the old snapshot, all of it, not part of a commit
    rest = pa.Table.from_batches([first, *batches])
    assert rest.num_rows == 100 and rest.equals(before)  # the scan finishes on its snapshot
    again = s3_backend.open(read_only=True)
    assert everything(again).num_rows == 158
    reader.refresh()
    assert everything(reader).equals(everything(again))


def test_reading_a_few_records_of_a_large_partition_uses_ranged_gets(
    s3_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, size = 20_000, 1000  # 20 MB of record values in one segment object
    values = np.frombuffer(np.random.default_rng(7).bytes(n * size), dtype=f"S{size}")
    with s3_backend.open() as writer:
        writer.create_topic("t", config={"segment.bytes": str(256 << 20)})
        writer.append("t", pa.array(values.tolist(), pa.binary()), partition=0, timestamp=T0)
    (log_key,) = segment_objects(s3_backend)
    object_size = keys(s3_backend)[log_key]
    assert object_size > 20_000_000

    reader = s3_backend.open(read_only=True)
    cold_cache()
    store = reader.storage.store
    fetched: list[tuple[str, int | None, int | None, int]] = []
    get = store.get

    def counting_get(key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = get(key, start, end)
        fetched.append((key, start, end, len(data)))
        return data

    monkeypatch.setattr(store, "get", counting_get)
    before = dict(store.requests.counts)
    t = reader.read_table("t", start_offset=12_345, end_offset=12_350)
    assert t.column("offset").to_pylist() == list(range(12_345, 12_350))
    assert t.column("value").to_pylist() == values[12_345:12_350].tolist()
    total = sum(f[3] for f in fetched)
    on_log = [f for f in fetched if f[0] == log_key]
    assert on_log and all(start is not None for _, start, _, _ in on_log)  # never the whole object
    gets = store.requests.counts.get("get", 0) - before.get("get", 0)
    assert gets == len(fetched) <= 4
    # at most the listing of direct objects (staged files) when the partition is first opened
    assert store.requests.counts.get("list", 0) - before.get("list", 0) <= 1
    assert total < object_size / 2, fetched
    assert total < 2 << 20, fetched  # the 1 MiB batch holding the records, the index, a little more


# ------------------------------------------------------------------ merging small segments


@pytest.mark.parametrize("policy", ["delete", "compact"])
def test_maintenance_merges_the_small_segments_of_small_commits(s3_backend: Backend, policy: str) -> None:
    root = s3_backend.open()
    root.create_topic("t", config={"cleanup.policy": policy, "segment.bytes": str(1 << 20)})
    for i in range(30):  # 30 commits of 6 KiB: each seals a small segment
        root.append(
            "t",
            [b"value-%02d-%d-" % (i, j) + b"x" * 2000 for j in range(3)],
            key=[b"key-%02d-%d" % (i, j) for j in range(3)],
            timestamp=T0 + i,
            headers=[[("h", b"%d" % i)]] * 3,
            partition=0,
        )
    before = everything(root)
    segments_before = len(s3_backend.open(read_only=True).log("t", 0).segments)
    assert segments_before >= 30

    report = maintain(root, now=T0 + 60_000)
    root.close()
    assert report.segments_merged > 0 or report.cleaning
    cold_cache()
    with s3_backend.open(read_only=True) as after:
        segments_after = len(after.log("t", 0).segments)
        assert segments_after <= 3 < segments_before
        got = everything(after)
    assert got.equals(before)  # every record, same offsets, keys, values, timestamps, headers
    assert got.column("offset").to_pylist() == list(range(90))


@pytest.mark.parametrize("how", ["SMALL_MAX", "merge_below"])
def test_segments_of_small_max_or_more_are_not_merged(
    s3_backend: Backend, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A segment of SMALL_MAX bytes or more (a Spark task's adopted staging, say) is not small
    whatever segment.bytes; the maintenance after a sink's commit uses a lower bound
    (merge_below=COMMIT_SMALL_MAX), leaving larger segments to a maintenance run of their own."""
    from pylog.storage.maintenance import merge

    if how == "SMALL_MAX":
        monkeypatch.setattr(merge, "SMALL_MAX", 5000)
    root = s3_backend.open()
    root.create_topic("t", config={"segment.bytes": str(1 << 20)})
    for i in range(10):  # 10 commits of ~6 KiB: each seals a segment of more than SMALL_MAX
        root.append("t", [b"v%d-" % i + b"x" * 2000 for _ in range(3)], partition=0)
    for i in range(10):  # 10 commits of ~4.4 KiB (sealed: above INLINE_MAX): small ones, merged
        root.append("t", [b"w%d-" % i + b"x" * 1400 for _ in range(3)], partition=0)
    before = everything(root)
    report = maintain(root, now=T0 + 60_000, **({"merge_below": 5000} if how == "merge_below" else {}))
    assert report.segments_merged == 9  # the 10 small ones became one
    assert len(root.log("t", 0).segments) == 10 + 1 + 1  # the large ones, the merged one, the active one
    assert everything(root).equals(before)
    root.close()


# ------------------------------------------------------------------ deleting superseded objects


def test_superseded_objects_are_deleted_after_the_delay(s3_backend: Backend) -> None:
    # kept while the delay has not passed (a delay no run outlasts, however slow the machine),
    # deleted by the first commit once it has (a short delay)
    backend = with_options(s3_backend, **{"pylog.file_delete_delay_ms": "600000"})
    delay_ms = 1500
    root = backend.open()
    root.create_topic("t")
    for i in range(8):  # each larger than what stays inline in the state: a segment object each
        root.append("t", [b"v%d" % i + b"x" * 5000], partition=0)
    for i in range(CHECKPOINT_INTERVAL * 2):  # two checkpoints: the commits before the first go
        root.append("t", [b"w%d" % i], partition=0)
    data = everything(root)
    small = segment_objects(backend)
    assert len(small) == 8
    old_commits = {commit_key(n) for n in range(newest_state(backend).checkpoints[0].number + 1)}
    assert old_commits and old_commits <= set(keys(backend))
    reader = backend.open(read_only=True)  # reads the small segments

    assert maintain(root, now=now_ms()).segments_merged == 7
    merged_at = time.monotonic()
    present = set(keys(backend))
    assert small <= present and old_commits <= present  # superseded, not yet deleted
    garbage = {k for k, _ in newest_state(backend).garbage}
    assert small | old_commits <= garbage
    cold_cache()
    assert everything(reader).equals(data)  # a reader of the old manifest finishes its work

    root.close()
    time.sleep(max(0.0, delay_ms / 1000 + 0.2 - (time.monotonic() - merged_at)))
    root = with_options(s3_backend, **{"pylog.file_delete_delay_ms": str(delay_ms)}).open()
    root.append("t", [b"late"], partition=0)  # the next commit deletes what is due
    present = set(keys(backend))
    assert not (small & present) and not (old_commits & present)
    assert segment_objects(backend) and commit_numbers(backend)[-1] == root.storage.number
    cold_cache()
    with backend.open(read_only=True) as fresh:
        assert everything(fresh).column("value").to_pylist() == [*data.column("value").to_pylist(), b"late"]


def test_sweep_orphans_removes_only_unreferenced_objects_older_than_the_delay(s3_backend: Backend) -> None:
    root = s3_backend.open()
    root.create_topic("t", partitions=2)
    for i in range(3):
        root.append("t", [b"v%d" % i], key=[b"k%d" % i])
    write_consumer_offsets(root.storage, "my-query", {("t", 0): 1})
    store = root.storage.store
    orphans = ["t-0/00000000000000000042.log.0123456789abcdef", "t-1/00000000000000000007.index.fedcba98"]
    for k in orphans:  # what a writer that crashed between its uploads and its manifest leaves
        store.put(k, b"x" * 100)
    referenced = set(keys(s3_backend)) - set(orphans)
    data = everything(root)

    assert root.sweep_orphans(now_ms()) == 0  # younger than the delay: maybe a commit in flight
    assert set(orphans) <= set(keys(s3_backend))
    assert root.sweep_orphans(now_ms() + store.file_delete_delay_ms + 1000) == 0  # in-flight grace
    later = now_ms() + int(root.storage.orphan_grace_s() * 1000) + 1000
    assert root.sweep_orphans(later) == len(orphans)
    referenced.add(SWEEP_MARK)  # written by each sweep, never swept
    assert set(keys(s3_backend)) == referenced  # every referenced object is still there
    assert root.sweep_orphans(later + 86_400_000) == 0
    assert set(keys(s3_backend)) == referenced
    cold_cache()
    with s3_backend.open(read_only=True) as fresh:
        assert everything(fresh).equals(data)
        assert read_consumer_offsets(fresh.storage)["my-query"] == {("t", 0): 1}


def test_sweep_by_a_root_opened_before_newer_commits_keeps_their_objects(s3_backend: Backend) -> None:
    """A long-lived root (a maintenance loop, a streaming driver) sweeps while other writers commit."""
    first = s3_backend.open()
    first.create_topic("t")
    first.append("t", [b"a"])
    sweeper = s3_backend.open()  # at manifest 1
    other = s3_backend.open()
    other.append("t", [b"b"])  # manifest 2 references a new segment object
    later = now_ms() + int(sweeper.storage.orphan_grace_s() * 1000) + 60_000
    sweeper.sweep_orphans(later)
    maintain(sweeper, now=later)  # nothing to do for it: its snapshot is never refreshed
    cold_cache()
    with s3_backend.open(read_only=True) as fresh:
        assert everything(fresh).column("value").to_pylist() == [b"a", b"b"]


# ------------------------------------------------------------------ storage options and credentials


def test_unknown_and_bad_pylog_options_are_refused(s3_backend: Backend) -> None:
    with pytest.raises(ConfigError, match=r"unknown storage option 'pylog\.nope'") as e:
        pylog.open(s3_backend.url, {**s3_backend.options, "pylog.nope": "1"})
    for valid in objectstore.PYLOG_OPTIONS:
        assert valid in str(e.value)
    with pytest.raises(ConfigError, match=r"'pylog\.retry_timeou' \(did you mean pylog\.retry_timeout_s\?\)"):
        pylog.open(s3_backend.url, {**s3_backend.options, "pylog.retry_timeou": "1"})
    with pytest.raises(
        ConfigError, match=r"pylog\.retry_timeout_s: 'soon' is not valid; valid values: a number"
    ):
        pylog.open(s3_backend.url, {**s3_backend.options, "pylog.retry_timeout_s": "soon"})
    with pytest.raises(
        ConfigError, match=r"pylog\.file_delete_delay_ms: '-1' is not valid; valid values: an integer >= 0"
    ):
        pylog.open(s3_backend.url, {**s3_backend.options, "pylog.file_delete_delay_ms": "-1"})
    with pytest.raises(ConfigError, match="apply to object-store URLs"):
        pylog.open("/tmp/somewhere", {"pylog.retry_timeout_s": "1"})
    assert commit_numbers(s3_backend) == []


def _assert_no_secret(exc: BaseException) -> None:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the whole chain a traceback would print
        seen.add(id(e))
        assert SECRET not in str(e) and SECRET not in repr(e), repr(e)
        e = e.__cause__ or e.__context__


def test_credentials_never_appear_in_errors_reprs_or_logs(
    s3_backend: Backend, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="pylog")
    unreachable = {
        "endpoint_url": "http://127.0.0.1:9",  # nothing listens there
        "key": "AKIDEXAMPLE",
        "secret": SECRET,
        "client_kwargs.region_name": "us-east-1",
        "config_kwargs.retries.max_attempts": 1,
        "pylog.retry_timeout_s": "0",
    }
    with pytest.raises(ObjectStoreError, match=r"127\.0\.0\.1:9") as e:
        pylog.open(s3_backend.url, unreachable)
    _assert_no_secret(e.value)
    with pytest.raises(ConfigError) as e2:  # a bad option beside the credentials
        pylog.open(s3_backend.url, {**unreachable, "pylog.nope": "1"})
    _assert_no_secret(e2.value)
    with pytest.raises(ConfigError, match="storage options given") as e3:
        pylog.open("nosuchprotocol://bucket/p", {"secret": SECRET})
    _assert_no_secret(e3.value)

    # the server accepts any credentials: a working root opened with the secret
    options = {**s3_backend.options, "secret": SECRET}
    root = pylog.open(s3_backend.url, options)
    root.create_topic("t")
    root.append("t", [b"x"])
    for text in (
        repr(root),
        repr(root.storage.store),
        root.storage.describe(),
        str(objectstore.redact(options)),
    ):
        assert SECRET not in text, text
    with pytest.raises(StorageError) as e4:
        pylog.open(s3_backend.url + "-missing", options, read_only=True)
    _assert_no_secret(e4.value)
    with pytest.raises(PylogError) as e5:
        root.read_table("nope")
    _assert_no_secret(e5.value)
    root.close()

    cli = [*s3_backend.cli_args(), "-S", f"secret={SECRET}"]  # the last value of a key wins
    assert main(["describe", s3_backend.url, *cli]) == 0
    assert main(["describe", s3_backend.url + "-missing", *cli]) == 1
    assert main(["create-topic", s3_backend.url, *cli, "t"]) == 1  # already exists
    out = capsys.readouterr()
    assert "no pylog root" in out.err and "already exists" in out.err
    assert SECRET not in out.out + out.err
    assert SECRET not in caplog.text


def test_numeric_storage_options_given_as_strings(
    s3_backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI (-S) and Spark give every storage option as a string."""
    with s3_backend.open() as root:
        root.create_topic("t")
    args = [s3_backend.url, *s3_backend.cli_args(), "-S", "config_kwargs.retries.max_attempts=2"]
    assert main(["describe", *args]) == 0
    assert "topic t" in capsys.readouterr().out


# ------------------------------------------------------------------ opening


def test_read_only_open_of_a_url_without_a_root(s3_backend: Backend) -> None:
    with pytest.raises(
        StorageError,
        match=r"no pylog root here \(no commit under _pylog/log/\)",
    ):
        s3_backend.open(read_only=True)
    root = s3_backend.open()  # a writer may open it: its first commit creates the root
    assert root.topics() == [] and root.storage.number == -1
    root.close()
    assert keys(s3_backend) == {}  # opening created nothing
    with pytest.raises(StorageError, match="no pylog root here"):
        s3_backend.open(read_only=True)


def test_a_store_ignoring_conditional_creates_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    honest, blind = (f"memory://pylog-probe-{uuid.uuid4().hex[:8]}" for _ in range(2))
    try:
        # fsspec's memory filesystem honours exclusive creation ("xb"): writing is allowed
        with pylog.open(honest) as root:
            root.create_topic("t")
            root.append("t", [b"a"])
        with pylog.open(honest, read_only=True) as root:
            assert everything(root).column("value").to_pylist() == [b"a"]

        def create_ignoring_existence(self: ObjectClient, key: str, data: bytes) -> None:
            self.fs.pipe_file(self.path(key), data)  # overwrites: If-None-Match ignored

        monkeypatch.setattr(ObjectClient, "_create_once", create_ignoring_existence)
        root = pylog.open(blind)
        with pytest.raises(ConditionalWritesUnsupportedError, match="does not honour conditional creates"):
            root.create_topic("t")
        assert root.topics() == [] and root.commits == 0
        with pytest.raises(ConditionalWritesUnsupportedError):
            root.create_topic("t")  # refused again: not one commit is ever written
        assert not [p for p in fs.find(blind[len("memory://") :]) if LOG in p]
        with pytest.raises(StorageError, match="no pylog root here"):
            pylog.open(blind, read_only=True)
    finally:
        for url in (honest, blind):
            if fs.exists(url[len("memory://") :]):
                fs.rm(url[len("memory://") :], recursive=True)


def test_a_segment_object_deleted_by_hand_is_named_with_its_offsets(s3_backend: Backend) -> None:
    """A segment's object deleted outside pylog: a reader and a writer get a
    :class:`StorageIOError` (a StorageError, and an OSError with errno ENOENT) naming the file,
    its object and the offsets the segment holds, never a bare ``OSError``."""
    root = s3_backend.open()
    root.create_topic("t", config={"segment.bytes": "20000"})
    for i in range(6):  # each larger than what stays inline: an object per append
        root.append("t", [b"v%d" % i + b"x" * 5000], partition=0)
    root.close()
    objects = sorted(segment_objects(s3_backend))
    gone = next(k for k in objects if k.startswith("t-0/00000000000000000002.log."))
    client(s3_backend).rm(f"{s3_backend.url[len('s3://') :]}/{gone}")
    cold_cache()
    for read_only in (True, False):
        with s3_backend.open(read_only=read_only) as r:
            with pytest.raises(pylog.StorageIOError) as e:
                r.read_table("t")
            message = str(e.value)
            assert message.startswith(f"{s3_backend.url}/t-0/00000000000000000002.log: cannot read")
            assert f"its object {s3_backend.url}/{gone} is missing" in message
            assert "the segment of offsets [2, 3), reading offset 2" in message
            assert isinstance(e.value, StorageError) and isinstance(e.value, OSError)
            assert e.value.errno == errno.ENOENT
            # the offsets of the other segments stay readable
            assert r.read_table("t", start_offset=3).column("offset").to_pylist() == [3, 4, 5]
