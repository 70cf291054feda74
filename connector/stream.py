"""``spark.readStream.format("pylog")``: the micro-batch stream reader (Kafka's
``KafkaMicroBatchStream``).

Spark runs ``initialOffset``, ``latestOffset``, ``partitions``, ``commit`` and
``reportLatestOffset`` in one long-lived Python process on the driver; ``read`` runs on
executors with a copy of the reader made at planning time, so every range travels in its
:class:`~pylog.connector.scan.ReadTask`.

Initial offsets.  Kafka persists its resolved initial offsets under the query checkpoint; a
Python source never learns the checkpoint.  Spark asks ``initialOffset()`` again when it replays
batch 0 (after a failure, in a new process) and plans that batch from the answer and the end
offset in its offset log.  So ``initialOffset()`` does not resolve anything: it returns the
starting *specification* per partition -- ``-2`` (earliest), ``-1`` (latest, Kafka's codes) or
``"timestamp:<ms>"`` -- which is the same on every call.  ``latestOffset`` resolves it against
the log to compute the end of batch 0, and ``partitions(start, end)`` resolves it against the
records *below that end*: latest becomes the end itself, a timestamp the first offset below the
end whose record is at or after it.  Batch 0 and its replay therefore read the same rows however
much data arrived in between.  (``earliest`` is the log start offset when planned; only retention
can move it.)

Partitions that appear later (new partitions, new topics matching ``subscribePattern``) start at
offset 0, i.e. at the earliest record, as in Kafka; a start below the log start offset is
reported as data loss by the read.  A root that does not exist yet (which a sink creates as it
starts) is read as a root without topics, as Kafka's subscribe to a topic that does not exist:
nothing is read (logged once, naming the path) until its topics appear.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from pylog.connector.offsets import (
    OffsetRange,
    RootView,
    backlog,
    check_given_offsets,
    from_json,
    initial_spec,
    is_offset,
    listing,
    rate_limit,
    report_data_loss,
    resolve,
    resolved,
    split_ranges,
    to_json,
)
from pylog.connector.options import SourceOptions
from pylog.connector.scan import ReadTask, read_task, task_for
from pylog.connector.workers import on_task_start
from pylog.storage.errors import NoRootError, PylogError
from pylog.storage.partition.checkpoint import TopicPartition
from pylog.storage.root.consumers import expire_consumer_offsets, write_consumer_offsets

log = logging.getLogger("pylog.connector")


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new records; offsets in Spark's Kafka JSON."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._view: RootView | None = None
        self._initial: dict[str, Any] | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow
        self._latest: dict[TopicPartition, int] | None = None
        self._last_trigger_ms = -math.inf  # Kafka's lastTriggerMillis = 0: the first trigger fires
        self._commit_warned = False
        self._expired = False
        self._no_root_logged = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_view"] = None  # executors open their own
        return state

    def _refresh(self) -> RootView | None:
        """The root as it is now; None while it does not exist yet."""
        if self._view is None:
            try:
                self._view = RootView(self.opts.path, self.opts.storage_options, self.opts.isolation_level)
            except NoRootError:
                if not self._no_root_logged:
                    self._no_root_logged = True
                    log.warning(
                        "option path: no pylog root at %s (yet): nothing is read until it is created; "
                        "its topics are read from their earliest offsets as they appear",
                        self.opts.path,
                    )
                return None
        else:
            self._view.refresh()
        return self._view

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            view = self._refresh()
            tps = [] if view is None else listing(view, self.opts.subscription)
            spec = initial_spec(
                self.opts.starting, tps, default="latest", subscription=self.opts.subscription
            )
            if view is not None:
                check_given_offsets(self.opts.starting, view, tps, self.opts.fail_on_data_loss)
            self._initial = to_json(spec)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        view = self._refresh()
        self._target = {} if view is None else view.latest_offsets(listing(view, self.opts.subscription))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        view = self._refresh()
        if view is None:  # no root yet: nothing new; the partitions of offsets planned on a root
            # that is gone are left out, as deleted ones are (partitions() reports the data loss)
            return to_json({}) if from_json(start, "start offset") else start
        start_map = from_json(start, "start offset")
        latest = self._available(view)
        self._latest = latest
        begin: dict[TopicPartition, int] = {}
        for tp in latest:
            if tp in start_map:
                begin[tp] = resolve(view, tp, start_map[tp], strategy=self.opts.timestamp_strategy)
            else:  # a new partition: read from the earliest record
                begin[tp] = view.earliest(tp)
        pinned = all(is_offset(v) for v in start_map.values())  # not batch 0 of a fresh query
        if isinstance(limit, ReadAllAvailable):
            end = dict(latest)
        else:
            min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else self.opts.min_offsets_per_trigger
            if (
                min_rows is not None
                and pinned
                and self._target is None
                and self._delay(min_rows, begin, latest)
            ):
                return start
            end = (
                rate_limit(limit.max_rows, begin, latest) if isinstance(limit, ReadMaxRows) else dict(latest)
            )
        out = to_json(end)
        if out != start:  # Spark runs a batch (offsets moved): the delay restarts
            self._last_trigger_ms = time.monotonic() * 1000
        return out  # partitions that disappeared are left out: partitions() reports them

    def _available(self, view: RootView) -> dict[TopicPartition, int]:
        tps = view.topic_partitions(self.opts.subscription)
        if self._target is None:
            return view.latest_offsets(tps)
        gone = sorted(set(self._target) - set(tps))
        if gone:
            raise PylogError(
                "Trigger.AvailableNow: topic-partitions present when the query started are gone: "
                + ", ".join(f"{t}-{p}" for t, p in gone)
            )
        return {tp: min(view.latest(tp), end) for tp, end in self._target.items()}

    def _delay(
        self, min_rows: int, begin: dict[TopicPartition, int], latest: dict[TopicPartition, int]
    ) -> bool:
        """Kafka's ``delayBatch``: skip this trigger while fewer than ``min_rows`` offsets are
        new, until maxTriggerDelay has passed since the last batch ran (the first trigger of a
        reader, after a start or restart, is not delayed: the timer starts at 0, as in Kafka).
        The timer restarts when a batch runs, not at a trigger that finds nothing new."""
        now = time.monotonic() * 1000
        return (
            backlog(begin, latest) < min_rows and now - self._last_trigger_ms < self.opts.max_trigger_delay_ms
        )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else to_json(self._latest)

    # ------------------------------------------------------------------ planning and reading

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        start_map = from_json(start, "start offset")
        end_map = resolved(from_json(end, "end offset"))
        gone = sorted(tp for tp, v in start_map.items() if tp not in end_map and is_offset(v))
        if gone:
            report_data_loss(
                "topic-partitions " + ", ".join(f"{t}-{p}" for t, p in gone) + " are gone (deleted).",
                self.opts.fail_on_data_loss,
            )
        unplanned = sorted(tp for tp, v in start_map.items() if tp not in end_map and not is_offset(v))
        if unplanned:  # Kafka: "Cannot find earliest offsets of ..." (batch 0's partitions)
            report_data_loss(
                "topic-partitions "
                + ", ".join(f"{t}-{p}" for t, p in unplanned)
                + " were deleted before the query's first batch was planned: none of their records "
                "is read.",
                self.opts.fail_on_data_loss,
            )
        view = self._view
        if view is None or not all(is_offset(v) for v in start_map.values()):
            view = self._refresh()
        if view is None:  # no root yet (Spark plans batch 0 even when it is empty), or it is gone
            if end_map:
                raise NoRootError(f"{self.opts.path}: no pylog root any more (offsets were planned on it)")
            return []
        ranges = []
        for tp, until in sorted(end_map.items()):
            new_start = 0
            if tp not in start_map and view.exists(tp) and (first := view.earliest(tp)) > 0:
                # Kafka: a partition added after the query started is read from offset 0
                report_data_loss(
                    f"Added partition {tp[0]}-{tp[1]} starts from {first} instead of 0: its records "
                    f"below {first} were removed (retention) before this query read them.",
                    self.opts.fail_on_data_loss,
                )
                new_start = first
            begin = resolve(view, tp, start_map.get(tp, new_start), bound=until)
            if until < begin:
                report_data_loss(
                    f"{tp[0]}-{tp[1]}: offset was changed from {begin} to {until} (the log was deleted and "
                    "recreated, or truncated).",
                    self.opts.fail_on_data_loss,
                )
                continue
            ranges.append(OffsetRange(tp[0], tp[1], begin, until))
        ranges = split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)
        return [InputPartition(task_for(self.opts, r)) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task: ReadTask = partition.value
        on_task_start()
        yield from read_task(task)

    def commit(self, end: dict[str, Any]) -> None:
        """Record the offsets this query has processed in the root (for ``pylog describe``)."""
        offsets = resolved(from_json(end, "end offset"))
        try:
            view = self._view or self._refresh()
            if view is None:  # the root is gone: nothing to record the offsets in
                return
            write_consumer_offsets(view.root.storage, self.opts.group_id, offsets)
            if not self._expired:  # once per run: records of ended runs, as Kafka expires groups
                self._expired = True
                gone = expire_consumer_offsets(view.root.storage, int(time.time() * 1000), self.opts.group_id)
                if gone:
                    log.info("removed the consumed offsets of %d groups idle for 7 days", len(gone))
        except (OSError, PylogError) as e:  # observability only: never fail the query for it
            if not self._commit_warned:
                log.warning("could not record the consumed offsets of %s: %s", self.opts.group_id, e)
                self._commit_warned = True

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
