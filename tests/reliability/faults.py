"""I/O errors at every storage step of a writer's recovery (docs/reliability.md).

A *history* leaves a root that the next writer has to recover: a killed writer (unflushed
appends, several segments, two partitions), a log closed cleanly and then damaged (zero bytes
after the active segment's tail, a random-bytes index, a truncated time index), a compaction
killed in the middle of its swap, a publish killed after its data were appended.  For each
history, a fault-free recovery is run once to learn what it serves (the *expected* rows, which
must hold every acknowledged record) and how many storage operations it performs; then, for
``ENOSPC`` and for ``EIO`` (:meth:`MemStorage.fail`), one run per operation k: the disk fails
from the k-th operation the error applies to on, and the writer opens the root and every
partition.  Checked:

* the open either succeeds or fails with a :class:`PylogError` whose message names the file of
  the refused operation (``unnamed_errors`` counts the other failures of a partition's load
  and recovery; ``root_level_raw_errors`` the raw ``OSError``s raised by the root's own steps
  around it - reading ``pylog-topics.json``/``pylog-state.json``, the clean-shutdown marker,
  the root directory's fsync, the truncation to the high watermark - which
  :mod:`pylog.storage.root` does not wrap yet);
* the fault is cleared and a new writer process (a kill copy: the failed one is gone) recovers:
  it serves exactly the expected rows (``lost``: an expected record missing or changed;
  ``phantom``: a record that was not expected), and takes one more append.
"""

from __future__ import annotations

import contextlib
import errno
import random
from collections.abc import Callable
from dataclasses import dataclass

from pylog.storage.errors import PylogError
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.root.manager import Root, partition_dir
from tests.reliability.checker import TP, Row, Stats, open_writer, read_rows
from tests.reliability.crashpoints import COMPACT, SMALL, NamedCrash, rows_of
from tests.reliability.memfs import Crash, MemStorage

T0 = 1_700_000_000_000
SEG0 = "00000000000000000000"
ERRORS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}
NEVER = 10**12


@dataclass
class History:
    """A root needing recovery, and the records that were acknowledged before it stopped."""

    name: str
    storage: MemStorage
    acked: dict[TP, list[bytes]]


def _append(
    root: Root, topic: str, partition: int, values: list[bytes], acked: dict[TP, list[bytes]]
) -> None:
    root.append(topic, rows_of(values), partition=partition)
    acked.setdefault((topic, partition), []).extend(values)


def h_killed_writer(seed: int) -> History:
    """Appends to two partitions with rolls and some flushes; the writer is killed."""
    rng = random.Random(seed)
    st = MemStorage("killed")
    root = Root(st)
    root.create_topic("t", 2, SMALL)
    acked: dict[TP, list[bytes]] = {}
    for i in range(rng.randint(8, 14)):
        p = rng.randrange(2)
        _append(root, "t", p, [b"w%d-%d-%d" % (p, i, j) for j in range(rng.randint(1, 4))], acked)
        if rng.random() < 0.2:
            root.flush()
    return History("killed-writer", st.kill(), acked)


