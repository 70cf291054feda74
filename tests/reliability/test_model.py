"""Model-based stateful test (TESTING.md §5.4): Hypothesis searches for the shortest sequence of
appends, publishes, rolls, flushes, compactions, retention runs, reads, timestamp lookups,
crashes (process kill, power cut, torn write, crash in the middle of a compaction) and reopens
that breaks an invariant of DESIGN.md §6, against an in-memory model (:class:`checker.Model`).
"""

from __future__ import annotations

import contextlib
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pylog.storage.codec import records
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root, partition_dir
from tests.reliability.checker import Model, log_starts, read_rows
from tests.reliability.conftest import scale
from tests.reliability.memfs import Crash, MemStorage

pytestmark = pytest.mark.slow  # stateful examples of up to 40 steps, each step checked

T0 = 1_700_000_000_000
TOPICS = {
    "p": {"segment.bytes": "300", "retention.bytes": "700", "index.interval.bytes": "40"},
    "c": {"cleanup.policy": "compact", "segment.bytes": "300", "min.cleanable.dirty.ratio": "0.01"},
}


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.storage = MemStorage("model")
        self.root = Root(self.storage)
        for t, cfg in TOPICS.items():
            self.root.create_topic(t, 1, cfg)
        self.model = Model(compacted={"c"})
        self.n = 0
        self.clock = T0
        self.batch = 0
        self.rng = random.Random(0)

    def _rows(self, count: int, keys: int) -> tuple[list[bytes], list[bytes], list[int]]:
        ks, vs, ts = [], [], []
        for _ in range(count):
            self.n += 1
            self.clock += self.rng.choice([0, 1, 5, 50])
            ks.append(b"k%d" % (self.n % keys))
            vs.append(b"v%05d" % self.n)
            ts.append(self.clock)
        return ks, vs, ts

    @rule(topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 6), keys=st.integers(1, 6))
    def append(self, topic: str, count: int, keys: int) -> None:
        ks, vs, ts = self._rows(count, keys)
        out = self.root.append(
            topic, pa.table({"key": ks, "value": vs, "timestamp": pa.array(ts, pa.int64())})
        )
        info = out[0]
        self.model.ack(
            (topic, 0), [(info.first_offset + i, k, v) for i, (k, v) in enumerate(zip(ks, vs, strict=True))]
        )

    @rule(topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 6))
    def publish(self, topic: str, count: int) -> None:
        ks, vs, ts = self._rows(count, 4)
        name = pub.stage_name("m", self.batch, 0, 0)
        enc = records.encode(vs, key=ks, timestamp=ts, batch_bytes=150)
        f = self.storage.open_append(f"{partition_dir(topic, 0)}/{name}")
        f.write(enc.buffer.data)
        f.close()
        out = self.root.publish("m", self.batch, [pub.StagedFile(topic, 0, name)])
        assert out is not None
        info = out[(topic, 0)]
        self.model.ack(
            (topic, 0), [(info.first_offset + i, k, v) for i, (k, v) in enumerate(zip(ks, vs, strict=True))]
        )
        self.batch += 1

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def roll(self, topic: str) -> None:
        self.root.writable_log(topic, 0).roll()

    @rule()
    def flush(self) -> None:
        self.root.flush()

    @rule()
    def compact(self) -> None:
        maintenance.maintain(self.root, now=self.clock, force=True, retention=False)

    @rule()
    def retain(self) -> None:
        maintenance.maintain(self.root, now=self.clock, compaction=False)

    @rule(kind=st.sampled_from(["kill", "power", "torn"]))
    def crash(self, kind: str) -> None:
        self._restart(kind)

    @rule(k=st.integers(1, 60), kind=st.sampled_from(["kill", "power"]))
    def crash_during_compaction(self, k: int, kind: str) -> None:
        self.storage.crash_after(k)
        with contextlib.suppress(Crash):
            maintenance.maintain(self.root, now=self.clock, force=True)
        self.storage.crash_after(None)
        self.storage._dead = False
        self._restart(kind)

    def _restart(self, kind: str) -> None:
        if kind == "kill":
            self.storage = self.storage.kill()
        else:
            self.storage = self.storage.power_cut(random.Random(self.n), tear=1.0 if kind == "torn" else 0.0)
        self._check(Root(self.storage, read_only=True), "reader after crash")
        self.root = Root(self.storage)
        for t in TOPICS:
            self.root.writable_log(t, 0)

    @rule()
    def reopen(self) -> None:
        self.root.close()
        self.root = Root(self.storage)

    @precondition(lambda self: any(self.model.acked.values()))
    @rule(data=st.data())
    def read_at(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from(sorted(tp for tp, a in self.model.acked.items() if a)))
        off = data.draw(st.sampled_from(sorted(self.model.acked[tp])))
        t = self.root.read_table(tp[0], [0], start_offset=off, end_offset=off + 1)
        got = t.column("value").to_pylist()
        assert got in ([], [self.model.acked[tp][off][1]])  # [] only if compaction removed it
        if tp[0] == "p":
            assert got == [self.model.acked[tp][off][1]] or off < self.root.log("p", 0).log_start_offset

    @rule(delta=st.integers(-3, 400))
    def lookup_time(self, delta: int) -> None:
        ts = T0 + delta
        lg = self.root.log("p", 0)
        t = lg.read_table()
        offs, stamps = t.column("offset").to_pylist(), t.column("timestamp").to_pylist()
        want = next((o for o, s in zip(offs, stamps, strict=True) if s >= ts), None)
        found = lg.offset_for_timestamp(ts)
        assert (found.offset if found is not None else None) == want, (ts, found, want)

    def _check(self, root: Root, context: str) -> None:
        try:
            served = read_rows(root, TOPICS)
            self.model.check(served, starts=log_starts(root), context=context)
        finally:
            if root.read_only:
                root.close()

    @invariant()
    def readers_see_exactly_the_acknowledged_records(self) -> None:
        self._check(Root(self.storage, read_only=True), "reader")

    def teardown(self) -> None:
        if not self.storage.dead:
            self.root.close()


LogMachine.TestCase.settings = settings(
    max_examples=max(5, int(30 * scale())),
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestLogMachine = LogMachine.TestCase
