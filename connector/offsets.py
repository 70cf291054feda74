"""Offsets of the ``pylog`` source: listing topic-partitions, resolving starting and ending
offsets, admission control and splitting ranges into tasks -- the driver's half of Spark's
Kafka source (``KafkaMicroBatchStream``, ``KafkaOffsetReaderAdmin``, ``KafkaOffsetRangeCalculator``).

Offsets are Kafka positions ("next offset to read") in Spark's Kafka JSON,
``{"<topic>": {"<partition>": <offset>}}``, topics and partitions sorted so that equal offsets
are equal strings.  A *starting* offset may still be unresolved: ``-2`` (earliest), ``-1``
(latest) or ``"timestamp:<ms>"``.  :func:`resolve` turns it into an offset against the log as it
is now (when a micro-batch is planned) or, given the batch's end offset, against the records
below that end only -- which is what makes ``initialOffset()`` and the replay of batch 0
deterministic although the source gets no checkpoint to persist them in (see
:class:`pylog.connector.stream.StreamReader`).

This module does not import pyspark.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from pylog.connector.javaregex import compile_java
from pylog.connector.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    SourceOptionError,
    SourceOptions,
    Subscription,
)
from pylog.storage.errors import DataLossError, PylogError, UnknownTopicError
from pylog.storage.partition import producer_state
from pylog.storage.partition.checkpoint import TopicPartition
from pylog.storage.partition.log import Log
from pylog.storage.root.manager import Root
from pylog.storage.root.opening import open_root

log = logging.getLogger("pylog.connector")

StartValue = int | str  # an offset, -2, -1 or "timestamp:<ms>"
TIMESTAMP_PREFIX = "timestamp:"

DATA_LOSS_HINT = (
    " Some data may have been lost because they are not available in the log any more: either "
    "retention removed them before they were read, or the log was deleted and recreated. If you want "
    "the query to continue despite such data loss, set the source option failOnDataLoss to false."
)


def report_data_loss(message: str, fail_on_data_loss: bool, hint: str = DATA_LOSS_HINT) -> None:
    """Kafka's ``reportDataLoss``: raise with failOnDataLoss=true, else log and go on."""
    if fail_on_data_loss:
        raise DataLossError(message + hint)
    log.warning("%s Continuing, as failOnDataLoss is false.", message)


# ============================================================================ the root


def open_read_only(path: str, storage_options: Mapping[str, Any] | None = None) -> Root:
    """The one place a ``path`` option becomes storage (``storage_options`` are the
    ``storage.*`` options).  Read-only: takes no lock and never modifies a file."""
    return open_root(path, dict(storage_options or {}) or None, read_only=True)


def check_path(path: str) -> None:
    """A local root that does not exist is an error naming the option (a batch read's, when it
    is planned; a stream waits for the root instead)."""
    local = path[len("file://") :] if path.startswith("file://") else path
    if "://" not in local and not os.path.isdir(local):
        raise SourceOptionError(
            f"option path: {path!r} is not a directory; valid values: the directory of an existing pylog "
            "root (or of a Kafka log directory)"
        )


