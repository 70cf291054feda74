"""Lock-free readers beside a writer that appends, compacts, runs retention and merges segments.

Kafka's ``LogConcurrencyTest`` for pylog: one writer thread appends to a compacted topic (half
the records under keys written once and never again, which compaction can never remove, half
under a few keys written over and over, which it does remove) and, between appends, rolls,
runs :func:`~pylog.storage.maintenance.runner.maintain` (retention, compaction; merges on object
stores) and merges small segments; reader threads read the whole partition again and again, as
``read_only=True`` roots, which is what Spark tasks and ``pylog consume`` use:

* a fresh root per read (a Spark task), read in small fetches so that each read spans many
  segment changes of the writer;
* one long-lived root reading again and again (``pylog consume``; a streaming query's planner);
* Spark's executor path, :func:`pylog.connector.scan.read_task`.

Every read is checked against what the writer appended: no read fails, every offset of a
write-once key in the range read is there (none may be skipped silently), no offset is served
with a value other than the one appended at it, offsets ascend.  :func:`run` returns the
figures; the test asserts them, the campaign records them.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pylog
from pylog.connector.scan import ReadTask, read_task
from pylog.storage.errors import DataLossError
from pylog.storage.maintenance.merge import merge_small_segments
from pylog.storage.maintenance.runner import maintain
from pylog.storage.partition.log import now_ms
from pylog.storage.root.manager import Root

TOPIC = "c"
HOT_KEYS = 6
REOPEN_S = 10.0
"""A long-lived reader opens the root again after this long (a consumer polling for new data
does; a root is a snapshot, and reading it much longer than file.delete.delay.ms, 60 s, may
find data that retention removed gone, which is reported as such)."""
PREFILL = 320
"""Records appended before the readers start (about 12 kB: retention.bytes is exceeded from the
start)."""


def topic_config(retention: bool) -> dict[str, Any]:
    return {
        "cleanup.policy": "compact,delete" if retention else "compact",
        "segment.bytes": 4096,
        "index.interval.bytes": 128,
        "min.cleanable.dirty.ratio": 0.01,
        "min.compaction.lag.ms": 0,
        "delete.retention.ms": 0,
        **({"retention.bytes": 3_000} if retention else {}),
    }


@dataclass
class Figures:
    """What a run did and found."""

    seconds: float = 0.0
    appended: int = 0  # records
    maintenance_runs: int = 0
    rolls: int = 0
    merges: int = 0  # segments merged away
    compaction_passes: int = 0
    retention_deletes: int = 0  # segments
    reads: int = 0
    records_read: int = 0
    failed_reads: int = 0
    missing_offsets: int = 0  # offsets of write-once keys inside a read's range, not served
    two_valued_offsets: int = 0  # served with another value than appended there
    unordered_reads: int = 0
    relistings: int = 0  # times a reader listed a partition again because the writer changed it
    planned_ranges_lost: int = 0  # Spark tasks whose planned start retention removed before they began
    writer_errors: int = 0
    by_reader: dict[str, dict[str, int]] = field(default_factory=dict)  # reads, failed, missing
    failures: list[str] = field(default_factory=list)

    def count(self, how: str, **figures: int) -> None:
        mine = self.by_reader.setdefault(how, {"reads": 0, "failed": 0, "missing": 0})
        for k, v in figures.items():
            mine[k] += v

    @property
    def violations(self) -> int:
        return (
            self.failed_reads
            + self.missing_offsets
            + self.two_valued_offsets
            + self.unordered_reads
            + self.writer_errors
        )

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "failures"}
        d["violations"] = self.violations
        d["failures"] = self.failures[:10]
        return d


class _Model:
    """The writer's appends: the value at each offset and which offsets hold write-once keys."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.once = np.zeros(0, bool)
        self.lock = threading.Lock()

    def extend(self, values: list[bytes], once: list[bool]) -> None:
        with self.lock:
            self.values.extend(values)
            self.once = np.concatenate([self.once, np.array(once, bool)])

    def snapshot(self) -> tuple[list[bytes], np.ndarray]:
        with self.lock:
            return self.values, self.once


