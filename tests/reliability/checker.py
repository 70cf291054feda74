"""The invariants of DESIGN.md §6 as a checker, in Jepsen's terms.

A :class:`Model` holds, per partition, the records whose write was *acknowledged* (the call
returned), and the *history*: every (offset, value) a reader has ever seen.  After a crash and
recovery, :meth:`Model.check` compares what the log serves with them and counts:

* ``lost``        an acknowledged record missing (and not legitimately removed by retention -
                  an offset below the log start - or by compaction - a later record of the
                  same key is present);
* ``duplicated``  a value served twice;
* ``inconsistent``an offset served with a value other than the one seen there before (§6.1);
* ``unordered``   offsets not strictly increasing (§6.2);
* ``phantom``     a record that no call ever wrote, or a part of an in-flight write (atomic
                  operations must be all or nothing, §6.4).

Every check raises :class:`InvariantViolation` with the details at the first violation, so a
failing seed is reported with what went wrong; :class:`Stats` carries the figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from pylog.storage.backends.base import Storage
from pylog.storage.root.manager import Root

TP = tuple[str, int]
Row = tuple[int, bytes | None, bytes]  # offset, key, value


class InvariantViolation(AssertionError):
    """A §6 invariant does not hold."""


@dataclass
class Stats:
    crash_points: int = 0
    power_cuts: int = 0
    kills: int = 0
    recoveries: int = 0
    records_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    inconsistent: int = 0
    unordered: int = 0
    phantom: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def add(self, other: Stats) -> None:
        for name in (
            "crash_points",
            "power_cuts",
            "kills",
            "recoveries",
            "records_checked",
            "lost",
            "duplicated",
            "inconsistent",
            "unordered",
            "phantom",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.extra.items():
            self.extra[k] = self.extra.get(k, 0) + v

    def bump(self, name: str, n: int = 1) -> None:
        self.extra[name] = self.extra.get(name, 0) + n

    @property
    def violations(self) -> int:
        return self.lost + self.duplicated + self.inconsistent + self.unordered + self.phantom


def read_rows(root: Root, topics: Iterable[str] | None = None, *, probes: int = 6) -> dict[TP, list[Row]]:
    """What a reader of ``root`` is served: every partition's records, in log order (a scan
    from the log start), checked against fetches starting at ``probes`` offsets spread over it."""
    out: dict[TP, list[Row]] = {}
    for topic in root.topics() if topics is None else topics:
        if topic not in root.topics():
            continue
        for p in range(root.partitions(topic)):
            rows = _rows(root.read_table(topic, [p]))
            out[(topic, p)] = rows
            # a consumer may start anywhere: a fetch from an offset must serve what the scan did
            picks = {0, len(rows) - 1, *range(0, len(rows), max(1, len(rows) // probes))} if probes else set()
            for i in sorted(picks):
                if 0 <= i < len(rows):
                    off = rows[i][0]
                    got = _rows(root.read_table(topic, [p], start_offset=off, end_offset=off + 1))
                    if got != [rows[i]]:
                        raise InvariantViolation(
                            f"{(topic, p)}: a fetch from offset {off} serves {got}, a scan served {rows[i]}"
                        )
    return out


def _rows(t: pa.Table) -> list[Row]:
    return list(
        zip(
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )


def read_storage(storage: Storage, topics: Iterable[str] | None = None) -> dict[TP, list[Row]]:
    """A reader's view (no lock, nothing changed on disk)."""
    reader = Root(storage, read_only=True)
    try:
        return read_rows(reader, topics)
    finally:
        reader.close()


def log_starts(root: Root) -> dict[TP, int]:
    return {(t, p): root.log(t, p).log_start_offset for t in root.topics() for p in range(root.partitions(t))}


