"""Crash-point enumeration: every multi-step storage operation, crashed after each step in turn.

A :class:`Scenario` builds a root on a fresh :class:`MemStorage` (``setup``, deterministic) and
names one operation (``action``).  :func:`enumerate_scenario` first runs the operation once to
count its steps - every mutating file operation, and every named step the code reports through
the fault-injection seam (``Root.faults``/``Log.faults``, :mod:`pylog.storage.faults`) - and
then, for each step k, rebuilds the same root, crashes right after step k, and recovers from

* a process kill (the page cache survives: every byte and name written so far), and
* a power cut (only what was fsynced: names as of each directory's last fsync),

checking that a lock-free reader and then the recovering writer serve the state *before* or the
state *after* the operation - never a mix - with every acknowledged record at its offset
(DESIGN.md §6.1-6.4), and that the outcome switches from "before" to "after" once, at the
operation's commit point.  Scenarios may check more (a replayed publish is skipped exactly when
its batch is found committed, a created topic is complete, ...).
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pylog.storage.backends.base import Storage
from pylog.storage.backends.objectstore import commitlog
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.codec import records
from pylog.storage.maintenance import retention
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from pylog.storage.root.stage import open_stager
from tests.reliability.checker import TP, InvariantViolation, Row, Stats, read_rows, read_storage
from tests.reliability.memfs import Crash, MemStorage
from tests.reliability.worlds import World, new_world

T0 = 1_700_000_000_000
Served = dict[TP, list[Row]]


class NamedCrash(Crash):
    """Raised by a step hook: the process stops at a named step."""


@dataclass
class Context:
    storage: Storage
    root: Root
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scenario:
    """``phases`` run in order; each is one atomic change (a publish, then the retention that
    follows it, ...).  ``kind``: "atomic" - a crash leaves the state after some number of whole
    phases, a number that never decreases as the crash point moves later; "between" - the
    result lies between before and after (one compaction pass rewriting several segment
    groups, each its own commit: every record of after is kept, nothing not in before appears);
    "content" - nothing served changes (checkpoints, close)."""

    name: str
    setup: Callable[[Storage], Context]
    phases: list[Callable[[Context], None]]
    kind: str = "atomic"
    after_recovery: Callable[[Context, Root, int], None] | None = None  # (ctx, writer, phases done)
    topics: tuple[str, ...] = ()
    worlds: tuple[str, ...] = ("local", "object")  # where it runs (see tests.reliability.worlds)
    delete_delay_ms: int = 0  # an object store's pylog.file_delete_delay_ms

    def world(self, label: str) -> World:
        return new_world(label, self.name, delete_delay_ms=self.delete_delay_ms)

    def action(self, ctx: Context) -> None:
        for phase in self.phases:
            phase(ctx)


def rows_of(values: list[bytes], keys: list[bytes] | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "key": pa.array(keys or [b"k%d" % (i % 3) for i in range(n)], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array([T0 + i for i in range(n)], pa.int64()),
        }
    )


def _fill(root: Root, topic: str, partition: int, prefix: str, n: int, per_call: int = 3) -> None:
    for i in range(0, n, per_call):
        vals = [f"{prefix}-{j:04d}".encode() for j in range(i, min(n, i + per_call))]
        root.append(topic, rows_of(vals), partition=partition)


def _stage(
    root: Root, sink: str, batch: int, attempt: int, parts: dict[TP, list[bytes]], *, segments: bool = False
) -> list[pub.StagedFile]:
    """One task per partition stages ``parts``: a flat file of batches (an object store's
    staging), or with ``segments`` staged segments with indexes (a local disk's, which the
    publish links or copies)."""
    files = []
    for task, ((topic, p), vals) in enumerate(sorted(parts.items())):
        name = pub.stage_name(sink, batch, task, attempt)
        keys = [b"k%d" % (i % 3) for i in range(len(vals))]
        if segments:
            stager = open_stager(root.storage, topic, p, name, root.config(topic))
            for i in range(0, len(vals), 2):  # several writes: staged segments roll
                enc = records.encode(
                    vals[i : i + 2],
                    key=keys[i : i + 2],
                    timestamp=T0,
                    batch_bytes=120,
                    base_offset=stager.next_offset,
                )
                stager.write(enc.buffer, enc.batches)
            files.append(stager.finish())
            continue
        enc = records.encode(vals, key=keys, timestamp=T0, batch_bytes=120)
        f = root.storage.open_append(f"{partition_dir(topic, p)}/{name}")
        f.write(enc.buffer.data)
        f.close()
        files.append(pub.StagedFile(topic, p, name))
    return files


# ============================================================================ scenarios


def _root(st: Storage, topics: dict[str, tuple[int, dict[str, str]]]) -> Root:
    root = Root(st)
    for t, (n, cfg) in topics.items():
        root.create_topic(t, n, cfg)
    return root


SMALL = {"segment.bytes": "400", "index.interval.bytes": "60"}


def s_append_roll(st: Storage) -> Context:
    root = _root(st, {"t": (2, SMALL)})
    _fill(root, "t", 0, "a", 7)
    _fill(root, "t", 1, "b", 4)
    return Context(st, root)


def a_append_roll(ctx: Context) -> None:
    # a multi-partition acknowledged append that rolls a segment in each partition
    vals = [b"new-%02d" % i for i in range(8)]
    t = rows_of(vals)
    t = t.append_column("partition", pa.array([i % 2 for i in range(8)], pa.int32()))
    ctx.root.append("t", t)


def s_publish(st: Storage) -> Context:
    root = _root(st, {"t": (2, SMALL), "u": (1, SMALL)})
    root.publish("q", 0, _stage(root, "q", 0, 0, {("t", 0): [b"p0-a", b"p0-b"], ("u", 0): [b"p0-c"]}))
    parts = {("t", 0): [b"p1-%d" % i for i in range(5)], ("t", 1): [b"p1-x"], ("u", 0): [b"p1-y", b"p1-z"]}
    files = _stage(root, "q", 1, 0, parts)
    return Context(st, root, {"files": files, "parts": parts})


def s_publish_linked(st: Storage) -> Context:
    """A local disk's publish: staged segments linked into the logs (the larger ones: patched
    and renamed) or copied (those below ``copy_below``), across a segment roll."""
    root = _root(st, {"t": (2, SMALL), "u": (1, SMALL)})
    root.publish("q", 0, _stage(root, "q", 0, 0, {("t", 0): [b"p0-a", b"p0-b"], ("u", 0): [b"p0-c"]}))
    parts = {
        ("t", 0): [b"p1-%d" % i for i in range(9)],
        ("t", 1): [b"p1-x"],
        ("u", 0): [b"p1-y", b"p1-z", b"p1-w"],
    }
    files = _stage(root, "q", 1, 0, parts, segments=True)
    if not any(len(f.segments or ()) > 1 for f in files):
        raise InvariantViolation(f"the scenario must stage several segments for one partition: {files}")
    return Context(st, root, {"files": files, "parts": parts, "segments": True, "copy_below": 150})


def a_publish(ctx: Context) -> None:
    out = ctx.root.publish(
        "q", 1, ctx.extra["files"], copy_below=ctx.extra.get("copy_below", pub.COPY_BELOW_BYTES)
    )
    if out is None:
        raise InvariantViolation("first publish of batch 1 was skipped")


def r_publish(ctx: Context, writer: Root, done: int) -> None:
    """Spark replays the batch with freshly staged data: skipped exactly when committed."""
    committed = done == 1
    if (writer.last_committed_batch("q") >= 1) != committed:
        raise InvariantViolation(f"sink record says batch 1 committed={not committed}, data says {committed}")
    again = _stage(writer, "q", 1, 1, ctx.extra["parts"], segments=ctx.extra.get("segments", False))
    out = writer.publish("q", 1, again)
    if (out is None) != committed:
        raise InvariantViolation(f"replay of batch 1 returned {out} although committed={committed}")
    served = read_rows(writer, ("t", "u"))
    vals = [r[2] for rows in served.values() for r in rows]
    if len(vals) != len(set(vals)) or not all(v in vals for vs in ctx.extra["parts"].values() for v in vs):
        raise InvariantViolation(f"after the replay, batch 1 is not there exactly once: {served}")
    left = [n for t, p in served for n in writer.storage.listdir_staged(partition_dir(t, p))]
    if left:
        raise InvariantViolation(f"staged files left after the replay: {left}")


def s_sink_commit(st: Storage) -> Context:
    """The sink's commit: publish, then embedded retention on the touched partitions."""
    cfg = {**SMALL, "retention.bytes": "500"}
    root = _root(st, {"t": (1, cfg)})
    for b in range(3):
        root.publish("q", b, _stage(root, "q", b, 0, {("t", 0): [b"b%d-%d" % (b, i) for i in range(4)]}))
    parts = {("t", 0): [b"b3-%d" % i for i in range(4)]}
    return Context(st, root, {"files": _stage(root, "q", 3, 0, parts), "parts": parts})