class RootView:
    """A read-only view of the root, reopened on :meth:`refresh` to see what writers (in other
    processes) have appended, created or removed since."""

    def __init__(
        self,
        path: str,
        storage_options: Mapping[str, Any] | None = None,
        isolation_level: str = "read_uncommitted",
    ):
        self.path = path
        self.storage_options = dict(storage_options or {})
        self.isolation_level = isolation_level
        self.root: Root = open_read_only(path, self.storage_options)

    def refresh(self) -> None:
        old = self.root
        self.root = open_read_only(self.path, self.storage_options)
        old.close()

    def close(self) -> None:
        self.root.close()

    def topic_partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The existing topic-partitions the subscription selects, sorted."""
        root = self.root
        if subscription.kind == "assign":
            return [tp for tp in subscription.assignment if self.exists(tp)]
        if subscription.kind == "subscribe":
            topics = [t for t in subscription.topics if t in root.topics()]
        else:
            pattern = compile_java(subscription.pattern)
            topics = [t for t in root.topics() if pattern.fullmatch(t)]
        return sorted((t, p) for t in topics for p in range(root.partitions(t)))

    def exists(self, tp: TopicPartition) -> bool:
        return tp[0] in self.root.topics() and 0 <= tp[1] < self.root.partitions(tp[0])

    def log(self, tp: TopicPartition) -> Log:
        return self.root.log(tp[0], tp[1])

    def earliest(self, tp: TopicPartition) -> int:
        """The log start offset, from the checkpoint and the segment names (no log is opened)."""
        return self.root.log_start_offset(*tp)

    def latest(self, tp: TopicPartition) -> int:
        """The log end offset; under read_committed the last stable offset (Kafka's "latest").
        A partition with a high watermark ends there for readers (a log found shorter is
        damaged, and reading the missing offsets reports it), so its log is not even opened:
        a trigger costs the same whatever the number of partitions."""
        if self.isolation_level == "read_committed":
            return int(producer_state.last_stable_offset(self.log(tp)))
        hw = self.root.high_watermark(*tp)
        return hw if hw is not None else self.log(tp).log_end_offset

    def latest_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.latest(tp) for tp in tps}

    def offset_for_timestamp(self, tp: TopicPartition, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp`` (Kafka's ListOffsets)."""
        lg = self.log(tp)
        found = lg.offset_for_timestamp(timestamp)
        if found is None or found.offset >= self.latest(tp):
            return None
        return max(found.offset, lg.log_start_offset)


def listing(view: RootView, subscription: Subscription) -> list[TopicPartition]:
    """The topic-partitions to read now; with ``assign`` every one of them must exist."""
    tps = view.topic_partitions(subscription)
    if subscription.kind == "assign":
        missing = [tp for tp in subscription.assignment if tp not in tps]
        if missing:
            root = view.root
            detail = "; ".join(
                f"{t}-{p} ("
                + (f"{t} has {root.partitions(t)} partitions" if t in root.topics() else "no such topic")
                + ")"
                for t, p in missing
            )
            raise UnknownTopicError(
                f"option assign: topic-partitions that do not exist in {view.path}: {detail}"
            )
    elif subscription.kind == "subscribe":
        known = view.root.topics()
        absent = [t for t in subscription.topics if t not in known]
        if absent and (view.path, tuple(absent)) not in _warned_absent:
            _warned_absent.add((view.path, tuple(absent)))  # once per process, not every trigger
            close = {t: difflib.get_close_matches(t, known, n=1) for t in absent}
            log.warning(
                "option subscribe: no topic %s in %s (yet): nothing is read from it until it is created%s",
                ", ".join(absent),
                view.path,
                "".join(f"; did you mean {c[0]} for {t}?" for t, c in close.items() if c),
            )
    return tps


_warned_absent: set[tuple[str, tuple[str, ...]]] = set()


# ============================================================================ JSON


def is_offset(value: StartValue) -> TypeGuard[int]:
    """Whether a starting value is resolved: an offset, not -2, -1 or ``"timestamp:<ms>"``."""
    return isinstance(value, int) and value >= 0


def resolved(offsets: Mapping[TopicPartition, StartValue]) -> dict[TopicPartition, int]:
    """The entries of ``offsets`` that are offsets (leaving out unresolved starting values)."""
    return {tp: v for tp, v in offsets.items() if is_offset(v)}


def to_json(offsets: Mapping[TopicPartition, StartValue]) -> dict[str, dict[str, StartValue]]:
    """Spark's Kafka offset JSON, sorted (equal offsets give equal strings)."""
    out: dict[str, dict[str, StartValue]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = off
    return out


def from_json(doc: Any, what: str = "offset") -> dict[TopicPartition, StartValue]:
    """Parse offset JSON as Spark hands it back (a dict, or its JSON text)."""

    def show(x: Any) -> str:
        text = repr(x)
        return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"

    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except ValueError as e:  # malformed text (a damaged checkpoint): a pylog error, not JSON's
            raise PylogError(f"{what} {show(doc)} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise PylogError(
            f"{what} {show(doc)} is not Spark's Kafka offset JSON {{topic: {{partition: offset}}}}"
        )
    out: dict[TopicPartition, StartValue] = {}
    for t, parts in doc.items():
        if not isinstance(parts, dict):
            raise PylogError(f"{what} {show(doc)}: the value for topic {t!r} is not an object")
        for p, off in parts.items():
            if not (isinstance(p, str) and p.isdecimal() and p.isascii() and len(p) <= 10):
                raise PylogError(
                    f"{what} {show(doc)}: partition {p!r} of topic {t!r} is not a partition number"
                )
            ok_int = isinstance(off, int) and not isinstance(off, bool) and -2 <= off < 2**63
            ok_ts = isinstance(off, str) and off.startswith(TIMESTAMP_PREFIX)
            if not (ok_int or ok_ts):
                raise PylogError(f"{what} {show(doc)}: offset {show(off)} of {t}-{p} is not an offset")
            out[(str(t), int(p))] = off
    return out


# ============================================================================ resolution


def initial_spec(
    spec: OffsetSpec | None, tps: list[TopicPartition], *, default: str, subscription: Subscription
) -> dict[TopicPartition, StartValue]:
    """Unresolved starting offsets for the topic-partitions that exist now."""
    kind = default if spec is None else spec.kind
    if kind == "earliest":
        return dict.fromkeys(tps, EARLIEST)
    if kind == "latest":
        return dict.fromkeys(tps, LATEST)
    assert spec is not None
    if kind == "timestamp":
        return dict.fromkeys(tps, f"{TIMESTAMP_PREFIX}{spec.timestamp}")
    given = spec.per_partition()
    _check_covers(spec, given, tps, subscription)
    if kind == "timestamps":
        return {tp: f"{TIMESTAMP_PREFIX}{given[tp]}" for tp in tps}
    return {tp: given[tp] for tp in tps}


def _check_covers(
    spec: OffsetSpec,
    given: Mapping[TopicPartition, int],
    tps: list[TopicPartition],
    subscription: Subscription,
) -> None:
    if set(given) != set(tps):

        def show(s: Any) -> str:
            return ", ".join(f"{t}-{p}" for t, p in sorted(s)) or "none"

        missing, extra = set(tps) - set(given), set(given) - set(tps)
        problem = "; ".join(
            what
            for what in (
                f"missing: {show(missing)}" if missing else "",
                f"not in the subscription (or not existing): {show(extra)}" if extra else "",
            )
            if what
        )
        raise SourceOptionError(
            f"option {spec.option}: when it gives offsets or timestamps per partition, it must give every "
            f"topic-partition of {subscription.describe()} (use -2 for earliest, -1 for latest). "
            f"{problem}. Given: {show(given)}; existing: {show(tps)}"
        )


def check_given_offsets(
    spec: OffsetSpec | None, view: RootView, tps: list[TopicPartition], fail_on_data_loss: bool
) -> dict[TopicPartition, int]:
    """Specific starting or ending offsets that a partition's log has not reached are reported
    on the driver, naming the option, per ``failOnDataLoss`` (Spark's Kafka source finds them
    later: inside a batch read's task, or as batch 0's "offset was changed").  Returns the
    partitions' end offsets (their last stable offsets under read_committed), to clamp to when
    the query goes on."""
    if spec is None or spec.kind != "offsets":
        return {}
    given = spec.per_partition()
    beyond = {}
    for tp in tps:
        v = given.get(tp)
        if v is not None and v >= 0 and v > (end := view.latest(tp)):
            beyond[tp] = end
    if beyond:
        bound = (
            "its last stable offset is {} (the records above it belong to a transaction still open, "
            "which read_committed does not read)"
            if view.isolation_level == "read_committed"
            else "its log ends at offset {} (no record has that offset yet)"
        )
        report_data_loss(
            f"option {spec.option}: "
            + ", ".join(
                f"{t}-{p} was {given[(t, p)]} but " + bound.format(e) for (t, p), e in sorted(beyond.items())
            )
            + ".",
            fail_on_data_loss,
            " Give offsets the logs hold (-1 for latest), or set the source option failOnDataLoss to false "
            "to read up to the end of each log.",
        )
    return beyond


def resolve(
    view: RootView,
    tp: TopicPartition,
    value: StartValue,
    *,
    strategy: str = "error",
    bound: int | None = None,
) -> int:
    """An offset for a starting value.  Without ``bound``: against the log as it is now.  With
    ``bound`` (the end offset of the batch being planned): against the records below it only, so
    that the same (start, end) pair always resolves to the same offset."""
    if is_offset(value):
        return value
    if value == EARLIEST:
        off = view.earliest(tp)
        return off if bound is None else min(off, bound)
    if value == LATEST:
        return view.latest(tp) if bound is None else bound
    if not (isinstance(value, str) and value.startswith(TIMESTAMP_PREFIX)):
        raise PylogError(f"starting offset {value!r} of {tp[0]}-{tp[1]} is not valid")
    ts = int(value[len(TIMESTAMP_PREFIX) :])
    found = view.offset_for_timestamp(tp, ts)
    if bound is not None:
        return bound if found is None or found >= bound else found
    if found is not None:
        return found
    if strategy == "latest":
        return view.latest(tp)
    raise SourceOptionError(
        f"no offset matched from request of topic-partition {tp[0]}-{tp[1]} and timestamp {ts}: no record "
        "has a timestamp at or after it. Set the option startingOffsetsByTimestampStrategy to latest to "
        "start at the latest offset in that case"
    )


def ending_offsets(
    opts: SourceOptions, view: RootView, tps: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """A batch read's end offsets (``endingTimestamp``, ``endingOffsetsByTimestamp``,
    ``endingOffsets``; no match for a timestamp means latest, as in Kafka)."""
    spec = opts.ending
    if spec is None or spec.kind == "latest":
        return view.latest_offsets(tps)
    if spec.kind == "timestamp":
        out = {}
        for tp in tps:
            found = view.offset_for_timestamp(tp, spec.timestamp)
            out[tp] = view.latest(tp) if found is None else found
        return out
    given = spec.per_partition()
    _check_covers(spec, given, tps, opts.subscription)
    out = {}
    for tp in tps:
        v = given[tp]
        if spec.kind == "timestamps":
            found = view.offset_for_timestamp(tp, v)
            out[tp] = view.latest(tp) if found is None else found
        else:
            out[tp] = view.latest(tp) if v == LATEST else v
    return out


# ============================================================================ admission control


def rate_limit(
    limit: int, start: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Kafka's ``rateLimit``: ``limit`` offsets split across partitions in proportion to their
    backlog; a share below 1 is rounded up so small partitions are not starved, others down."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    out = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, start[tp] + step)
    return out


def backlog(start: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]) -> int:
    return sum(max(0, end - start.get(tp, 0)) for tp, end in until.items())


# ============================================================================ ranges


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None
) -> list[OffsetRange]:
    """Kafka's ``KafkaOffsetRangeCalculator``.  Empty ranges are dropped; ranges of more than
    ``maxRecordsPerPartition`` offsets are cut into that many equal parts; then, if there are
    fewer ranges than ``minPartitions``, the ranges whose share of the total is worth more than
    one part are cut in proportion to their size (the others stay whole)."""
    out = [r for r in ranges if r.size > 0]
    if max_records is not None:
        out = [piece for r in out for piece in _split(r, math.ceil(r.size / max_records))]
    if min_partitions is None or len(out) >= min_partitions:
        return out
    total = sum(r.size for r in out)
    whole = [_parts(r.size, total, min_partitions) == 1 for r in out]
    split_total = total - sum(r.size for r, w in zip(out, whole, strict=True) if w)
    split_min = max(min_partitions - sum(whole), 1)
    return [
        piece
        for r, w in zip(out, whole, strict=True)
        for piece in _split(r, 1 if w else _parts(r.size, split_total, split_min))
    ]


def _parts(size: int, total: int, parts: int) -> int:
    return max(math.floor(size / total * parts + 0.5), 1)  # Scala's math.round, at least 1


def _split(r: OffsetRange, parts: int) -> list[OffsetRange]:
    if parts <= 1:
        return [r]
    out = []
    remaining, start = r.size, r.start
    for part in range(parts):
        this = remaining // (parts - part)  # the last part takes the rounding
        remaining -= this
        end = min(start + this, r.end)
        if end > start:
            out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out