def h_damaged_after_clean_close(seed: int) -> History:
    """A clean close, then outside damage: zero bytes after the tail of t-0's active segment,
    random bytes in an index of t-1, half of a time index gone."""
    rng = random.Random(seed)
    st = MemStorage("damaged")
    root = Root(st)
    root.create_topic("t", 2, SMALL)
    acked: dict[TP, list[bytes]] = {}
    for i in range(12):
        _append(root, "t", i % 2, [b"d%d-%d" % (i, j) for j in range(3)], acked)
    root.close()
    d0, d1 = partition_dir("t", 0), partition_dir("t", 1)
    active = sorted(n for n in st.listdir(d0) if n.endswith(".log"))[-1]
    f = st.open_append(f"{d0}/{active}")
    f.write(bytes(rng.randint(20, 120)))
    f.close()
    indexes = sorted(n for n in st.listdir(d1) if n.endswith(".index") and st.size(f"{d1}/{n}"))
    victim = f"{d1}/{indexes[0]}"
    _rewrite(st, victim, rng.randbytes(st.size(victim)))
    tindexes = sorted(n for n in st.listdir(d0) if n.endswith(".timeindex") and st.size(f"{d0}/{n}") >= 24)
    if tindexes:
        t = f"{d0}/{tindexes[0]}"
        _rewrite(st, t, st.read(t)[: st.size(t) // 2])
    return History("damaged-after-clean-close", st.kill(), acked)


def h_compaction_killed_mid_swap(seed: int) -> History:
    """A compaction killed after some old segments were renamed ``.deleted`` (``.swap`` files
    pending): recovery completes the swap."""
    st = MemStorage("compact")
    root = Root(st)
    root.create_topic("c", 1, COMPACT)
    lg = root.writable_log("c", 0)
    latest: dict[bytes, bytes] = {}  # what compaction must keep: the last value of each key
    per_segment, keys = 4 + seed % 4, 3 + seed % 3
    for seg in range(3):
        vals = [b"c%d-%d" % (seg, i) for i in range(per_segment)]
        ks = [b"k%d" % (i % keys) for i in range(per_segment)]
        root.append("c", rows_of(vals, ks), partition=0)
        latest.update(zip(ks, vals, strict=True))
        lg.roll()
    root.append("c", rows_of([b"tail"], [b"k0"]), partition=0)
    latest[b"k0"] = b"tail"
    acked = {("c", 0): sorted(latest.values())}

    def die(step: str) -> None:
        if step == "renamed-deleted":
            raise NamedCrash(step)

    root.faults.hook = die
    with contextlib.suppress(NamedCrash):
        maintenance.maintain(root, now=T0 + 1000, force=True)
    return History("compaction-killed-mid-swap", st.kill(), acked)


def h_publish_killed(seed: int) -> History:
    """A publish killed after its data were appended and flushed, before its commit: the next
    writer truncates what lies past the high watermark."""
    from tests.reliability.crashpoints import _stage

    st = MemStorage("publish")
    root = Root(st)
    root.create_topic("t", 1, SMALL)
    acked: dict[TP, list[bytes]] = {}
    for i in range(3 + seed % 5):
        _append(root, "t", 0, [b"p%d" % i], acked)

    def die(step: str) -> None:
        if step == "flushed":
            raise NamedCrash(step)

    root.faults.hook = die
    files = _stage(root, "q", 0, 0, {("t", 0): [b"unpublished-%d" % i for i in range(5 + seed % 7)]})
    with contextlib.suppress(NamedCrash):
        root.publish("q", 0, files)
    return History("publish-killed", st.kill(), acked)


HISTORIES: dict[str, Callable[[int], History]] = {
    "killed-writer": h_killed_writer,
    "damaged-after-clean-close": h_damaged_after_clean_close,
    "compaction-killed-mid-swap": h_compaction_killed_mid_swap,
    "publish-killed": h_publish_killed,
}


def _rewrite(st: MemStorage, path: str, data: bytes) -> None:
    st.delete(path)
    f = st.open_append(path)
    f.write(data)
    f.close()


def _served(st: MemStorage) -> tuple[Root, dict[TP, list[Row]]]:
    root = open_writer(st)
    return root, read_rows(root, probes=3)


def _compare(expected: dict[TP, list[Row]], got: dict[TP, list[Row]]) -> tuple[int, int]:
    """(lost, phantom): expected rows missing or changed, rows not expected."""
    lost = phantom = 0
    for tp in set(expected) | set(got):
        want, have = set(expected.get(tp, [])), set(got.get(tp, []))
        lost += len(want - have)
        phantom += len(have - want)
    return lost, phantom


def check_history(history: History, stats: Stats, *, errors: tuple[str, ...] = ("ENOSPC", "EIO")) -> None:
    """Inject each error at every operation of a recovery of ``history``; adds to ``stats``
    (``lost``, ``phantom``; ``extra``: faults_injected, opens_failed, opens_succeeded,
    unnamed_errors, retries) and lists the first failures in ``stats.failures``."""
    ref_root, expected = _served(history.storage.kill())
    ref_root.close()
    for tp, values in history.acked.items():  # the fault-free recovery keeps every acknowledged record
        missing = [v for v in values if v not in {r[2] for r in expected.get(tp, [])}]
        if missing:
            stats.lost += len(missing)
            _note(stats, f"{history.name}: fault-free recovery lost {missing[:3]}")
    for name in errors:
        err = ERRORS[name]
        probe = history.storage.kill()
        counter = probe.fail(err, after=NEVER)
        opened = open_writer(probe)
        steps = counter.seen  # (not those of the close)
        opened.close()
        stats.bump(f"steps_{name}", steps)
        for k in range(steps):
            _one(history, expected, err, name, k, stats)


def _one(history: History, expected: dict[TP, list[Row]], err: int, name: str, k: int, stats: Stats) -> None:
    st = history.storage.kill()
    fault = st.fail(err, after=k)
    where = f"{history.name}, {name} at operation {k}"
    stats.bump("faults_injected")
    try:
        root = open_writer(st)
    except PylogError as e:
        stats.bump("opens_failed")
        refused = fault.failed[0].split(" ", 1)[1] if fault.failed else "?"
        if refused not in str(e):
            stats.bump("unnamed_errors")
            _note(stats, f"{where} ({fault.failed[0]}): the error does not name {refused}: {e}")
    except Crash:
        raise
    except Exception as e:
        stats.bump("opens_failed")
        if _in_partition_load(e):
            stats.bump("unnamed_errors")
            _note(stats, f"{where} ({fault.failed[:1]}): {type(e).__name__}: {e}")
        else:
            stats.bump("root_level_raw_errors")
            stats.__dict__.setdefault("root_level", set()).add(fault.failed[0] if fault.failed else "?")
    else:
        stats.bump("opens_succeeded")
        st.clear_faults()
        lost, phantom = _compare(expected, read_rows(root, probes=0))
        stats.lost += lost
        stats.phantom += phantom
        if lost or phantom:
            _note(stats, f"{where}: the open succeeded serving {lost} lost and {phantom} phantom rows")
        root.close()
    st.clear_faults()
    retry, got = _served(st.kill())  # a new writer process, the disk repaired
    stats.bump("retries")
    lost, phantom = _compare(expected, got)
    stats.lost += lost
    stats.phantom += phantom
    stats.records_checked += sum(len(rows) for rows in got.values())
    stats.recoveries += 1
    if lost or phantom:
        _note(stats, f"{where} ({fault.failed[:1]}): the retry served {lost} lost and {phantom} phantom rows")
    tp = sorted(got)[0]
    retry.append(tp[0], rows_of([b"after-" + where.encode()]), partition=tp[1])
    if read_rows(retry, [tp[0]], probes=0)[tp][-1][2] != b"after-" + where.encode():
        stats.phantom += 1
        _note(stats, f"{where}: the append after the retry is not served last")
    retry.close()


def _in_partition_load(e: BaseException) -> bool:
    """Whether ``e`` was raised inside a partition's load and recovery (``load_log``)."""
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "load_log" and code.co_filename.endswith("loader.py"):
            return True
        tb = tb.tb_next
    return False


def _note(stats: Stats, message: str) -> None:
    failures = stats.__dict__.setdefault("failures", [])
    if len(failures) < 20:
        failures.append(message)


def run_fault_campaign(
    stats: Stats, *, variants: int = 1, seed: int = 0, histories: tuple[str, ...] | None = None
) -> Stats:
    """Every history (or those named) for ``variants`` seeds from ``seed``."""
    for v in range(variants):
        for name in histories or tuple(HISTORIES):
            check_history(HISTORIES[name](seed + v), stats)
            stats.bump("histories")
    return stats


__all__ = ["HISTORIES", "History", "check_history", "run_fault_campaign"]