def a_sink_publish(ctx: Context) -> None:
    ctx.root.publish("q", 3, ctx.extra["files"])


def a_sink_maintain(ctx: Context) -> None:
    maintenance.maintain(ctx.root, now=T0 + 10, partitions=[("t", 0)])


COMPACT = {"cleanup.policy": "compact", "segment.bytes": "100000", "min.cleanable.dirty.ratio": "0.01"}


def s_compact(st: Storage) -> Context:
    root = _root(st, {"c": (1, COMPACT)})
    lg = root.writable_log("c", 0)
    for seg in range(3):
        vals = [b"c%d-%d" % (seg, i) for i in range(6)]
        root.append("c", rows_of(vals, [b"k%d" % (i % 4) for i in range(6)]), partition=0)
        lg.roll()
    root.append("c", rows_of([b"tail"], [b"k0"]), partition=0)
    return Context(st, root)


def a_compact(ctx: Context) -> None:
    maintenance.maintain(ctx.root, now=T0 + 1000, force=True)


MULTI = {"cleanup.policy": "compact", "segment.bytes": "260", "min.cleanable.dirty.ratio": "0.01"}


def s_compact_groups(st: Storage) -> Context:
    root = _root(st, {"c": (1, MULTI)})
    for i in range(16):
        root.append("c", rows_of([b"v%02d" % i], [b"k%d" % (i % 5)]), partition=0)
    return Context(st, root)


