"""Filter pushdown for batch reads: topic, partition, offset and timestamp predicates.

:func:`push_filters` takes Spark's pushed filters (``pyspark.sql.datasource.Filter``), folds the
ones it can honour exactly into :class:`Bounds` and returns the others, which Spark then
evaluates.  Spark does not re-apply accepted filters, so a filter is accepted only when the
scan applies it exactly: topics and partitions select topic-partitions, offsets cut the ranges,
and timestamps cut the rows in ``read()`` (and move a range's start to the first offset at or
after the lower bound, found with the time index).  A filter that can only narrow the scan
(``offset IN (...)``) narrows it and is still returned to Spark.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from pylog.connector.options import is_int

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_NEVER_NULL = {"topic", "partition", "offset", "timestamp", "timestampType"}
_CMP = (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


@dataclass(frozen=True)
class Bounds:
    """What the accepted filters allow; ``None`` means unbounded.  Integer ranges are [lo, hi)."""

    topics: frozenset[str] | None = None
    topic_prefixes: tuple[str, ...] = ()
    partitions: frozenset[int] | None = None
    partition_lo: int | None = None
    partition_hi: int | None = None
    offset_lo: int | None = None
    offset_hi: int | None = None
    timestamp_lo: int | None = None  # milliseconds
    timestamp_hi: int | None = None

    def allows(self, topic: str, partition: int) -> bool:
        if self.topics is not None and topic not in self.topics:
            return False
        if any(not topic.startswith(p) for p in self.topic_prefixes):
            return False
        if self.partitions is not None and partition not in self.partitions:
            return False
        return (self.partition_lo is None or partition >= self.partition_lo) and (
            self.partition_hi is None or partition < self.partition_hi
        )

    def offsets(self, start: int, end: int) -> tuple[int, int]:
        lo = start if self.offset_lo is None else max(start, self.offset_lo)
        hi = end if self.offset_hi is None else min(end, self.offset_hi)
        return lo, max(lo, hi)


def push_filters(bounds: Bounds, filters: list[Filter]) -> tuple[Bounds, list[Filter]]:
    """(the bounds with every exactly-honoured filter folded in, the filters left to Spark)."""
    rest: list[Filter] = []
    for f in filters:
        folded = _fold(bounds, f)
        if folded is None:
            rest.append(f)
        else:
            bounds, exact = folded
            if not exact:
                rest.append(f)
    return bounds, rest


def _fold(b: Bounds, f: Filter) -> tuple[Bounds, bool] | None:
    """(new bounds, whether ``f`` is applied exactly), or None if ``f`` is not understood."""
    col = _column(f)
    if col is None:
        return None
    if isinstance(f, IsNotNull):
        return (b, True) if col in _NEVER_NULL else None
    if col == "topic":
        return _fold_topic(b, f)
    if col == "partition":
        return _fold_int(b, f, "partition")
    if col == "offset":
        return _fold_int(b, f, "offset")
    if col == "timestamp":
        return _fold_timestamp(b, f)
    return None


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1 or not isinstance(attr[0], str):
        return None
    return attr[0]


def _fold_topic(b: Bounds, f: Filter) -> tuple[Bounds, bool] | None:
    if isinstance(f, EqualTo | EqualNullSafe) and isinstance(f.value, str):
        return replace(b, topics=_meet(b.topics, {f.value})), True
    if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
        return replace(b, topics=_meet(b.topics, set(f.value))), True
    if isinstance(f, StringStartsWith) and isinstance(f.value, str):
        return replace(b, topic_prefixes=(*b.topic_prefixes, f.value)), True
    return None


def _meet(a: frozenset[str] | frozenset[int] | None, b: set[Any]) -> frozenset[Any]:
    return frozenset(b) if a is None else frozenset(a & b)


def _fold_int(b: Bounds, f: Filter, name: str) -> tuple[Bounds, bool] | None:
    value = getattr(f, "value", None)
    if isinstance(f, In):
        values = list(value or ())
        if not values or not all(is_int(v) for v in values):
            return None
        if name == "partition":
            return replace(b, partitions=_meet(b.partitions, set(values))), True
        return _narrow(b, name, min(values), max(values) + 1), False  # narrows; Spark picks the offsets
    if not isinstance(f, _CMP) or not isinstance(value, int) or isinstance(value, bool):
        return None
    lo, hi = _interval(f, value)
    return _narrow(b, name, lo, hi), True


def _interval(f: Filter, v: int) -> tuple[int | None, int | None]:
    if isinstance(f, EqualTo | EqualNullSafe):
        return v, v + 1
    if isinstance(f, GreaterThan):
        return v + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None
    if isinstance(f, LessThan):
        return None, v
    return None, v + 1  # LessThanOrEqual


def _narrow(b: Bounds, name: str, lo: int | None, hi: int | None) -> Bounds:
    cur_lo, cur_hi = getattr(b, f"{name}_lo"), getattr(b, f"{name}_hi")
    new_lo = lo if cur_lo is None else (cur_lo if lo is None else max(cur_lo, lo))
    new_hi = hi if cur_hi is None else (cur_hi if hi is None else min(cur_hi, hi))
    changes: dict[str, Any] = {f"{name}_lo": new_lo, f"{name}_hi": new_hi}
    return replace(b, **changes)


def _fold_timestamp(b: Bounds, f: Filter) -> tuple[Bounds, bool] | None:
    if not isinstance(f, _CMP):
        return None
    us = _micros(getattr(f, "value", None))
    if us is None:
        return None
    ms, rem = divmod(us, 1000)  # records hold milliseconds: compare exactly at microsecond precision
    if isinstance(f, EqualTo | EqualNullSafe):
        lo, hi = (ms, ms + 1) if rem == 0 else (0, 0)
    elif isinstance(f, GreaterThan):
        lo, hi = ms + 1, None
    elif isinstance(f, GreaterThanOrEqual):
        lo, hi = (ms if rem == 0 else ms + 1), None
    elif isinstance(f, LessThan):
        lo, hi = None, (ms if rem == 0 else ms + 1)
    else:
        lo, hi = None, ms + 1
    return _narrow(b, "timestamp", lo, hi), True


def _micros(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return (aware - _EPOCH) // dt.timedelta(microseconds=1)
    return None