@dataclass
class Model:
    """Acknowledged records and the history of what readers saw, per partition."""

    acked: dict[TP, dict[int, tuple[bytes | None, bytes]]] = field(default_factory=dict)
    history: dict[TP, dict[int, bytes]] = field(default_factory=dict)
    compacted: set[str] = field(default_factory=set)  # topics where compaction may remove records
    stats: Stats = field(default_factory=Stats)

    def ack(self, tp: TP, rows: Iterable[Row]) -> None:
        part = self.acked.setdefault(tp, {})
        for off, key, value in rows:
            if off in part and part[off][1] != value:
                raise InvariantViolation(
                    f"{tp}: offset {off} acknowledged twice, with {part[off][1]!r} and {value!r}"
                )
            part[off] = (key, value)

    def check(
        self,
        served: Mapping[TP, list[Row]],
        *,
        starts: Mapping[TP, int] | None = None,
        inflight: Mapping[TP, list[bytes]] | None = None,
        atomic: bool = True,
        context: str = "",
    ) -> dict[TP, list[Row]]:
        """Check ``served`` against the model; returns the in-flight records that are visible
        (the caller acknowledges them: the operation completed before the crash).

        ``inflight``: the values of the operation the crash interrupted, per partition; with
        ``atomic`` they must be visible entirely or not at all, across partitions."""
        inflight = inflight or {}
        inflight_values = {v: tp for tp, vs in inflight.items() for v in vs}
        visible: dict[TP, list[Row]] = {}
        where = f" ({context})" if context else ""
        for tp, rows in served.items():
            offsets = [r[0] for r in rows]
            if any(b <= a for a, b in itertools.pairwise(offsets)):
                self.stats.unordered += 1
                raise InvariantViolation(f"{tp}: offsets not strictly increasing{where}: {offsets[:50]}")
            values = [r[2] for r in rows]
            if len(set(values)) != len(values):
                self.stats.duplicated += 1
                dup = sorted({v for v in values if values.count(v) > 1})[:5]
                raise InvariantViolation(f"{tp}: duplicated values{where}: {dup}")
            hist = self.history.setdefault(tp, {})
            acked = self.acked.get(tp, {})
            for off, key, value in rows:
                seen = hist.get(off)
                if seen is not None and seen != value:
                    self.stats.inconsistent += 1
                    raise InvariantViolation(
                        f"{tp}: offset {off} served {value!r}, earlier {seen!r}{where} (two values)"
                    )
                if off in acked:
                    if acked[off][1] != value:
                        self.stats.inconsistent += 1
                        raise InvariantViolation(
                            f"{tp}: offset {off} holds {value!r}, acknowledged {acked[off][1]!r}{where}"
                        )
                elif inflight_values.get(value) == tp:
                    visible.setdefault(tp, []).append((off, key, value))
                else:
                    self.stats.phantom += 1
                    raise InvariantViolation(
                        f"{tp}: offset {off} holds {value!r}, never acknowledged nor in flight{where}"
                    )
            present = {r[0] for r in rows}
            latest_by_key: dict[bytes | None, int] = {}
            for off, key, _ in rows:
                latest_by_key[key] = max(latest_by_key.get(key, -1), off)
            start = (starts or {}).get(tp, 0)
            gone = []
            for off, (key, value) in acked.items():
                if off in present:
                    continue
                removed_by_retention = off < start
                removed_by_compaction = tp[0] in self.compacted and latest_by_key.get(key, -1) > off
                if not (removed_by_retention or removed_by_compaction):
                    self.stats.lost += 1
                    raise InvariantViolation(
                        f"{tp}: acknowledged offset {off} ({value!r}) lost{where}; log start {start}, "
                        f"served {len(rows)} records, offsets {offsets[:10]}...{offsets[-5:]}"
                    )
                gone.append(off)
            for off in gone:  # legitimately removed: gone forever
                del acked[off]
            for off, _, value in rows:
                hist[off] = value
            self.stats.records_checked += len(rows)
        for tp in self.acked:
            if self.acked[tp] and tp not in served:
                self.stats.lost += 1
                raise InvariantViolation(f"{tp}: partition with acknowledged records is gone{where}")
        if atomic and inflight:
            n_visible = sum(len(v) for v in visible.values())
            n_inflight = sum(len(v) for v in inflight.values())
            if n_visible not in (0, n_inflight):
                self.stats.phantom += 1
                raise InvariantViolation(
                    f"in-flight write partly visible{where}: {n_visible} of {n_inflight} records"
                )
        return visible


def values_of(rows: Iterable[Row]) -> list[bytes]:
    return [r[2] for r in rows]


def open_writer(storage: Storage) -> Root:
    """Open ``storage`` as the writer and recover every partition (as a restarted writer does)."""
    root = Root(storage)
    for topic in root.topics():
        for p in range(root.partitions(topic)):
            root.writable_log(topic, p)
    if not root.topics():
        root._ensure_writer()
    return root


__all__ = [
    "InvariantViolation",
    "Model",
    "Stats",
    "log_starts",
    "open_writer",
    "read_rows",
    "read_storage",
    "values_of",
]