RETAIN = {"segment.bytes": "300", "retention.bytes": "350"}


def s_retain(st: Storage) -> Context:
    root = _root(st, {"r": (1, RETAIN)})
    _fill(root, "r", 0, "r", 20, per_call=2)
    root.flush()
    return Context(st, root)


def a_retain(ctx: Context) -> None:
    lg = ctx.root.writable_log("r", 0)
    retention.retain(lg, now=T0 + 10)


def a_retain_all(ctx: Context) -> None:
    """Retention that removes every segment: the active one is rolled first."""
    lg = ctx.root.writable_log("r", 0)
    lg.config = lg.config.with_overrides({"retention.ms": "1"})
    retention.retain(lg, now=T0 + 10_000_000)


def s_checkpoint(st: Storage) -> Context:
    root = _root(st, {"t": (2, SMALL)})
    _fill(root, "t", 0, "a", 6)
    _fill(root, "t", 1, "b", 2)
    root.writable_log("t", 1).append([b"unacked"], timestamp=T0)  # past the high watermark
    return Context(st, root)


def a_close(ctx: Context) -> None:
    ctx.root.close()


def a_checkpoint(ctx: Context) -> None:
    ctx.root.flush()


def s_empty(st: Storage) -> Context:
    root = _root(st, {"other": (1, {})})
    _fill(root, "other", 0, "o", 2)
    return Context(st, root)


def s_bare(st: Storage) -> Context:
    return Context(st, Root(st))


def a_create_topic(ctx: Context) -> None:
    ctx.root.create_topic("t", 3, {"cleanup.policy": "compact"})


def r_create_topic(ctx: Context, writer: Root, done: int) -> None:
    if "t" in writer.topics() and (writer.partitions("t") != 3 or not writer.config("t").compact):
        raise InvariantViolation(
            f"half-created topic: {writer.partitions('t')} partitions, compact={writer.config('t').compact}"
        )
    writer.create_topic("t", 3, {"cleanup.policy": "compact"}, exist_ok=True)
    if writer.partitions("t") != 3 or not writer.config("t").compact:
        raise InvariantViolation("create_topic(exist_ok=True) did not complete a half-created topic")


