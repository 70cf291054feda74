"""Random process kills (TESTING.md A1, F41, F43; Jepsen's process-kill fault): ≥ 50 SIGKILLs of a
real writer process on local disk, each at a random time, then every acknowledged record and
every planned sink batch must be there exactly once (:mod:`tests.reliability.killer`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.reliability.conftest import scale
from tests.reliability.killer import run_kills

pytestmark = pytest.mark.subprocess  # writer processes killed at random times


def test_sigkill_at_random_times_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    n = max(50, int(50 * scale()))
    report = run_kills(tmp_path / "kills", n, seed=1)
    assert report.errors == []
    assert report.kills >= 50 or report.kills + report.finished >= n
    assert report.kills >= n * 0.9, report
    assert (report.lost, report.duplicated, report.phantom, report.unordered) == (0, 0, 0, 0), report
    assert report.acked_appends > 0 and report.batches > 0


def test_sigkill_of_object_store_writers_loses_and_duplicates_nothing(
    tmp_path: Path, s3_backend: Backend
) -> None:
    """The same on an object store (moto's S3 server): writer processes killed at random times
    in the middle of uploads, conditional creates of commits, checkpoints, hints and deletes,
    and of publishes whose staged segments are uploaded and then adopted by the commit."""
    n = max(30, int(30 * scale()))
    report = run_kills(
        tmp_path / "kills", n, seed=2, min_s=0.1, max_s=0.8, url=s3_backend.url, options=s3_backend.options
    )
    assert report.errors == []
    assert report.kills >= n * 0.8, report
    assert (report.lost, report.duplicated, report.phantom, report.unordered) == (0, 0, 0, 0), report
    assert report.acked_appends > 0 and report.batches > 0


def test_kills_wait_for_the_first_acknowledgements_however_slow_the_start(tmp_path: Path) -> None:
    """Kills wait for each writer's first acknowledgements, however slowly it starts under load:
    with kills due 1 ms after the start (a writer needs far longer to open the root), every other
    writer is still killed only after it acknowledged an append and a publish of its own, so
    every run has something to check (``acked_appends > 0``)."""
    report = run_kills(tmp_path / "kills", 4, seed=3, min_s=0.001, max_s=0.001)
    assert report.errors == [] and report.kills == 4, report
    assert report.acked_appends > 0 and report.batches > 0, report
    assert (report.lost, report.duplicated, report.phantom, report.unordered) == (0, 0, 0, 0), report
