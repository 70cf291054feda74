"""Kafka's throttler for the log cleaner's I/O (``log.cleaner.io.max.bytes.per.second``)."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]
"""Seconds on a monotonic scale (``time.monotonic``)."""
Sleep = Callable[[float], None]
"""Waits the given number of seconds (``time.sleep``)."""


class Throttler:
    """Kafka's ``Throttler`` for ``log.cleaner.io.max.bytes.per.second``: call it with every
    number of bytes read or written; it sleeps when they came faster than ``rate`` per second.

    Every ``check_interval_s`` (Kafka: 100 ms) of time, or as soon as the bytes seen since the
    last check would take that long at the rate, the rate since the last check is compared with
    the limit and, when above it, the throttler sleeps until it is down to the limit; then a new
    period starts.  So no period runs faster than the limit, unused time is not banked for a later
    burst, and a burst between two checks is at most one call's bytes plus ``rate *
    check_interval_s`` (the check on bytes is pylog's: Kafka checks on time only, so fast I/O
    runs unchecked for a whole interval).  ``slept_s`` is the total time slept.
    """

    def __init__(
        self,
        rate: float,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
        check_interval_s: float = 0.1,
    ):
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        self.rate = float(rate)
        self.check_interval_s = check_interval_s
        self.slept_s = 0.0
        self._clock, self._sleep = clock, sleep
        self._period_start = clock()
        self._observed = 0.0

    def __call__(self, n: int) -> None:
        self._observed += n
        elapsed = self._clock() - self._period_start
        due = self._observed / self.rate  # how long these bytes take at the limit
        if elapsed < self.check_interval_s and due < self.check_interval_s:
            return
        if due > elapsed:
            self._sleep(due - elapsed)
            self.slept_s += due - elapsed
        self._period_start = self._clock()
        self._observed = 0.0


__all__ = ["Clock", "Sleep", "Throttler"]
