"""Random power cuts (TESTING.md A2, J "LazyFS"): ≥ 200 in the default run, seeded.

Each seed drives a writer (acknowledged appends that roll segments, exactly-once publishes,
flushes, checkpoints, rolls, retention, compaction, clean reopen, lock-free reads) on the
power-loss file system and cuts the power after a random number of file operations, ten times;
see :mod:`tests.reliability.workload`.  A failure names the seed: rerun it alone with
``PowerCutWorkload(seed).run(10)``.
"""

from __future__ import annotations

import pytest

from tests.reliability.checker import Stats
from tests.reliability.conftest import scale
from tests.reliability.workload import PowerCutWorkload

pytestmark = pytest.mark.slow  # hundreds of power cuts and kills, each recovered and checked

EPISODES = 10


def run_power_cuts(target: int, first_seed: int = 0, max_seeds: int = 10_000) -> Stats:
    total = Stats()
    seed = first_seed
    while total.power_cuts < target and seed < first_seed + max_seeds:
        total.add(PowerCutWorkload(seed).run(EPISODES))
        seed += 1
    total.bump("seeds", seed - first_seed)
    return total


def test_random_power_cuts_lose_nothing_acknowledged() -> None:
    target = int(200 * scale())
    stats = run_power_cuts(target)
    assert stats.power_cuts >= target
    assert stats.violations == 0
    assert stats.records_checked > 10 * stats.power_cuts
    assert stats.extra.get("replays", 0) > 0  # interrupted publishes were replayed


def test_random_kills_of_an_object_store_writer_lose_nothing_acknowledged() -> None:
    """The same histories on an object store: the writer is killed after a random request (a
    segment upload, a checkpoint, its commit's create, the hint, a garbage delete, a staged
    segment's upload); a new process must serve every acknowledged record once, and replays of
    interrupted publishes are skipped exactly when committed (adopted staged segments too)."""
    target = int(100 * scale())
    total = Stats()
    seed = 0
    while total.kills < target:
        total.add(PowerCutWorkload(seed, world="object").run(EPISODES))
        seed += 1
    assert total.violations == 0
    assert total.records_checked > 10 * total.kills
    assert total.extra.get("replays", 0) > 0
    in_flight = sum(
        v for k, v in total.extra.items() if k.startswith("crashed_in_") and k != "crashed_in_nothing"
    )
    assert in_flight > total.kills // 2  # most kills hit an operation, not an idle writer
