"""Helpers shared by the cleaner, retention, transactions and maintenance tests."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import batch as B
from pylog.storage.codec import records
from pylog.storage.config import CleanerConfig, LogConfig
from pylog.storage.maintenance.cleaner import Cleaner
from pylog.storage.partition import loader
from pylog.storage.partition.loader import load_log
from pylog.storage.partition.log import Log
from pylog.tools.dump import dump

DIR = "t-0"
DAY = 86_400_000
T0 = 1_700_000_000_000

Row = tuple[int, bytes | None, bytes | None]


def config(**cfg: Any) -> LogConfig:
    base: dict[str, Any] = {"cleanup.policy": "compact", "segment.bytes": 1024, "index.interval.bytes": 100}
    base.update({k.replace("_", "."): v for k, v in cfg.items()})
    return LogConfig.from_dict(base)


def open_log(root: Path, **cfg: Any) -> Log:
    return loader.open_log(LocalStorage(root), DIR, config(**cfg), had_clean_shutdown=True)


def reopen(root: Path, *, clean: bool = False, log_start_offset: int = 0, **cfg: Any) -> Log:
    """Open the log again the way the log manager does after a crash (unclean by default)."""
    return load_log(
        LocalStorage(root),
        DIR,
        config(**cfg),
        had_clean_shutdown=clean,
        recovery_point=0,
        log_start_offset=log_start_offset,
    ).log


def put(lg: Log, key: bytes | None, value: bytes | None, ts: int = T0, **kw: Any) -> int:
    """Append one record as its own batch; returns its offset."""
    return lg.append([value], key=[key], timestamp=ts, **kw).first_offset


def put_many(lg: Log, pairs: list[tuple[bytes, bytes | None]], ts: int = T0, **kw: Any) -> None:
    """One record per batch (so segments roll at segment.bytes between records)."""
    for k, v in pairs:
        put(lg, k, v, ts, **kw)


def rows(lg: Log, start: int | None = None) -> list[Row]:
    t = lg.read_table(start)
    return list(
        zip(
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )


def cleaner(map_bytes: int = 1 << 20) -> Cleaner:
    return Cleaner(CleanerConfig.from_dict({"log.cleaner.dedupe.buffer.size": map_bytes}))


def latest_per_key(before: list[Row], upper: int) -> list[Row]:
    """The model of one full cleaning pass without tombstone removal: below ``upper`` only the
    latest record of each key; everything at or above it."""
    last: dict[bytes | None, int] = {}
    for o, k, _ in before:
        if o < upper:
            last[k] = o
    return [r for r in before if r[0] >= upper or last[r[1]] == r[0]]


def segment_files(root: Path) -> dict[str, bytes]:
    d = root / DIR
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def headers(lg: Log) -> B.BatchHeaders:
    """Every batch header of the log, in order."""
    return B.BatchHeaders.concat([loc.headers for seg in lg.segments for loc in seg.iter_batches(0)])


def batch_at(lg: Log, base_offset: int) -> B.BatchHeaders:
    """The header of the batch whose base offset is ``base_offset`` (a one-row BatchHeaders)."""
    h = headers(lg)
    rows_ = [i for i, b in enumerate(h.base_offset.tolist()) if b == base_offset]
    assert rows_, f"no batch at base offset {base_offset}"
    return h.take(rows_)


def assert_kafka_valid(root: Path) -> None:
    """Every batch passes kafka-python's CRC check and every index verifies against its log."""
    d = root / DIR
    for name in sorted(os.listdir(d)):
        if name.endswith(".log"):
            data = (d / name).read_bytes()
            rs = records.decode(data) if data else None
            if rs is None:
                continue
            h = rs.batches
            for p, s, m in zip(h.position.tolist(), h.size.tolist(), h.magic.tolist(), strict=True):
                raw = data[p : p + s]
                batch = DefaultRecordBatch(raw) if m >= 2 else LegacyRecordBatch(raw, m)
                assert batch.validate_crc(), f"{name}: batch at {p}"
    files = [
        str(d / n) for n in sorted(os.listdir(d)) if n.endswith((".log", ".index", ".timeindex", ".txnindex"))
    ]
    out, err = io.StringIO(), io.StringIO()
    assert dump(files, verify_index_only=True, out=out, err=err) == 0, err.getvalue()


class Crash(Exception):
    """Raised by a step hook to simulate a process crash at a named step."""


def crash_at(lg: Log, step: str, occurrence: int = 1) -> None:
    seen = [0]

    def hook(name: str) -> None:
        if name == step:
            seen[0] += 1
            if seen[0] == occurrence:
                raise Crash(step)

    lg.faults.hook = hook
