"""The reliability campaign, long form (docs/reliability.md).

    python -m tests.reliability.campaign --long                 # about 10 minutes
    python -m tests.reliability.campaign --minutes 30 --seed 7  # longer, other seeds
    python -m tests.reliability.campaign --quick                # about 2 minutes

Runs, with the time split below, every harness of ``tests/reliability`` at a larger scale than
the default test run: crash-point enumeration of every scenario (fixed size), random power cuts
(new seeds until the time is up), random ``SIGKILL``s of a real writer process, ``ENOSPC`` and
``EIO`` at every storage step of a writer's recovery (``faults.py``, new seeds until the time is
up), lock-free readers in a loop beside a writer that compacts, runs retention and merges
(``concurrent_readers.py``, local disk and moto's S3), fuzzing of every target (atheris if
installed, else the seeded mutation loop) and the stateful model test with more examples.
Prints a table and, as its last line, one JSON object with the figures; exits 1 if any
invariant was violated.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.reliability import concurrent_readers
from tests.reliability.checker import Stats
from tests.reliability.crashpoints import SCENARIOS, enumerate_scenario
from tests.reliability.faults import run_fault_campaign
from tests.reliability.fuzz_atheris import available, run_atheris
from tests.reliability.fuzz_targets import TARGETS, fuzz_for
from tests.reliability.killer import run_kills
from tests.reliability.workload import PowerCutWorkload

# shares of the time left after the crash points
SPLIT = {
    "power": 0.22,
    "object": 0.08,
    "kills": 0.20,
    "faults": 0.10,
    "readers": 0.10,
    "fuzz": 0.20,
    "model": 0.10,
}


def crash_points() -> dict[str, Any]:
    stats = Stats()
    per: dict[str, int] = {}
    for sc in SCENARIOS:
        for world in sc.worlds:
            before = stats.crash_points
            enumerate_scenario(sc, stats, world=world)
            per[f"{sc.name} ({world})"] = stats.crash_points - before
    return {
        "crash_points": stats.crash_points,
        "kills": stats.kills,
        "power_cuts": stats.power_cuts,
        "lost_replies": stats.extra.get("lost_replies", 0),
        "per_scenario": per,
        "records_checked": stats.records_checked,
    }


def power_cuts(seconds: float, first_seed: int, world: str = "local") -> Stats:
    total = Stats()
    deadline = time.monotonic() + seconds
    seed = first_seed
    while time.monotonic() < deadline:
        total.add(PowerCutWorkload(seed, world=world).run(10))
        seed += 1
    total.bump("seeds", seed - first_seed)
    return total


def kills(seconds: float, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kills": 0,
        "records_checked": 0,
        "acked_appends": 0,
        "batches": 0,
        "violations": 0,
    }
    deadline = time.monotonic() + seconds
    round_ = 0
    last = 0.0
    while time.monotonic() + last < deadline:
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            r = run_kills(Path(tmp) / "kills", 100, seed=seed * 1000 + round_)
        out["kills"] += r.kills
        out["records_checked"] += r.records_checked
        out["acked_appends"] += r.acked_appends
        out["batches"] += r.batches
        out["violations"] += r.violations
        if r.violations:
            out.setdefault("failures", []).append(repr(r))
        round_ += 1
        last = time.monotonic() - started
    out["rounds"] = round_
    return out


def recovery_faults(seconds: float, first_seed: int) -> dict[str, Any]:
    """ENOSPC and EIO at every storage step of recovery, every history, new seeds until the time
    is up (at least one)."""
    stats = Stats()
    deadline = time.monotonic() + seconds
    seed = first_seed
    while True:
        run_fault_campaign(stats, seed=seed)
        seed += 1
        if time.monotonic() >= deadline:
            break
    failures = stats.__dict__.get("failures", [])
    return {
        "seeds": seed - first_seed,
        "histories": stats.extra.get("histories", 0),
        "faults_injected": stats.extra.get("faults_injected", 0),
        "enospc_steps": stats.extra.get("steps_ENOSPC", 0),
        "eio_steps": stats.extra.get("steps_EIO", 0),
        "opens_failed": stats.extra.get("opens_failed", 0),
        "opens_succeeded": stats.extra.get("opens_succeeded", 0),
        "retries": stats.extra.get("retries", 0),
        "records_checked": stats.records_checked,
        "lost": stats.lost,
        "phantom": stats.phantom,
        "unnamed_errors": stats.extra.get("unnamed_errors", 0),
        "root_level_raw_errors": stats.extra.get("root_level_raw_errors", 0),
        "root_level_steps": sorted(stats.__dict__.get("root_level", set())),
        "failures": failures,
        "violations": stats.lost + stats.phantom + stats.extra.get("unnamed_errors", 0),
    }


def fuzz(seconds: float, seed: int) -> dict[str, Any]:
    per = seconds / len(TARGETS)
    engine = "atheris" if available() else "mutation"
    out: dict[str, Any] = {"engine": engine, "executions": {}, "failures": []}
    for target in TARGETS:
        if engine == "atheris":
            result = run_atheris(target, per, seed=seed)
            assert result is not None
            rc, runs, text = result
            if rc != 0:
                out["failures"].append({"target": target, "output": text[-3000:]})
        else:
            try:
                runs = fuzz_for(target, per, seed=seed)
            except AssertionError as e:
                out["failures"].append({"target": target, "output": str(e)})
                runs = 0
        out["executions"][target] = runs
    out["total_executions"] = sum(out["executions"].values())
    return out


def model(seconds: float, seed: int) -> dict[str, Any]:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tests.reliability.test_model import LogMachine

    deadline = time.monotonic() + seconds
    runs = 0
    failures = []
    last = 0.0
    while time.monotonic() + last < deadline:
        started = time.monotonic()
        try:
            run_state_machine_as_test(
                LogMachine,
                settings=settings(
                    max_examples=20,
                    stateful_step_count=40,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}"[:3000])
            break
        runs += 20
        last = time.monotonic() - started
    return {"examples": runs, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.reliability.campaign", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--long", action="store_true", help="the long campaign: 10 minutes (the default)")
    ap.add_argument("--quick", action="store_true", help="about 2 minutes")
    ap.add_argument("--minutes", type=float, default=None, help="total time budget")
    ap.add_argument("--seed", type=int, default=1000, help="first power-cut seed, kill and fuzz seed")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    minutes = args.minutes if args.minutes is not None else (2.0 if args.quick else 10.0)
    logging.getLogger("pylog.storage").setLevel(logging.ERROR)
    t0 = time.monotonic()
    figures: dict[str, Any] = {"minutes_budget": minutes, "seed": args.seed}
    print(f"reliability campaign: {minutes:g} minutes, seed {args.seed}", flush=True)

    figures["crash_points"] = crash_points()
    print(f"  crash points enumerated: {figures['crash_points']['crash_points']}", flush=True)
    rest = max(30.0, minutes * 60 - (time.monotonic() - t0))

    pc = power_cuts(rest * SPLIT["power"], args.seed)
    figures["power_cuts"] = {
        "power_cuts": pc.power_cuts,
        "simulated_kills": pc.kills,
        "recoveries": pc.recoveries,
        "records_checked": pc.records_checked,
        "lost": pc.lost,
        "duplicated": pc.duplicated,
        "inconsistent": pc.inconsistent,
        "unordered": pc.unordered,
        "phantom": pc.phantom,
        **pc.extra,
    }
    print(
        f"  power cuts: {pc.power_cuts} (+{pc.kills} simulated kills), records checked {pc.records_checked}"
    )

    ob = power_cuts(rest * SPLIT["object"], args.seed, world="object")
    figures["object_store_kills"] = {
        "kills": ob.kills,
        "records_checked": ob.records_checked,
        "lost": ob.lost,
        "duplicated": ob.duplicated,
        "inconsistent": ob.inconsistent,
        "unordered": ob.unordered,
        "phantom": ob.phantom,
        **ob.extra,
    }
    print(f"  object-store writer kills: {ob.kills}, records checked {ob.records_checked}")

    figures["kills"] = kills(rest * SPLIT["kills"], args.seed)
    print(f"  SIGKILLs: {figures['kills']['kills']}, records checked {figures['kills']['records_checked']}")

    figures["recovery_faults"] = rf = recovery_faults(rest * SPLIT["faults"], args.seed)
    print(
        f"  recovery faults: {rf['faults_injected']} (ENOSPC/EIO at every step of "
        f"{rf['histories']} histories), "
        f"lost {rf['lost']}, unnamed errors {rf['unnamed_errors']}, records checked {rf['records_checked']}",
        flush=True,
    )

    figures["readers"] = rd = concurrent_readers.campaign(rest * SPLIT["readers"], args.seed)
    print(
        f"  lock-free readers beside compaction, retention and merges: {rd['reads']} reads "
        f"({rd['relistings']} relistings), failed {rd['failed_reads']}, missing offsets "
        f"{rd['missing_offsets']}, two-valued {rd['two_valued_offsets']}",
        flush=True,
    )

    figures["fuzz"] = fuzz(rest * SPLIT["fuzz"], args.seed)
    print(f"  fuzz executions ({figures['fuzz']['engine']}): {figures['fuzz']['executions']}", flush=True)

    figures["model"] = model(rest * SPLIT["model"], args.seed)
    print(f"  stateful model examples: {figures['model']['examples']}", flush=True)

    violations = (
        pc.violations
        + ob.violations
        + figures["kills"]["violations"]
        + rf["violations"]
        + rd["violations"]
        + len(figures["fuzz"]["failures"])
        + len(figures["model"]["failures"])
    )
    figures["violations"] = violations
    figures["lost_duplicated_corrupted"] = (
        pc.lost
        + pc.duplicated
        + pc.inconsistent
        + ob.lost
        + ob.duplicated
        + ob.inconsistent
        + figures["kills"]["violations"]
        + rf["lost"]
        + rf["phantom"]
        + rd["missing_offsets"]
        + rd["two_valued_offsets"]
    )
    figures["records_checked"] = (
        figures["crash_points"]["records_checked"]
        + pc.records_checked
        + ob.records_checked
        + figures["kills"]["records_checked"]
        + rf["records_checked"]
    )
    figures["elapsed_s"] = round(time.monotonic() - t0, 1)
    print(f"  violations: {violations}; elapsed {figures['elapsed_s']} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