class _Run:
    def __init__(
        self,
        open_root: Callable[..., Root],
        *,
        seconds: float,
        seed: int,
        retention: bool,
        roll: bool,
        readers: int,
        fetch_bytes: int,
        spark_options: Mapping[str, str] | None,
        pause: float,
    ):
        self.open_root = open_root
        self.seconds = seconds
        self.rng = np.random.default_rng(seed)
        self.retention = retention
        self.roll = roll
        self.readers = readers
        self.fetch_bytes = fetch_bytes
        self.spark = spark_options
        self.pause = pause
        self.model = _Model()
        self.fig = Figures()
        self.stop = threading.Event()
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ writer

    def append(self, root: Root, n: int = 0) -> None:
        """``n`` records (default: 4 to 15), half under write-once keys."""
        seq = len(self.model.snapshot()[0])
        n = n or int(self.rng.integers(4, 16))
        once = (self.rng.random(n) < 0.5).tolist()
        keys, values = [], []
        for i in range(n):
            key = f"once-{seq + i}" if once[i] else f"hot-{int(self.rng.integers(HOT_KEYS))}"
            keys.append(key.encode())
            values.append(f"{key}/{seq + i}".encode())
        # the single writer knows the offsets it will get: the model is ready before readers
        # can see them
        self.model.extend(values, once)
        info = root.append(TOPIC, values, key=keys, partition=0)[0]
        if info.first_offset != seq:
            raise AssertionError(f"append got offset {info.first_offset}, expected {seq}")
        self.fig.appended += n

    def writer(self, root: Root) -> None:
        """Appends, with a cycle of changes between them: rolls (on an object store a commit
        seals only segments larger than INLINE_MAX), merges of small segments, retention,
        compaction."""
        step = 0
        while not self.stop.is_set():
            self.append(root)
            step += 1
            if step % 4 in (1, 2) and self.roll:
                root.transaction(lambda: root.writable_log(TOPIC, 0).roll())  # small segments to merge
                self.fig.rolls += 1
            elif step % 8 == 3:
                self.fig.merges += root.transaction(
                    lambda: merge_small_segments(root.writable_log(TOPIC, 0), now=now_ms(), min_segments=2)
                )
            elif step % 8 in (4, 7):
                # compaction every other time (it regroups the small segments the merges want)
                report = maintain(root, now=now_ms(), force=True, compaction=step % 8 == 4)
                self.fig.maintenance_runs += 1
                self.fig.compaction_passes += len(report.cleaning)
                self.fig.retention_deletes += report.segments_deleted
                self.fig.merges += report.segments_merged

    def run_writer(self, root: Root) -> None:
        try:
            self.writer(root)
        except BaseException as e:
            self.fig.writer_errors += 1
            self.fig.failures.append(f"writer: {type(e).__name__}: {e}")
            self.stop.set()

    # ------------------------------------------------------------------ readers

    def check(self, offsets: np.ndarray, values: list[bytes], lo: int, hi: int, how: str) -> None:
        """One read of offsets [lo, hi): every write-once offset there, each with its value."""
        model, once = self.model.snapshot()
        problems = []
        if offsets.size and (np.diff(offsets) <= 0).any():
            self.fig.unordered_reads += 1
            problems.append("offsets not ascending")
        if offsets.size and (offsets.max() >= len(model) or offsets.min() < lo or offsets.max() >= hi):
            self.fig.two_valued_offsets += 1
            problems.append(f"offsets {offsets.min()}..{offsets.max()} outside [{lo}, {hi})")
        else:
            wrong = [int(o) for o, v in zip(offsets.tolist(), values, strict=True) if model[o] != v]
            self.fig.two_valued_offsets += len(wrong)
            if wrong:
                problems.append(f"{len(wrong)} offsets with another value, first {wrong[0]}")
        expected = np.nonzero(once[lo:hi])[0] + lo
        missing = np.setdiff1d(expected, offsets)
        self.fig.missing_offsets += int(missing.size)
        if missing.size:
            problems.append(f"{missing.size} write-once offsets missing, first {int(missing[0])}")
        with self.lock:
            self.fig.reads += 1
            self.fig.count(how, reads=1, missing=int(missing.size))
            self.fig.records_read += int(offsets.size)
            if problems and len(self.fig.failures) < 100:
                self.fig.failures.append(f"{how} [{lo}, {hi}): {'; '.join(problems)}")

    def read_once(self, root: Root, how: str) -> None:
        lg = root.log(TOPIC, 0)
        lo, hi = lg.log_start_offset, lg.log_end_offset
        if how == "spark task":
            task = ReadTask(
                path=self.spark["path"] if self.spark else "",
                topic=TOPIC,
                partition=0,
                start=lo,
                end=hi,
                storage_options={
                    k[len("storage.") :]: v for k, v in (self.spark or {}).items() if k != "path"
                },
            )
            offsets, values = [], []
            try:
                for b in read_task(task, fetch_bytes=self.fetch_bytes):
                    offsets.extend(b.column("offset").to_pylist())
                    values.extend(b.column("value").to_pylist())
            except DataLossError:
                if offsets:
                    raise
                # retention moved the log start past the planned start before the task opened
                # the log: Spark's failOnDataLoss, as with Kafka (not a reader failure)
                with self.lock:
                    self.fig.planned_ranges_lost += 1
                return
            self.check(np.array(offsets, np.int64), values, lo, hi, how)
            return
        offsets, values = [], []
        before = lg.relistings
        for rs in lg.iter_record_sets(lo, hi, max_bytes=self.fetch_bytes):
            t = rs.data_records()
            off = t.column("offset").to_numpy()
            keep = (off >= lo) & (off < hi)
            offsets.append(off[keep])
            values.extend(v for v, k in zip(t.column("value").to_pylist(), keep.tolist(), strict=True) if k)
        with self.lock:
            self.fig.relistings += getattr(lg, "relistings", 0) - before
        self.check(np.concatenate(offsets) if offsets else np.zeros(0, np.int64), values, lo, hi, how)

    def reader(self, index: int) -> None:
        kinds = ["fresh root", "long-lived root", *(["spark task"] if self.spark else [])]
        how = kinds[index % len(kinds)]
        long_lived: Root | None = None
        opened = 0.0
        try:
            while not self.stop.is_set():
                root: Root | None = None
                try:
                    if how == "long-lived root":
                        if long_lived is not None and time.monotonic() - opened > REOPEN_S:
                            long_lived.close()
                            long_lived = None
                        if long_lived is None:
                            long_lived, opened = self.open_root(read_only=True), time.monotonic()
                        root = long_lived
                    else:
                        root = self.open_root(read_only=True)
                    self.read_once(root, how)
                except Exception as e:
                    with self.lock:
                        self.fig.reads += 1
                        self.fig.failed_reads += 1
                        self.fig.count(how, reads=1, failed=1)
                        if len(self.fig.failures) < 100:
                            where = traceback.extract_tb(e.__traceback__)[-9:]
                            trail = " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(where))
                            self.fig.failures.append(f"{how}: {type(e).__name__}: {e} (at {trail})")
                    if root is not None and root is long_lived:
                        long_lived = None  # a consumer that failed starts again with a new root
                finally:
                    if root is not None and root is not long_lived:
                        root.close()
                self.stop.wait(self.pause)
        finally:
            if long_lived is not None:
                long_lived.close()

    # ------------------------------------------------------------------ run

    def run(self) -> Figures:
        root = self.open_root()
        root.create_topic(TOPIC, 1, topic_config(self.retention))
        # enough for retention to start at once (one commit on an object store)
        root.transaction(lambda: [self.append(root, 40) for _ in range(PREFILL // 40)])
        started = time.monotonic()
        writer = threading.Thread(target=self.run_writer, args=(root,), name="writer")
        writer.start()
        readers = [
            threading.Thread(target=self.reader, args=(i,), name=f"reader-{i}") for i in range(self.readers)
        ]
        for t in readers:
            t.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        writer.join()
        for t in readers:
            t.join()
        root.close()
        self.fig.seconds = round(time.monotonic() - started, 1)
        return self.fig


def run(
    url: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    seconds: float = 3.0,
    seed: int = 0,
    retention: bool = True,
    readers: int = 3,
    fetch_bytes: int = 512,
    pause: float = 0.0,
) -> Figures:
    """Run ``readers`` reader threads beside the writer on the root at ``url`` for ``seconds``,
    each reading ``fetch_bytes`` at a time and pausing ``pause`` seconds between reads (the
    writer needs time too: every thread shares one interpreter).  Returns the figures."""
    options = dict(storage_options or {})

    def open_root(read_only: bool = False) -> Root:
        return pylog.open(url, options or None, read_only=read_only)

    spark = {"path": url, **{f"storage.{k}": v for k, v in options.items()}}
    r = _Run(
        open_root,
        seconds=seconds,
        seed=seed,
        retention=retention,
        roll=True,
        readers=readers,
        fetch_bytes=fetch_bytes,
        spark_options=spark,
        pause=pause,
    )
    return r.run()


def campaign(seconds: float, seed: int) -> dict[str, Any]:
    """The campaign's share: two thirds of ``seconds`` on local disk (compaction, retention,
    merges, the default delete delay), one third on moto's S3 server with superseded objects
    deleted at the next commit (compaction and merges; retention would remove data the readers
    have not read yet, which is reported as such by design).  Figures per backend and in all."""
    import contextlib
    import tempfile
    import uuid

    from pylog.storage.backends.objectstore import client as objectstore

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["local"] = run(f"{tmp}/root", seconds=seconds * 2 / 3, seed=seed).as_dict()
    try:
        from tests.conftest import BUCKET, S3Server

        server = S3Server()
    except ImportError as e:  # moto or s3fs missing
        out["s3"] = {"skipped": str(e), "violations": 0}
    else:
        cache = objectstore._CACHE
        objectstore._CACHE = objectstore._BlockCache(max_bytes=0)  # readers in other processes
        try:
            with contextlib.suppress(FileExistsError):  # (moto keeps buckets per process)
                server.filesystem().mkdir(BUCKET)
            options = {**server.options, "pylog.file_delete_delay_ms": "0"}
            url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
            fig = run(
                url,
                options,
                seconds=seconds / 3,
                seed=seed,
                readers=3,
                fetch_bytes=2048,
                pause=0.05,
                retention=False,
            )
            out["s3"] = fig.as_dict()
        finally:
            objectstore._CACHE = cache
            server.stop()
    parts = [f for f in out.values() if "reads" in f]
    for k in ("reads", "records_read", "failed_reads", "missing_offsets", "two_valued_offsets", "relistings"):
        out[k] = sum(f[k] for f in parts)
    out["violations"] = sum(f["violations"] for f in out.values() if isinstance(f, dict))
    return out


__all__ = ["Figures", "campaign", "run"]