def s_unclean(st: Storage) -> Context:
    """A writer that died in the middle of a publish (data appended past the high watermark,
    a segment rolled): the next writer's recovery truncates it."""
    root = _root(st, {"t": (1, SMALL)})
    _fill(root, "t", 0, "a", 5)

    def die(step: str) -> None:
        if step == "flushed":
            raise NamedCrash(step)

    root.faults.hook = die
    files = _stage(root, "q", 0, 0, {("t", 0): [b"lost-%d" % i for i in range(9)]})
    with contextlib.suppress(NamedCrash):
        root.publish("q", 0, files)
    assert isinstance(st, MemStorage)  # a local disk's recovery (object stores have none)
    st2 = st.kill()  # the process died; the next one opens the files
    _swap_storage(st, st2)
    return Context(st, Root(st))


def _swap_storage(dst: MemStorage, src: MemStorage) -> None:
    dst.__dict__.update(src.__dict__)


def a_recover(ctx: Context) -> None:
    for p in range(ctx.root.partitions("t")):
        ctx.root.writable_log("t", p)
    ctx.root.append("t", rows_of([b"after-recovery"]), partition=0)


# ---------------------------------------------------------------- object stores only


@contextlib.contextmanager
def _checkpoint_every_commit() -> Iterator[None]:
    was = commitlog.CHECKPOINT_INTERVAL
    commitlog.CHECKPOINT_INTERVAL = 1
    try:
        yield
    finally:
        commitlog.CHECKPOINT_INTERVAL = was


def s_objects(st: Storage) -> Context:
    root = _root(st, {"t": (2, {"segment.bytes": "100000"})})
    _fill(root, "t", 0, "a", 6)
    _fill(root, "t", 1, "b", 3)
    root.append("t", rows_of([b"big-0-" + b"x" * 5000]), partition=1)  # a sealed segment object
    return Context(st, root)


def a_append_checkpoint(ctx: Context) -> None:
    """An append that seals segment objects in both partitions, in a commit that writes a
    checkpoint and the hint and deletes what the checkpoint made garbage."""
    vals = [b"big-%02d-" % i + b"x" * 1500 for i in range(8)]
    t = rows_of(vals).append_column("partition", pa.array([i % 2 for i in range(8)], pa.int32()))
    with _checkpoint_every_commit():
        ctx.root.append("t", t)


def s_race(st: Storage) -> Context:
    """Another writer (of another topic) commits between this writer's snapshot and its commit:
    the commit is re-based onto it."""
    assert isinstance(st, ObjectStorage)
    root = _root(st, {"t": (1, SMALL), "u": (1, SMALL)})
    _fill(root, "t", 0, "a", 2)
    other_st = ObjectStorage(st.store)
    other_st.mergers = dict(st.mergers)
    other = Root(other_st)
    other.append("u", rows_of([b"other-writer"]), partition=0)
    return Context(st, root)


def a_rebased_append(ctx: Context) -> None:
    rebases = ctx.storage.rebases  # type: ignore[attr-defined]
    ctx.root.append("t", rows_of([b"rebased"]), partition=0)
    if ctx.storage.rebases != rebases + 1:  # type: ignore[attr-defined]
        raise InvariantViolation("the append was not re-based onto the other writer's commit")


SCENARIOS = [
    Scenario("append+roll", s_append_roll, [a_append_roll], topics=("t",)),
    Scenario("publish", s_publish, [a_publish], after_recovery=r_publish, topics=("t", "u")),
    Scenario("publish-linked", s_publish_linked, [a_publish], after_recovery=r_publish, topics=("t", "u")),
    Scenario("sink-commit+retention", s_sink_commit, [a_sink_publish, a_sink_maintain], topics=("t",)),
    Scenario("compaction-swap", s_compact, [a_compact], topics=("c",)),
    Scenario("compaction-groups", s_compact_groups, [a_compact], kind="between", topics=("c",)),
    Scenario("retention-delete", s_retain, [a_retain], kind="between", topics=("r",), worlds=("local",)),
    Scenario(
        "retention-delete-all", s_retain, [a_retain_all], kind="between", topics=("r",), worlds=("local",)
    ),
    Scenario("checkpoint", s_checkpoint, [a_checkpoint], kind="content", topics=("t",), worlds=("local",)),
    Scenario("close", s_checkpoint, [a_close], kind="content", topics=("t",), worlds=("local",)),
    Scenario("create-topic", s_empty, [a_create_topic], after_recovery=r_create_topic, topics=("other", "t")),
    Scenario("create-first-topic", s_bare, [a_create_topic], after_recovery=r_create_topic, topics=("t",)),
    Scenario("writer-recovery", s_unclean, [a_recover], topics=("t",), worlds=("local",)),
    Scenario("append+checkpoint", s_objects, [a_append_checkpoint], topics=("t",), worlds=("object",)),
    Scenario(
        "rebased-append",
        s_race,
        [a_rebased_append],
        topics=("t", "u"),
        worlds=("object",),
        delete_delay_ms=60_000,  # a state this young is still trusted: the commit races, then re-bases
    ),
]


