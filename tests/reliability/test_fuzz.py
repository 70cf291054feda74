"""Fuzzing of every parser of untrusted bytes (TESTING.md D27-D29, D33 and §5.2-5.3).

Targets (:mod:`tests.reliability.fuzz_targets`): the batch decoder, the index readers, Kafka
checkpoint parsing, ``pylog-state.json`` and the source's offset JSON.  Oracle: only pylog's own
errors, no hang, no allocation far beyond the input.  The default run fuzzes each target for
``PYLOG_FUZZ_SECONDS`` (13 s: 65 s in all) with atheris when it is installed (coverage-guided,
libFuzzer) and with the seeded mutation loop of :func:`fuzz_for` otherwise, plus Hypothesis
mutation tests and an allocation check.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import fuzz_seconds
from tests.reliability.fuzz_atheris import available, run_atheris
from tests.reliability.fuzz_targets import TARGETS, fuzz_for, mutate, run_one, seeds

# a time budget of fuzzing per target (atheris, when installed, fuzzes in a process of its own),
# and thousands of examples
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

EXECUTIONS: dict[str, int] = {}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(target: str) -> None:
    seconds = fuzz_seconds()
    if available():
        result = run_atheris(target, seconds)
        assert result is not None
        rc, runs, out = result
        assert rc == 0, out[-4000:]
    else:  # atheris not installed: the seeded mutation loop, same time budget
        runs = fuzz_for(target, seconds, seed=1)
    EXECUTIONS[target] = runs
    assert runs > 100


@pytest.mark.parametrize("target", sorted(TARGETS))
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutations_only_raise_pylog_errors(target: str, data: st.DataObject) -> None:
    corpus = seeds(target)
    base = data.draw(st.sampled_from(corpus))
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    run_one(target, mutate(base, rng, corpus))


@pytest.mark.parametrize("target", sorted(TARGETS))
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(raw=st.binary(max_size=512))
def test_arbitrary_bytes_only_raise_pylog_errors(target: str, raw: bytes) -> None:
    run_one(target, raw)


def test_decoding_mutants_allocates_little_beyond_the_input() -> None:
    """Python and numpy allocations while decoding a mutated batch stay within a small
    multiple of its size (declared sizes and counts are checked before allocating)."""
    rng = random.Random(5)
    corpus = seeds("decode")
    worst = 0.0
    for _ in range(300):
        data = mutate(rng.choice(corpus), rng, corpus)
        tracemalloc.start()
        try:
            run_one("decode", data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        worst = max(worst, peak / max(len(data), 1))
        assert peak < (4 << 20) + 256 * len(data), (peak, len(data), data[:64])
    assert worst > 0
