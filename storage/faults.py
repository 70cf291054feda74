"""Fault injection: the one seam through which a test stops, stalls or kills a process at a
named step of a change to a root.

What survives a crash is decided by what is on disk (or in the object store) after each step of
a change: the crash-point tests stop a change between every two of its steps and check what a
reader and the next writer see.  Product code names those steps with :meth:`Faults.step`, and
each object that changes storage holds a :class:`Faults` of its own:

- ``Root.faults``: a publish (``appended``, ``flushed``, ``state-written``), the checkpoints
  (``recovery-point-checkpointed``, ...) and a close (``logs-closed``,
  ``clean-shutdown-written``); the logs a writer opens pass their steps on to it;
- ``Log.faults``: a roll (``roll-old-closed``, ``roll-new-created``, ``rolled``), the
  cleaner's segment swap (``cleaned-written``, ``renamed-swap``, ...), retention
  (``log-start-advanced``, ...), the links of staged segments (``link-patched``, ...);
- ``ObjectStorage.faults``: a manifest commit on an object store (``before-upload``,
  ``uploaded``, ``creating``, ``manifest-created``, ``conflict``, ``committed``, ...), and
  ``ObjectClient.faults``: a conditional create (``created``).

It is off unless a test turns it on: without a hook a step costs two attribute reads.  A test
sets :attr:`Faults.hook` to a callable that takes the step name and raises, stalls, records or
ends the process; a process the test cannot reach (a Spark driver it runs as a subprocess) is
armed by the environment variable ``PYLOG_TEST_CRASH_AT_STEP`` (:func:`arm_from_environment`),
which the sink's commit reads.  Never set either in production.
"""

from __future__ import annotations

import os
from collections.abc import Callable

Hook = Callable[[str], None]

CRASH_ENV = "PYLOG_TEST_CRASH_AT_STEP"
"""The step name at which :func:`arm_from_environment` makes the process exit abruptly (status
137, as a kill): a publish step (``appended``, ``flushed``, ``state-written``) or, on an object
store, one of its manifest commit (``uploaded``, ``manifest-created``, ``committed``)."""


class Faults:
    """The named steps of one object's changes, where a test may inject a fault."""

    __slots__ = ("hook", "parent")

    def __init__(self, parent: Faults | None = None) -> None:
        self.hook: Hook | None = None
        """Called with each step's name; None (the default): the parent's hook, if any."""
        self.parent = parent
        """Whose hook sees these steps when this one has none (a log's: its root's)."""

    def step(self, name: str) -> None:
        """The change reached step ``name``."""
        if self.hook is not None:
            self.hook(name)
        elif self.parent is not None:
            self.parent.step(name)


def arm_from_environment(*points: Faults) -> None:
    """If ``PYLOG_TEST_CRASH_AT_STEP`` names a step, exit the process abruptly at that step of
    ``points`` (crash-point tests of the exactly-once publish in a real Spark driver)."""
    crash_at = os.environ.get(CRASH_ENV)
    if not crash_at:
        return

    def crash(step: str) -> None:
        if step == crash_at:
            os._exit(137)

    for p in points:
        p.hook = crash