# ============================================================================ enumeration


@dataclass
class Outcome:
    step: str
    kind: str  # kill | power
    phases_done: int  # "between" scenarios: records removed so far
    records: int = 0  # records the recovered writer served (all checked)


def _values(served: Served) -> dict[TP, list[tuple[int, bytes]]]:
    return {tp: [(r[0], r[2]) for r in rows] for tp, rows in served.items() if rows}


def _serve(world: World, topics: tuple[str, ...]) -> tuple[Served, Root, Served]:
    reader = Root(world.open(read_only=True), read_only=True)
    try:
        served_r = read_rows(reader, topics, probes=3)
    finally:
        reader.close()
    writer = Root(world.open())
    for t in writer.topics():
        for p in range(writer.partitions(t)):
            writer.writable_log(t, p)
    return served_r, writer, read_rows(writer, topics, probes=2)


def _classify(sc: Scenario, got: Served, states: list[Served], who: str, where: str) -> int:
    """How many phases ``got`` reflects; raises if it is no state the scenario allows."""
    g = _values(got)
    vals = [_values(s) for s in states]
    if sc.kind == "content":
        if g != vals[0]:
            raise InvariantViolation(f"{sc.name} {where}: {who} serves {g}, expected the unchanged {vals[0]}")
        return 0
    if sc.kind != "between":
        for i in range(len(vals) - 1, -1, -1):
            if g == vals[i]:
                return i
    else:
        b, a = vals[0], vals[-1]
        for tp in set(g) | set(a) | set(b):
            gs, bs, as_ = set(g.get(tp, [])), set(b.get(tp, [])), set(a.get(tp, []))
            if not as_ <= gs <= bs:
                raise InvariantViolation(
                    f"{sc.name} {where}: {who} serves {sorted(gs)} at {tp}, not between before {sorted(bs)} "
                    f"and after {sorted(as_)}"
                )
        return sum(len(v) for v in b.values()) - sum(len(v) for v in g.values())  # records removed
    raise InvariantViolation(
        f"{sc.name} {where}: {who} serves {g}\n  which is none of the states "
        + "\n  ".join(f"after {i} phases: {v}" for i, v in enumerate(vals))
    )


_STATES: dict[tuple[str, str], list[Served]] = {}


def states_of(sc: Scenario, world: str = "local") -> list[Served]:
    """What a reader is served before the operation and after each of its phases (no crash)."""
    if (sc.name, world) not in _STATES:
        w = sc.world(world)
        ctx = sc.setup(w.open())
        states = [read_storage(w.open(read_only=True), sc.topics)]
        for phase in sc.phases:
            phase(ctx)
            states.append(read_storage(w.open(read_only=True), sc.topics))
        _STATES[(sc.name, world)] = states
    return _STATES[(sc.name, world)]


def _arm_named(ctx: Context, hook: Callable[[str], None]) -> None:
    ctx.root.faults.hook = hook
    if isinstance(ctx.storage, ObjectStorage):  # an object store's commit steps
        ctx.storage.faults.hook = hook


def run_crash(sc: Scenario, *, how: str, k: int, kind: str, world: str = "local") -> Outcome:
    """Run ``sc``, crash after its k-th storage step (``how="step"``) or named step
    (``how="named"``), recover from a ``kind`` crash (the world's: "kill", "power",
    "lost-reply") and check."""
    w = sc.world(world)
    ctx = sc.setup(w.open())
    if how == "step":
        w.crash_after(k, kind)
    else:
        seen = [0]

        def hook(name: str) -> None:
            seen[0] += 1
            if seen[0] == k:
                raise NamedCrash(name)

        _arm_named(ctx, hook)
    try:
        sc.action(ctx)
        if kind != "lost-reply":
            raise AssertionError(f"{sc.name}: no crash at {how} step {k}")
        label = f"step {k} ({w.steps[k - 1] if len(w.steps) >= k else '?'}), its reply lost"
    except NamedCrash as e:
        label = f"named step {k} ({e})"
    except Crash:
        label = f"step {k} ({w.steps[-1] if w.steps else '?'})"
    w.crash_after(None)
    after = w.survivor("power" if kind == "power" else "kill", random.Random(k))
    return _recover(sc, ctx, after, label, kind, world)


