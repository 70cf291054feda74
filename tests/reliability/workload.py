"""A seeded random writer over a :class:`MemStorage`, crashed again and again (power cuts, kills),
or over an in-memory object store (``world="object"``: killed after a random request; see
:mod:`tests.reliability.worlds`).

:class:`PowerCutWorkload` drives a :class:`Root` with the operations a pylog writer performs -
acknowledged appends (``Root.append``, rolling small segments), exactly-once sink publishes
(``Root.publish`` of staged files), flushes, checkpoints, explicit rolls, retention and
compaction (``maintenance.maintain``), clean close and reopen, and reads by a concurrent
lock-free reader - and crashes the storage after a random number of file operations.  After
each crash the durable state (or, for a simulated kill, the whole page cache) becomes the next
"disk"; a reader and then a recovering writer must serve every acknowledged record once, at its
offset, in order, and an interrupted operation entirely or not at all (see :mod:`checker`).  An
interrupted publish is then replayed with freshly staged data, as Spark does: it must be skipped
exactly when its batch was found committed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pylog.storage.codec import records
from pylog.storage.errors import PylogError
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from pylog.storage.root.stage import open_stager
from tests.reliability.checker import TP, InvariantViolation, Model, Row, Stats, log_starts, read_rows
from tests.reliability.memfs import Crash
from tests.reliability.worlds import World, new_world

T0 = 1_700_000_000_000

TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    "plain": (2, {"segment.bytes": "700", "index.interval.bytes": "100"}),
    "compacted": (
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "700",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    ),
    "retained": (1, {"segment.bytes": "700", "retention.bytes": "1400", "index.interval.bytes": "50"}),
}
SINK = "sink-a"


@dataclass
class Inflight:
    kind: str  # append | publish | other
    values: dict[TP, list[bytes]] = field(default_factory=dict)
    rows: dict[TP, list[Row]] = field(default_factory=dict)  # keys, for replays
    batch: int = -1


class PowerCutWorkload:
    """One seeded history of operations and crashes; :meth:`run` returns its :class:`Stats`."""

    def __init__(
        self,
        seed: int,
        *,
        tear: float = 0.5,
        kill_share: float = 0.2,
        max_ops: int = 40,
        world: str = "local",
    ):
        self.seed = seed
        self.rng = random.Random(seed)
        self.tear = tear
        self.kill_share = kill_share
        self.max_ops = max_ops
        self.world: World = new_world(world, f"seed-{seed}")
        if world != "local":
            self.kill_share = 1.0  # an object store keeps every request that landed: a power cut is a kill
        self.model = Model(compacted={"compacted"})
        self.stats = self.model.stats
        self.counter = 0
        self.clock = T0
        self.next_batch = 0
        self.inflight: Inflight | None = None
        self.log: list[str] = []  # what happened, for failure messages

    # ------------------------------------------------------------------ records

    def _rows(self, n: int, keys: int = 5) -> list[tuple[bytes, bytes, int]]:
        out = []
        for _ in range(n):
            self.counter += 1
            self.clock += 1
            key = b"k%d" % self.rng.randrange(keys)
            out.append((key, b"s%d-%06d" % (self.seed, self.counter), self.clock))
        return out

    # ------------------------------------------------------------------ operations

    def op_append(self, root: Root) -> None:
        topic = self.rng.choice(list(TOPICS))
        n_parts = TOPICS[topic][0]
        rows = self._rows(self.rng.randint(1, 6))
        parts = [self.rng.randrange(n_parts) for _ in rows]
        table = pa.table(
            {
                "key": pa.array([r[0] for r in rows], pa.binary()),
                "value": pa.array([r[1] for r in rows], pa.binary()),
                "timestamp": pa.array([r[2] for r in rows], pa.int64()),
                "partition": pa.array(parts, pa.int32()),
            }
        )
        inflight = Inflight("append")
        for (k, v, _), p in zip(rows, parts, strict=True):
            inflight.values.setdefault((topic, p), []).append(v)
            inflight.rows.setdefault((topic, p), []).append((-1, k, v))
        self.inflight = inflight
        out = root.append(topic, table)
        for p, info in out.items():
            vals = inflight.rows[(topic, p)]
            if info.last_offset - info.first_offset + 1 != len(vals):
                raise InvariantViolation(f"append to {topic}-{p} returned {info}, wrote {len(vals)} records")
            self.model.ack((topic, p), [(info.first_offset + i, k, v) for i, (_, k, v) in enumerate(vals)])
        self.inflight = None

    def _stage(self, root: Root, batch: int, attempt: int, rows: dict[TP, list[Row]]) -> list[pub.StagedFile]:
        """What Spark tasks do: encode rows and write them next to the logs, as the sink does
        (``stage.open_stager``: staged segments, or a flat file of batches on object stores);
        half of the flat ones unsynced (an object store's, durable only with the commit)."""
        files = []
        for task, ((topic, p), rs) in enumerate(sorted(rows.items())):
            name = pub.stage_name(SINK, batch, task, attempt)
            enc = records.encode(
                [r[2] for r in rs], key=[r[1] for r in rs], timestamp=self.clock, batch_bytes=200
            )
            if self.rng.random() < 0.5:
                stager = open_stager(root.storage, topic, p, name, root.config(topic))
                stager.write(enc.buffer, enc.batches)
                files.append(stager.finish())
                continue
            f = root.storage.open_append(f"{partition_dir(topic, p)}/{name}")
            f.write(enc.buffer.data)
            f.close()
            files.append(pub.StagedFile(topic, p, name))
        return files

    def _publish(self, root: Root, inflight: Inflight, attempt: int) -> dict[TP, Any] | None:
        files = self._stage(root, inflight.batch, attempt, inflight.rows)
        # staged segments linked (patched and renamed) or copied into the active segment
        copy_below = self.rng.choice([0, 300, pub.COPY_BELOW_BYTES])
        return root.publish(SINK, inflight.batch, files, copy_below=copy_below)

    def _ack_publish(self, inflight: Inflight, out: dict[TP, Any]) -> None:
        for tp, info in out.items():
            vals = inflight.rows[tp]
            if info.last_offset - info.first_offset + 1 != len(vals):
                raise InvariantViolation(f"publish to {tp} returned {info}, staged {len(vals)} records")
            self.model.ack(tp, [(info.first_offset + i, k, v) for i, (_, k, v) in enumerate(vals)])

    def op_publish(self, root: Root) -> None:
        inflight = Inflight("publish", batch=self.next_batch)
        for topic in self.rng.sample(["plain", "compacted"], self.rng.randint(1, 2)):
            for p in range(TOPICS[topic][0]):
                if self.rng.random() < 0.7:
                    rows = self._rows(self.rng.randint(1, 5))
                    inflight.values[(topic, p)] = [v for _, v, _ in rows]
                    inflight.rows[(topic, p)] = [(-1, k, v) for k, v, _ in rows]
        if not inflight.rows:
            return
        self.inflight = inflight
        self.next_batch += 1
        out = self._publish(root, inflight, 0)
        if out is None:
            raise InvariantViolation(f"batch {inflight.batch} of {SINK} skipped although never published")
        self._ack_publish(inflight, out)
        self.inflight = None

    def op_maintain(self, root: Root) -> None:
        self.inflight = Inflight("maintain")
        maintenance.maintain(root, now=self.clock, force=True)
        self.inflight = None

    def op_roll(self, root: Root) -> None:
        topic = self.rng.choice(list(TOPICS))
        root.writable_log(topic, self.rng.randrange(TOPICS[topic][0])).roll()

    def op_read(self, root: Root) -> None:
        """A lock-free reader beside the live writer sees every acknowledged record."""
        reader = Root(self.world.open(read_only=True), read_only=True)
        try:
            served = read_rows(reader, TOPICS, probes=2)
            self.model.check(served, starts=log_starts(reader), context="live reader")
        finally:
            reader.close()
        self.stats.bump("live_reads")

    OPS = (
        ("append", 30),
        ("publish", 25),
        ("flush", 5),
        ("checkpoint", 4),
        ("roll", 6),
        ("maintain", 10),
        ("reopen", 5),
        ("read", 8),
    )

    def _choose(self) -> str:
        names = [n for n, _ in self.OPS]
        return self.rng.choices(names, weights=[w for _, w in self.OPS])[0]

    # ------------------------------------------------------------------ episodes

    def _ensure_topics(self, root: Root) -> None:
        for topic, (n, cfg) in TOPICS.items():
            self.inflight = Inflight("create-topic")
            root.create_topic(topic, n, cfg, exist_ok=True)
            if root.partitions(topic) != n:
                raise InvariantViolation(
                    f"topic {topic} has {root.partitions(topic)} partitions after recovery, created with {n}"
                )
        self.inflight = None

    def episode(self) -> None:
        """Run operations until the storage crashes (or ``max_ops``), then crash and recover."""
        world = self.world
        world.crash_after(self.rng.randint(1, 250 if world.label == "local" else 40))
        try:
            root = Root(world.open())
            self._ensure_topics(root)
            for _ in range(self.max_ops):
                op = self._choose()
                self.log.append(op)
                if op == "append":
                    self.op_append(root)
                elif op == "publish":
                    self.op_publish(root)
                elif op == "flush":
                    root.flush()
                elif op == "checkpoint":
                    root.checkpoint()
                elif op == "roll":
                    self.op_roll(root)
                elif op == "maintain":
                    self.op_maintain(root)
                elif op == "reopen":
                    self.inflight = Inflight("close")
                    root.close()
                    self.inflight = None
                    root = Root(world.open())
                elif op == "read":
                    self.op_read(root)
        except Crash:
            self.stats.bump("crashed_in_" + (self.inflight.kind if self.inflight else "nothing"))
        world.crash_after(None)
        if self.rng.random() < self.kill_share:
            self.world = world.survivor("kill", self.rng)
            self.stats.kills += 1
            kind = "kill"
        else:
            self.world = world.survivor("power", self.rng)
            self.stats.power_cuts += 1
            kind = "power cut"
        self.log.append(f"-- {kind} during {self.inflight.kind if self.inflight else 'nothing'}")
        self.recover()

    def recover(self) -> None:
        """Check a reader's view, recover as the writer, check again, finish the interrupted op."""
        inflight = self.inflight
        self.inflight = None
        pending = inflight.values if inflight and inflight.kind in ("append", "publish") else {}
        ctx = f"seed {self.seed}, after {self.log[-1]}"
        reader = Root(self.world.open(read_only=True), read_only=True)
        try:
            served_r = read_rows(reader, TOPICS, probes=3)
            vis_r = self.model.check(
                served_r, starts=log_starts(reader), inflight=pending, context=ctx + " reader"
            )
        finally:
            reader.close()
        writer = Root(self.world.open())
        self._ensure_topics(writer)
        served_w = read_rows(writer, TOPICS, probes=2)
        vis_w = self.model.check(
            served_w, starts=log_starts(writer), inflight=pending, context=ctx + " writer"
        )
        self.stats.recoveries += 1
        if {tp: [r[2] for r in v] for tp, v in vis_r.items()} != {
            tp: [r[2] for r in v] for tp, v in vis_w.items()
        }:
            raise InvariantViolation(f"{ctx}: reader saw in-flight {vis_r}, recovered writer {vis_w}")
        for tp, rows in vis_w.items():
            self.model.ack(tp, rows)
        if inflight is not None and inflight.kind == "publish":
            committed = writer.last_committed_batch(SINK) >= inflight.batch
            if committed != bool(vis_w):
                raise InvariantViolation(
                    f"{ctx}: batch {inflight.batch} recorded as committed={committed} but its data "
                    f"visible={bool(vis_w)}"
                )
            out = self._publish(writer, inflight, 1)  # Spark replays the batch
            if (out is None) != committed:
                raise InvariantViolation(f"{ctx}: replay of batch {inflight.batch} returned {out}")
            if out is not None:
                self._ack_publish(inflight, out)
            self.stats.bump("replays")
        if self.rng.random() < 0.5 or writer._writer is None:
            writer.close()  # clean shutdown
        else:
            writer._writer.close()  # the writer goes away uncleanly

    def run(self, episodes: int) -> Stats:
        for _ in range(episodes):
            try:
                self.episode()
            except (InvariantViolation, PylogError) as e:
                raise InvariantViolation(f"seed {self.seed}: {e}\nhistory: {' '.join(self.log[-40:])}") from e
        return self.stats


__all__ = ["TOPICS", "Inflight", "PowerCutWorkload"]
