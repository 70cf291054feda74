"""The Python worker housekeeping of pylog's Spark tasks (connector/workers.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.subprocess
def test_a_workers_objects_leave_the_collectors_reach_at_its_second_task_only_in_spark() -> None:
    """Spark's daemon collects after every task; from a worker's second pylog task on, the
    modules and kernels are frozen, so those collections walk only what later tasks allocate.
    Outside a Spark task nothing is frozen.  (A fresh process: the freeze is process-wide.)"""
    code = textwrap.dedent(
        """
        import gc
        import pyspark
        from pylog.connector import workers
        workers.on_task_start()
        workers.on_task_start()
        assert gc.get_freeze_count() == 0, "froze outside a Spark task"
        pyspark.TaskContext.get = staticmethod(lambda: object())  # as inside a task
        workers.TaskContext = pyspark.TaskContext
        workers.on_task_start()
        assert gc.get_freeze_count() == 0, "froze at the first task"
        before = len(gc.get_objects())
        workers.on_task_start()
        frozen = gc.get_freeze_count()
        assert frozen > 10_000 and len(gc.get_objects()) < before // 10, (frozen, before)
        kept = [[i] for i in range(1000)]  # a later task's objects stay collectable
        workers.on_task_start()
        assert gc.get_freeze_count() == frozen  # once per process
        assert len(gc.get_objects()) >= 1000
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
