"""What pylog does to the Python worker processes Spark runs its tasks in.

Spark reuses a Python worker for task after task (``spark.python.worker.reuse``, the default),
and its worker daemon runs a full garbage collection after every task.  A worker that imported
pyspark, pyarrow, numpy, numba and pylog, and loaded the compiled kernels, holds about 170,000
objects that live until it exits; each of those collections walks them all: about 60 ms of
CPU after every read or write task on a 2-core machine, paid again at every micro-batch and by
every task of it (a storage-free Python source or sink, which imports less, pays a fraction).
"""

from __future__ import annotations

import gc
import threading

from pyspark import TaskContext

_tasks = 0
_lock = threading.Lock()


def on_task_start() -> None:
    """Call when a read or write task starts.  At the start of a process's second pylog task
    (the first one has imported the modules and loaded the kernels, and Spark's collection
    after it has freed that task's garbage), every object alive is moved out of the
    collector's reach (``gc.freeze``), so that the collections after later tasks walk only what
    those allocate.  What is frozen stays alive until the worker exits anyway.  Outside a Spark
    task (a test calling ``read()`` in its own process) nothing happens."""
    global _tasks
    if _tasks >= 2 or TaskContext.get() is None:
        return
    with _lock:
        _tasks += 1
        if _tasks == 2:
            gc.freeze()


__all__ = ["on_task_start"]
