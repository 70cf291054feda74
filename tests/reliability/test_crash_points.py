"""Crash-point enumeration (TESTING.md A1, A2, A8, A9, B13, B14, C25, F43, G45-G48).

Every multi-step storage operation - acknowledged append with rolls, sink publish (copied,
linked, or on object stores adopted), sink commit with its embedded retention, compaction swap
(one group and several), retention, checkpoints, clean close, topic creation, and a writer's own
recovery - is crashed after each of its storage steps and each of its named steps.  On a local
disk as a process kill and as a power cut; on an object store as a kill and as a lost reply
(each request landed but its response lost), including the commit log's own steps: segment
uploads, checkpoint, commit create, hint, garbage deletes and a re-based
commit.  See :mod:`tests.reliability.crashpoints` and :mod:`tests.reliability.worlds`.
"""

from __future__ import annotations

import random

import pytest

from pylog.storage.config import LogConfig
from pylog.storage.partition.loader import load_log
from pylog.storage.partition.log import Log
from tests.reliability.checker import Stats
from tests.reliability.crashpoints import SCENARIOS, Scenario, count_steps, enumerate_scenario, run_crash
from tests.reliability.memfs import Crash, MemStorage

CASES = [(s, w) for s in SCENARIOS for w in s.worlds]


@pytest.mark.slow  # every storage step of the scenario, each crashed, recovered and checked
@pytest.mark.parametrize(("scenario", "world"), CASES, ids=[f"{s.name}-{w}" for s, w in CASES])
def test_crash_after_every_step(scenario: Scenario, world: str) -> None:
    stats = Stats()
    outcomes = enumerate_scenario(scenario, stats, world=world)
    assert stats.crash_points == len(outcomes) > 0
    if world == "object":
        assert stats.extra["lost_replies"] > 0 and stats.kills > 0
    if scenario.kind == "atomic" and len(scenario.phases) == 1 and not scenario.name.startswith("create-"):
        # the operation commits at one step: crashes before it roll back, after it roll forward
        assert {o.phases_done for o in outcomes} == {0, 1}, scenario.name


B13 = {  # named step -> state after a crash there (kill, power cut): Kafka's testRecoveryAfterCrash
    "cleaned-written": (0, 0),
    "renamed-swap": (1, 0),  # the only new segment is .swap: completed after a kill; the
    # rename is not durable until the directory is fsynced, so a power cut rolls back
    "all-swap": (1, 1),
    "renamed-deleted": (1, 1),
    "renamed-final": (1, 1),
    "done": (1, 1),
}


def test_compaction_swap_steps_roll_back_then_forward_as_kafka() -> None:
    sc = next(s for s in SCENARIOS if s.name == "compaction-swap")
    _, names = count_steps(sc)
    checked = set()
    for k, name in enumerate(names, start=1):
        if name not in B13:
            continue
        kill = run_crash(sc, how="named", k=k, kind="kill").phases_done
        power = run_crash(sc, how="named", k=k, kind="power").phases_done
        assert (kill, power) == B13[name], (k, name)
        checked.add(name)
    assert checked == set(B13)


def test_an_object_store_commit_is_enumerated_request_by_request() -> None:
    """The commit log's steps are each a crash point: segment uploads, checkpoint, the commit's
    conditional create (the commit point), hint and garbage deletes; a writer interrupted once
    its commit landed keeps what the commit holds (the new segment objects are not deleted)."""
    sc = next(s for s in SCENARIOS if s.name == "append+checkpoint")
    w = sc.world("object")
    ctx = sc.setup(w.open())
    w.crash_after(10**6)  # count and name the requests, never crash
    sc.action(ctx)
    steps = " ".join(w.steps)
    for what in (
        "put t-0/00000000000000000000.log.",
        "put t-1/",
        "put _pylog/checkpoints/",
        "create _pylog/log/",
        "put _pylog/_last_checkpoint",
        "delete _pylog/log/",
    ):
        assert what in steps, (what, w.steps)
    _, names = count_steps(sc, "object")
    landed = [k for k, name in enumerate(names, start=1) if name in ("manifest-created", "hint-written")]
    assert len(landed) == 2
    done = [run_crash(sc, how="named", k=k, kind="kill", world="object").phases_done for k in landed]
    assert done == [1, 1]


def _log(st: MemStorage) -> Log:
    cfg = LogConfig.from_dict({"segment.bytes": "300", "index.interval.bytes": "50"})
    return load_log(st, "t-0", cfg, had_clean_shutdown=True).log


def _rows(lg: Log) -> list[bytes]:
    return lg.read_table().column("value").to_pylist()


def test_low_level_append_and_roll_keep_a_prefix_at_every_step() -> None:
    """``Log.append`` (no acknowledgement): after a kill every appended batch is there (TESTING
    A1); after a power cut a prefix of whole batches that holds everything flushed (A2)."""
    new = [b"new-%02d" % i for i in range(8)]

    def setup() -> tuple[MemStorage, Log, list[bytes], list[bytes]]:
        st = MemStorage()
        lg = _log(st)
        lg.append([b"flushed-%d" % i for i in range(4)], timestamp=1, batch_bytes=70)
        lg.flush()
        lg.append([b"cached-%d" % i for i in range(2)], timestamp=1, batch_bytes=70)
        return st, lg, _rows(lg), [b"flushed-%d" % i for i in range(4)]

    st, lg, _, _ = setup()
    start = st.step_count
    lg.append(new, timestamp=1, batch_bytes=70)
    n = st.step_count - start
    assert len(lg.segments) >= 3  # the append rolls
    points = 0
    for k in range(1, n + 1):
        for kind in ("kill", "power"):
            st, lg, before, flushed = setup()
            rp = lg.recovery_point
            st.crash_after(k)
            with pytest.raises(Crash):
                lg.append(new, timestamp=1, batch_bytes=70)
            st.crash_after(None)
            st._dead = False
            after = st.kill() if kind == "kill" else st.power_cut(random.Random(k), tear=0.5)
            got = _rows(load_log(after, "t-0", lg.config, recovery_point=rp).log)
            full = before + new
            assert got == full[: len(got)], (k, kind, got)
            assert len(got) >= len(before if kind == "kill" else flushed), (k, kind, got)
            points += 1
    assert points == 2 * n
