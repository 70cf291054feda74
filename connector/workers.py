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

_frozen = False
_lock = threading.Lock()


def freeze_after_task() -> None:
    """Call at the end of each task: the first time in a process, collect once and move every
    object alive then (the modules, the kernels the task loaded) out of the collector's reach
    (``gc.freeze``), so that the collections after later tasks walk only what those allocate.
    What is frozen stays alive until the worker exits anyway."""
    global _frozen
    if _frozen:
        return
    with _lock:
        if not _frozen:
            gc.collect()
            gc.freeze()
            _frozen = True


__all__ = ["freeze_after_task"]
