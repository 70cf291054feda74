"""The Python worker housekeeping of pylog's Spark tasks (connector/workers.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_objects_alive_after_the_first_task_leave_the_collectors_reach_once() -> None:
    """Spark's daemon collects after every task; after the first task the modules and kernels
    are frozen, so those collections walk only what later tasks allocate (a fresh process: the
    freeze is process-wide)."""
    code = textwrap.dedent(
        """
        import gc
        from pylog.connector import workers
        before = len(gc.get_objects())
        assert gc.get_freeze_count() == 0
        workers.freeze_after_task()
        frozen = gc.get_freeze_count()
        assert frozen > 10_000 and frozen >= before // 2, (frozen, before)
        assert len(gc.get_objects()) < before // 10
        kept = [[i] for i in range(1000)]  # a later task's objects stay collectable
        workers.freeze_after_task()
        assert gc.get_freeze_count() == frozen  # once per process
        assert len(gc.get_objects()) >= 1000
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
