"""Produce and InitProducerId: appends over the wire, and idempotent producers.

A Produce request's record sets are checked as a broker checks them (:mod:`~pylog.server.records`)
and appended, as the clients encoded them, with the next group commit of the store; the response
comes once the commit is durable (``acks`` 1 and -1 alike: the one node is every replica), and
not at all for ``acks=0``.

Idempotent producers (Kafka's ``ProducerStateManager``): per partition and producer id, the epoch
and the sequence ranges and offsets of the last five batches.  A batch whose sequence range is
one of those is a retry: it is answered with the offset it got the first time, and not appended
again.  A batch that does not follow the last sequence gets OUT_OF_ORDER_SEQUENCE_NUMBER, an older
epoch INVALID_PRODUCER_EPOCH.  A producer this process has not seen on a partition is looked up in
the log (its last five batches there, as the log's producer state keeps them), so a retry across a
server restart is recognised too; producers idle for ``producer.id.expiration.ms`` leave memory.

Producer ids come from the clock (microseconds since the epoch at the first InitProducerId, then
one more each), so they are not reused across restarts of the server.  Transactional producers
(``transactional.id``) are refused: the transaction coordinator APIs are not served.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server import records
from pylog.server.store import Key, PendingAppend, Store
from pylog.storage.errors import DuplicateBatchError, RecordSetError
from pylog.storage.partition import producer_state
from pylog.storage.partition.log import AppendInfo

log = logging.getLogger("pylog.server")

KEPT_BATCHES = producer_state.KEPT_BATCHES
"""Batches remembered per producer and partition (Kafka's ``NUM_BATCHES_TO_RETAIN``)."""
EXPIRATION_S = producer_state.PRODUCER_ID_EXPIRATION_MS / 1000
"""A producer idle this long is forgotten (Kafka's ``producer.id.expiration.ms``)."""
PRUNE_EVERY = 10_000
"""Sequence checks between two looks for idle producers."""
INT32 = 1 << 31


@dataclass
class SequencedBatch:
    """A batch of an idempotent producer: its sequence range, and its base offset."""

    first_seq: int
    last_seq: int
    base_offset: int | None = None  # None until its commit assigned it


@dataclass
class ProducerSequences:
    """What the server checks a producer's next batch on one partition against: its epoch and
    last batches, the ones still in a pending commit included (the log's view of a producer is
    :class:`pylog.storage.partition.producer_state.ProducerEntry`)."""

    epoch: int
    batches: deque[SequencedBatch] = field(default_factory=lambda: deque(maxlen=KEPT_BATCHES))
    used: float = field(default_factory=time.monotonic)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class Producers:
    """Producer ids and the sequence checks (see the module docstring)."""

    def __init__(self, store: Store):
        self.store = store
        self._next_id = 0
        self._state: dict[tuple[Key, int], ProducerSequences] = {}
        self._checks = 0
        store.before_append = self.before_append
        store.after_append = self.after_append

    def new_id(self) -> int:
        self._next_id = max(self._next_id + 1, time.time_ns() // 1000)
        return self._next_id

    # ------------------------------------------------------------------ on the storage thread

    def before_append(self, group: list[PendingAppend]) -> None:
        root = self.store.root
        now = int(time.time() * 1000)
        for p in group:
            metas = p.meta
            for key, data in list(p.sets.items()):
                if isinstance(data, BaseException):
                    continue
                topic, partition = key
                try:
                    checked = records.check_produced(data, root.config(topic), f"{topic}-{partition}", now)
                    metas[key] = self._check_sequence(key, checked)
                except RecordSetError as e:
                    p.sets[key] = e
                    continue
                p.sets[key] = checked.data

    def _check_sequence(self, key: Key, s: records.ProducedSet) -> tuple[int, SequencedBatch] | None:
        if s.producer_id < 0:
            return None
        self._checks += 1
        if self._checks % PRUNE_EVERY == 0:
            self._forget_idle(time.monotonic())
        entry = self._state.get((key, s.producer_id))
        if entry is None:
            entry = self._from_log(key, s.producer_id)
        if entry is not None and s.producer_epoch < entry.epoch:
            raise RecordSetError(
                int(ErrorCode.invalid_producer_epoch),
                f"producer {s.producer_id} epoch {s.producer_epoch} is older than {entry.epoch}",
            )
        if entry is None or s.producer_epoch > entry.epoch:
            if s.base_sequence != 0 and entry is not None:
                raise RecordSetError(
                    int(ErrorCode.out_of_order_sequence_number),
                    f"a new epoch of producer {s.producer_id} must start at sequence 0, "
                    f"not {s.base_sequence}",
                )
            entry = ProducerSequences(s.producer_epoch)
            self._state[(key, s.producer_id)] = entry
        for b in entry.batches:
            if b.first_seq == s.base_sequence and b.last_seq == s.last_sequence:
                if b.base_offset is None:
                    raise RecordSetError(
                        int(ErrorCode.duplicate_sequence_number), "a duplicate of a batch in flight"
                    )
                raise DuplicateBatchError(b.base_offset)
        expected = (entry.last_seq + 1) % INT32 if entry.batches else None
        if expected is not None and s.base_sequence != expected:
            raise RecordSetError(
                int(ErrorCode.out_of_order_sequence_number),
                f"producer {s.producer_id}: sequence {s.base_sequence} on {key[0]}-{key[1]}, "
                f"expected {expected}",
            )
        if expected is None and s.base_sequence != 0:
            raise RecordSetError(
                int(ErrorCode.out_of_order_sequence_number),
                f"producer {s.producer_id} is unknown on {key[0]}-{key[1]}: its first sequence must be 0, "
                f"not {s.base_sequence}",
            )
        meta = SequencedBatch(s.base_sequence, s.last_sequence)
        entry.batches.append(meta)
        entry.used = time.monotonic()
        return s.producer_id, meta

    def _from_log(self, key: Key, pid: int) -> ProducerSequences | None:
        """What the log says of producer ``pid`` on ``key``: its epoch and last five batches
        (after a restart, or once this process forgot an idle producer)."""
        lg = self.store.root.log(*key)
        found = producer_state.state_of(lg).producers.get(pid)
        if found is None or not found.batches:
            return None
        entry = ProducerSequences(found.epoch)
        entry.batches.extend(SequencedBatch(b.first_seq, b.last_seq, b.base_offset) for b in found.batches)
        self._state[(key, pid)] = entry
        return entry

    def _forget_idle(self, now: float) -> None:
        """Producers idle for ``producer.id.expiration.ms`` leave memory (the log still has
        their last batches, if a retry comes after all)."""
        idle = [k for k, e in self._state.items() if now - e.used > EXPIRATION_S]
        for k in idle:
            del self._state[k]

    def after_append(self, group: list[PendingAppend], results: dict[Key, list[Any]]) -> None:
        cursor = {key: 0 for key in results}
        for p in group:
            metas = p.meta
            for key in p.sets:
                i = cursor.get(key, 0)
                cursor[key] = i + 1
                got = results.get(key, [])[i] if i < len(results.get(key, [])) else None
                meta = metas.get(key)
                if meta is None:
                    continue
                pid, batch = meta
                if isinstance(got, AppendInfo):
                    batch.base_offset = got.first_offset
                else:  # not appended: forget what was assumed of this producer
                    self._state.pop((key, pid), None)