def _recover(sc: Scenario, ctx: Context, w: World, label: str, kind: str, world: str) -> Outcome:
    states = states_of(sc, world)
    where = f"{world} root, crash after {label}, {kind}"
    served_r, writer, served_w = _serve(w, sc.topics)
    done = _classify(sc, served_w, states, "recovered writer", where)
    seen_by_reader = _classify(sc, served_r, states, "reader", where)
    if seen_by_reader > done and sc.kind != "between":
        raise InvariantViolation(
            f"{sc.name} {where}: a reader saw more of the operation than the writer kept"
        )
    if kind == "lost-reply" and sc.kind == "atomic" and done != len(sc.phases):
        raise InvariantViolation(f"{sc.name} {where}: the operation completed, but its result is not served")
    if sc.after_recovery is not None:
        sc.after_recovery(ctx, writer, done)
    # the recovered root keeps working: one more acknowledged append, then a clean reopen
    t = sc.topics[0]
    mark = b"post-" + label.encode()
    writer.append(t, rows_of([mark]), partition=0)
    writer.close()
    again = Root(w.open(read_only=True), read_only=True)
    try:
        final = read_rows(again, sc.topics, probes=0)
    finally:
        again.close()
    last = final[(t, 0)][-1]
    if last[2] != mark or any(r[0] >= last[0] for r in final[(t, 0)][:-1]):
        raise InvariantViolation(f"{sc.name} {where}: the append after recovery is served as {last}")
    return Outcome(label, kind, done, sum(len(rows) for rows in served_w.values()))


def count_steps(sc: Scenario, world: str = "local") -> tuple[int, list[str]]:
    """(number of storage steps, names of the named steps) of the scenario's operation."""
    w = sc.world(world)
    ctx = sc.setup(w.open())
    names: list[str] = []
    _arm_named(ctx, names.append)
    start = w.step_count
    sc.action(ctx)
    return w.step_count - start, names


def enumerate_scenario(
    sc: Scenario, stats: Stats | None = None, kinds: tuple[str, ...] | None = None, world: str = "local"
) -> list[Outcome]:
    """Crash ``sc`` after every storage step and every named step, for each kind of crash;
    checks that the outcome never goes back to an earlier phase as the crash point moves on."""
    n, names = count_steps(sc, world)
    outcomes: list[Outcome] = []
    for kind in kinds or sc.world(world).kinds:
        seq = [run_crash(sc, how="step", k=k, kind=kind, world=world) for k in range(1, n + 1)]
        if sc.kind != "content":
            done = [o.phases_done for o in seq]
            if any(b < a for a, b in itertools.pairwise(done)):
                raise InvariantViolation(
                    f"{sc.name} ({world}, {kind}): the outcome went back to an earlier state: "
                    + " ".join(str(o.phases_done) for o in seq)
                    + "\n"
                    + "\n".join(f"{o.step}={o.phases_done}" for o in seq)
                )
        outcomes.extend(seq)
        if kind != "lost-reply":
            outcomes.extend(
                run_crash(sc, how="named", k=k, kind=kind, world=world) for k in range(1, len(names) + 1)
            )
    if stats is not None:
        stats.crash_points += len(outcomes)
        stats.kills += sum(o.kind == "kill" for o in outcomes)
        stats.power_cuts += sum(o.kind == "power" for o in outcomes)
        stats.recoveries += len(outcomes)
        stats.records_checked += sum(o.records for o in outcomes)
        lost = sum(o.kind == "lost-reply" for o in outcomes)
        if lost:
            stats.bump("lost_replies", lost)
    return outcomes


__all__ = ["SCENARIOS", "Outcome", "Scenario", "count_steps", "enumerate_scenario", "run_crash", "states_of"]
