"""``dump``: Kafka DumpLogSegments output for broker fixtures and pylog-written segments.

Expected lines are built from format strings written out here (from Kafka's
DumpLogSegments.scala), filled with values read from the bytes by the small struct-based parser
below (independent of pylog's decoder) or from the fixtures' expected.jsonl.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import crc32c
import pytest

from pylog.storage.backends.local import LocalStorage
from pylog.storage.codec import records
from pylog.storage.codec.batch import COMMIT, CONTROL_KEY, END_TXN_VALUE
from pylog.storage.partition.index import OffsetIndex, TimeIndex
from pylog.storage.partition.txnindex import TxnIndex
from pylog.tools.dump import dump
from tests.kafka_fixtures import ROOT as FIXTURES
from tests.kafka_fixtures import manifest_params, require_fixtures

LUCID = "kafka-go/v2-v2/test-lucid-0/00000000000000000000.log"
EDGY = "kafka-go/v1-v1/test-edgy-0/00000000000000000000.log"
MIXED = "kafka-go/v1-v1c-v2-v2c-v2b-v2b-v2b-v2bc-v1b-v1bc/test-88-0/00000000000000000000.log"
BAD_CRC = "kafka-rust/fetch2.mytopic.nocompression.invalid_crc.kafka.0900/my-topic-0/00000000000000000000.log"

# The line formats of DumpLogSegments, written out.
V2_BATCH = (
    "baseOffset: {base} lastOffset: {last} count: {count} baseSequence: {bseq} lastSequence: {lseq} "
    "producerId: {pid} producerEpoch: {epoch} partitionLeaderEpoch: {ple} isTransactional: {txn} "
    "isControl: {ctl} deleteHorizonMs: {horizon} position: {pos} {tstype}: {maxts} size: {size} "
    "magic: 2 compresscodec: {codec} crc: {crc} isvalid: {valid}"
)
LEGACY_BATCH = (
    "offset: {offset} position: {pos} {tstype}: {ts} size: {size} magic: {magic} "
    "compresscodec: {codec} crc: {crc} isvalid: {valid}"
)
V2_RECORD = (
    "| offset: {offset} {tstype}: {ts} keySize: {ks} valueSize: {vs} sequence: {seq} headerKeys: [{hkeys}]"
)
LEGACY_RECORD = (
    "| offset: {offset} {tstype}: {ts} keySize: {ks} valueSize: {vs} isValid: {valid} crc: {crc}}}"
)
KEY = " key: {key}"
PAYLOAD = " payload: {value}"
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def need(rel: str) -> Path:
    require_fixtures()
    path = FIXTURES / rel
    if not path.is_file():
        pytest.skip(f"fixture {rel} is not present under {FIXTURES}")
    return path


def run(paths: list[str | Path], **kw: Any) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    rc = dump([str(p) for p in paths], out=out, err=err, **kw)
    return rc, out.getvalue().splitlines(), err.getvalue().splitlines()


def jbool(b: bool) -> str:
    return "true" if b else "false"


# --------------------------------------------------------------------------- independent parser


def entries(raw: bytes) -> list[dict[str, Any]]:
    """Every complete entry's printable fields, read with struct/zlib/crc32c only."""
    out, p = [], 0
    while p + 17 < len(raw):
        offset, size = struct.unpack_from(">qi", raw, p)
        if p + 12 + size > len(raw):
            break
        magic = raw[p + 16]
        e: dict[str, Any] = {"pos": p, "size": size + 12, "magic": magic}
        if magic == 2:
            f = struct.unpack_from(">qiibIhiqqqhii", raw, p)
            e.update(
                base=f[0],
                ple=f[2],
                crc=f[4],
                attrs=f[5],
                last=f[0] + f[6],
                base_ts=f[7],
                maxts=f[8],
                pid=f[9],
                epoch=f[10],
                bseq=f[11],
                count=f[12],
                valid=crc32c.crc32c(raw[p + 21 : p + 12 + size]) == f[4],
            )
        else:
            _, _, crc, _, attrs = struct.unpack_from(">qiIbb", raw, p)
            ts = struct.unpack_from(">q", raw, p + 18)[0] if magic == 1 else -1
            valid = zlib.crc32(raw[p + 16 : p + 12 + size]) == crc
            e.update(offset=offset, crc=crc, attrs=attrs, ts=ts, valid=valid, inner=[(crc, valid)])
            if attrs & 7 == 1:  # gzip wrapper: the inner messages' crcs
                q = p + (26 if magic == 1 else 18)
                q += 4 + max(struct.unpack_from(">i", raw, q)[0], 0)
                vlen = struct.unpack_from(">i", raw, q)[0]
                inner = gzip.decompress(raw[q + 4 : q + 4 + vlen])
                e["inner"], r = [], 0
                while r < len(inner):
                    isize, icrc = struct.unpack_from(">iI", inner, r + 8)
                    e["inner"].append((icrc, zlib.crc32(inner[r + 16 : r + 12 + isize]) == icrc))
                    r += 12 + isize
        out.append(e)
        p += size + 12
    return out


def tstype(magic: int, attrs: int) -> str:
    return "NoTimestampType" if magic == 0 else ("LogAppendTime" if attrs & 8 else "CreateTime")


def batch_line(e: dict[str, Any]) -> str:
    if e["magic"] == 2:
        lseq = -1 if e["bseq"] == -1 else (e["bseq"] + e["last"] - e["base"]) % 2**31  # wraps to 0
        horizon = f"OptionalLong[{e['base_ts']}]" if e["attrs"] & 0x40 else "OptionalLong.empty"
        return V2_BATCH.format(
            base=e["base"],
            last=e["last"],
            count=e["count"],
            bseq=e["bseq"],
            lseq=lseq,
            pid=e["pid"],
            epoch=e["epoch"],
            ple=e["ple"],
            txn=jbool(e["attrs"] & 0x10),
            ctl=jbool(e["attrs"] & 0x20),
            horizon=horizon,
            pos=e["pos"],
            tstype=tstype(2, e["attrs"]),
            maxts=e["maxts"],
            size=e["size"],
            codec=CODECS[e["attrs"] & 7],
            crc=e["crc"],
            valid=jbool(e["valid"]),
        )
    return LEGACY_BATCH.format(
        offset=e["offset"],
        pos=e["pos"],
        tstype=tstype(e["magic"], e["attrs"]),
        ts=e["ts"],
        size=e["size"],
        magic=e["magic"],
        codec=CODECS[e["attrs"] & 7],
        crc=e["crc"],
        valid=jbool(e["valid"]),
    )


def expected_rows(log: Path) -> list[dict[str, Any]]:
    text = log.with_name(log.name.replace(".log", ".expected.jsonl")).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def expected_output(log: Path, *, deep: bool, data: bool, raw: bytes | None = None) -> list[str]:
    """The lines of dumping ``log`` (a fixture; or ``raw``, a prefix of its bytes, at ``log``)."""
    raw = log.read_bytes() if raw is None else raw
    rows = expected_rows(log)
    lines = [f"Dumping {log}", f"Log starting offset: {int(log.name.split('.')[0])}"]
    for e in entries(raw):
        lines.append(batch_line(e))
        if not deep:
            continue
        key = (e["magic"] == 2, e["base"] if e["magic"] == 2 else e["offset"])
        mine = [r for r in rows if (r["magic"] == 2, r["batch_base_offset"]) == key]
        for j, r in enumerate(mine):
            k = None if r["key_b64"] is None else base64.b64decode(r["key_b64"])
            v = None if r["value_b64"] is None else base64.b64decode(r["value_b64"])
            ks, vs = (-1 if x is None else len(x) for x in (k, v))
            fields = {"offset": r["offset"], "ts": r["timestamp"], "ks": ks, "vs": vs}
            if e["magic"] == 2:
                seq = -1 if e["bseq"] < 0 else (e["bseq"] + r["offset"] - e["base"]) % 2**31
                hkeys = ",".join(h[0] for h in r["headers"])
                line = V2_RECORD.format(tstype=tstype(2, e["attrs"]), seq=seq, hkeys=hkeys, **fields)
            else:
                crc, valid = e["inner"][j]
                line = LEGACY_RECORD.format(
                    tstype=tstype(e["magic"], e["attrs"]), valid=jbool(valid), crc=crc, **fields
                )
            if data:
                line += "" if k is None else KEY.format(key=k.decode("utf-8", "replace"))
                line += "" if v is None else PAYLOAD.format(value=v.decode("utf-8", "replace"))
            lines.append(line)
    return lines


# --------------------------------------------------------------------------- (a) fixtures


def test_v2_fixture_literal_golden() -> None:
    log = need(LUCID)
    rc, out, err = run([log])
    assert (rc, err) == (0, [])
    assert out == [
        f"Dumping {log}",
        "Log starting offset: 0",
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1633414495954 size: 150 magic: 2 "
        "compresscodec: none crc: 964230203 isvalid: true",
        "baseOffset: 2 lastOffset: 3 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        "deleteHorizonMs: OptionalLong.empty position: 150 CreateTime: 1633414505247 size: 152 magic: 2 "
        "compresscodec: none crc: 4201977003 isvalid: true",
    ]
    rc, out, err = run([log], print_data_log=True)
    assert out[3] == (
        "| offset: 0 CreateTime: 1633414495929 keySize: 5 valueSize: 33 sequence: -1 headerKeys: [] "
        'key: alpha payload: {"count":0,"filler":"aaaaaaaaaa"}'
    )


@pytest.mark.parametrize(
    "rel", [LUCID, EDGY, MIXED, "kafka-go/v1c-v1-v1c/test-breezy-0/00000000000000000000.log"]
)
@pytest.mark.parametrize(("deep", "data"), [(False, False), (True, False), (True, True)])
def test_fixture_output(rel: str, deep: bool, data: bool) -> None:
    log = need(rel)
    rc, out, err = run([log], deep_iteration=deep and not data, print_data_log=data)
    assert (rc, err) == (0, [])
    assert out == expected_output(log, deep=deep, data=data)


def test_legacy_fixture_lines_literal() -> None:
    log = need(EDGY)
    _, out, _ = run([log], deep_iteration=True)
    assert out[2] == (
        "offset: 0 position: 0 CreateTime: 1633413553279 size: 72 magic: 1 compresscodec: none "
        "crc: 2727571829 isvalid: true"
    )
    assert out[3] == (
        "| offset: 0 CreateTime: 1633413553279 keySize: 5 valueSize: 33 isValid: true crc: 2727571829}"
    )


def test_bad_crc_fixture_is_reported_with_exit_status_0() -> None:
    """As kafka-dump-log.sh: the entry is printed with ``isvalid: false`` and the dump
    completes (exit status 0); ``pylog verify`` is the command that fails on it."""
    log = need(BAD_CRC)
    rc, out, err = run([log], deep_iteration=True)
    assert rc == 0 and err == []
    assert out[2].endswith("magic: 0 compresscodec: none crc: 1482184792 isvalid: false")
    assert out[2].startswith("offset: 0 position: 0 NoTimestampType: -1 size: 497 ")
    assert (
        out[3] == "| offset: 0 NoTimestampType: -1 keySize: -1 valueSize: 471 isValid: false crc: 1482184792}"
    )


def test_trailing_garbage_and_torn_tail(tmp_path: Path) -> None:
    """Invalid bytes at the end are reported on stdout after the complete entries, with exit
    status 0, as kafka-dump-log.sh does (``println`` in ``dumpLog``, then a normal exit)."""
    src = need(LUCID).read_bytes()
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(src + b"\x00" * 10)
    rc, out, err = run([log])
    assert (rc, err) == (0, [])
    assert out[-1] == "Found 10 invalid bytes at the end of 00000000000000000000.log"
    log.write_bytes(src[:200])  # cut inside the second batch
    rc, out, err = run([log])
    assert (rc, err) == (0, []) and len(out) == 4
    assert out[-1] == "Found 50 invalid bytes at the end of 00000000000000000000.log"
    rc, out, _ = run([log], max_bytes=160)  # Kafka reports trailing bytes only without --max-bytes
    assert rc == 0 and len(out) == 3 and not out[-1].startswith("Found")


def _entry_spans(raw: bytes) -> list[tuple[int, int]]:
    """(start, end) of every complete entry, from the size fields alone."""
    spans, p = [], 0
    while p + 12 <= len(raw):
        end = p + 12 + struct.unpack_from(">i", raw, p + 8)[0]
        if end > len(raw):
            break
        spans.append((p, end))
        p = end
    return spans


@pytest.mark.parametrize("entry", manifest_params())
@pytest.mark.parametrize("kept", [5, 17, 18, -1])
def test_broker_fixture_with_torn_tail(entry: dict[str, Any], kept: int, tmp_path: Path) -> None:
    """Every broker-written segment, its last entry torn after ``kept`` bytes (-1: all but the
    last byte), as a crash or a size-limited fetch leaves it: the complete entries and their
    records print exactly as from the whole file, then Kafka's ``Found N invalid bytes at the
    end of <file>`` line; exit status 0."""
    src = need(entry["log"])
    raw = src.read_bytes()
    spans = _entry_spans(raw)
    assert spans[-1][1] == len(raw)
    start, end = spans[-1]
    cut = start + (end - start - 1 if kept < 0 else kept)
    torn = tmp_path / src.name
    torn.write_bytes(raw[:cut])
    deep = "snappy" not in entry["codecs"]  # the parser above reads inner crcs of gzip only
    rc, out, err = run([torn], print_data_log=deep)
    assert (rc, err) == (0, [])
    whole = expected_output(src, deep=deep, data=deep)  # every entry, with its records
    want = expected_output(src, deep=deep, data=deep, raw=raw[:cut])  # the complete ones
    assert want[1:] == whole[1 : len(want)]
    assert sum(not line.startswith("| ") for line in want) == 2 + len(spans) - 1
    found = f"Found {cut - start} invalid bytes at the end of {src.name}"
    assert out == [f"Dumping {torn}", *want[1:], found]


def test_corrupt_entry_reports_error_after_good_batches(tmp_path: Path) -> None:
    src = need(LUCID).read_bytes()
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(src[:150] + struct.pack(">qi", 2, 5) + b"\x02" * 40)
    rc, out, err = run([log])
    assert rc == 1 and len(out) == 3 and out[2].startswith("baseOffset: 0 lastOffset: 1 ")
    assert len(err) == 1 and str(log) in err[0] and "byte 150" in err[0]


# --------------------------------------------------------------------------- synthetic segments


def write(path: Path, *parts: bytes) -> Path:
    path.write_bytes(b"".join(parts))
    return path


def test_transactional_and_control_records(tmp_path: Path) -> None:
    data = records.encode(
        [b"v1", b"v2"],
        [b"k1", None],
        [1000, 1001],
        [[("h1", b"x"), ("h2", None)], []],
        base_offset=10,
        producer_id=42,
        producer_epoch=3,
        base_sequence=2**31 - 1,
        is_transactional=True,
    ).tobytes()
    marker = records.control_batch(
        COMMIT, offset=12, producer_id=42, producer_epoch=3, coordinator_epoch=7, timestamp=1002
    )
    odd = records.encode([b"?"], [CONTROL_KEY.pack(0, 9)], 1003, base_offset=13, is_control=True).tobytes()
    log = write(tmp_path / "00000000000000000010.log", data, marker, odd)
    rc, out, err = run([log], print_data_log=True)
    assert (rc, err) == (0, [])
    es = entries(log.read_bytes())
    assert out == [
        f"Dumping {log}",
        "Log starting offset: 10",
        batch_line(es[0]),
        "| offset: 10 CreateTime: 1000 keySize: 2 valueSize: 2 sequence: 2147483647 headerKeys: [h1,h2] "
        "key: k1 payload: v1",
        "| offset: 11 CreateTime: 1001 keySize: -1 valueSize: 2 sequence: 0 headerKeys: [] payload: v2",
        batch_line(es[1]),
        "| offset: 12 CreateTime: 1002 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 7",
        batch_line(es[2]),
        "| offset: 13 CreateTime: 1003 keySize: 4 valueSize: 1 sequence: -1 headerKeys: [] "
        "controlType: UNKNOWN(9)",
    ]
    assert "baseSequence: 2147483647 lastSequence: 0 producerId: 42 producerEpoch: 3" in out[2]
    assert "isTransactional: true isControl: true" in out[5]
    assert END_TXN_VALUE.size == 6


def test_log_append_time_delete_horizon_and_utf8(tmp_path: Path) -> None:
    raw = bytearray(records.encode([b"\xff\xfeok", b"b"], [b"k", b""], [5, 9], timestamp_type=1).tobytes())
    attrs = struct.unpack_from(">h", raw, 21)[0] | 0x40
    struct.pack_into(">h", raw, 21, attrs)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    log = write(tmp_path / "00000000000000000000.log", bytes(raw))
    rc, out, _ = run([log], print_data_log=True)
    assert rc == 0
    assert out[2] == batch_line(entries(bytes(raw))[0])
    assert "deleteHorizonMs: OptionalLong[5] position: 0 LogAppendTime: 9 size:" in out[2]
    assert out[3].startswith("| offset: 0 LogAppendTime: 9 keySize: 1 valueSize: 4 ")
    assert out[3].endswith(" key: k payload: \ufffd\ufffdok")
    assert out[4].endswith(" key:  payload: b")  # empty key: printed, empty


def test_skip_record_metadata(tmp_path: Path) -> None:
    log = write(
        tmp_path / "00000000000000000000.log", records.encode([b"v", b"w"], [b"k", None], 1).tobytes()
    )
    _, out, _ = run([log], print_data_log=True, skip_record_metadata=True)
    assert out[3:] == ["| key: k payload: v", " payload: w"]


def test_non_consecutive_offsets(tmp_path: Path) -> None:
    log = write(
        tmp_path / "00000000000000000000.log",
        records.encode([b"a", b"b"], timestamp=1, base_offset=0).tobytes(),
        records.encode([b"c"], timestamp=1, base_offset=5).tobytes(),
        records.encode([b"d"], timestamp=1, base_offset=9).tobytes(),
    )
    rc, _, err = run([log], deep_iteration=True)
    assert rc == 0  # compaction leaves gaps: not a failure
    assert err == [
        f"Non-consecutive offsets in {os.path.abspath(log)}",
        "  5 is followed by 9",
        "  1 is followed by 5",
    ]


def test_corrupt_records_in_deep_mode(tmp_path: Path) -> None:
    good = records.encode([b"a"], timestamp=1, base_offset=0).tobytes()
    bad = bytearray(records.encode([b"b"], timestamp=1, base_offset=1).tobytes())
    struct.pack_into(">i", bad, 57, 1000)  # records count that cannot fit
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    log = write(tmp_path / "00000000000000000000.log", good, bytes(bad))
    rc, out, err = run([log])
    assert rc == 0 and "count: 1000" in out[3] and out[3].endswith("isvalid: true")
    rc, out, err = run([log], deep_iteration=True)
    assert rc == 1
    assert len(out) == 5  # batch, its record, then the batch whose records are corrupt
    assert out[2] == batch_line(entries(log.read_bytes())[0])
    assert out[3].startswith("| offset: 0 CreateTime: 1 keySize: -1 valueSize: 1 ")
    assert out[4].startswith("baseOffset: 1 lastOffset: 1 count: 1000")
    assert len(err) == 1 and str(log) in err[0] and "record count 1000" in err[0]


def test_missing_unknown_and_badly_named_files(tmp_path: Path) -> None:
    other = write(tmp_path / "notes.txt", b"x")
    badname = write(tmp_path / "segment.log", records.encode([b"a"], timestamp=1).tobytes())
    missing = tmp_path / "00000000000000000000.log"
    rc, out, err = run([other, missing, badname])
    assert rc == 1
    assert out == [f"Dumping {other}", f"Dumping {missing}", f"Dumping {badname}"]
    assert err[0] == (
        f"{other}: not a segment file: pylog dump reads .log, .index, .timeindex, .txnindex files and "
        "directories of them"
    )
    assert err[1] == f"{missing}: no such file"
    assert err[2].startswith(f"{badname}: cannot take a base offset")
    rc, _, err = run([other])
    assert rc == 1  # Kafka's tool only ignores it: a typo would pass unnoticed
    rc, _, err = run([tmp_path / "nothing-here.txt"])
    assert (rc, err) == (1, [f"{tmp_path / 'nothing-here.txt'}: no such file or directory"])


# --------------------------------------------------------------------------- (b) indexes


def make_segment(directory: Path, base: int = 100) -> tuple[Path, list[tuple[int, int, int]]]:
    """A segment of 4 batches with an index entry per batch; returns (.log path, (lastOffset,
    position, max timestamp so far) per batch)."""
    storage = LocalStorage(directory)
    stem = f"{base:020d}"
    parts, facts, pos, off, max_ts = [], [], 0, base, -1
    oi = OffsetIndex(storage, f"{stem}.index", base)
    ti = TimeIndex(storage, f"{stem}.timeindex", base)
    for n, ts in ((3, 1000), (1, 1500), (2, 1200), (4, 2000)):
        b = records.encode(
            [b"x%d" % i for i in range(n)], timestamp=[ts - i for i in range(n)], base_offset=off
        )
        parts.append(b.tobytes())
        last = off + n - 1
        oi.append(last, pos)
        max_ts = max(max_ts, ts)
        ti.maybe_append(max_ts, last if max_ts == ts else ti.last_entry[1])
        facts.append((last, pos, max_ts))
        pos += len(b)
        off += n
    oi.close()
    ti.close()
    return write(directory / f"{stem}.log", *parts), facts


def test_index_files_verify_clean(tmp_path: Path) -> None:
    log, facts = make_segment(tmp_path)
    index, tindex = log.with_suffix(".index"), log.with_suffix(".timeindex")
    rc, out, err = run([index, tindex], verify_index_only=True)
    assert (rc, out, err) == (0, [f"Dumping {index}", f"Dumping {tindex}"], [])
    rc, out, err = run([index, tindex])
    assert (rc, err) == (0, [])
    expected_time = [f"timestamp: {t} offset: {o}" for t, o in [(1000, 102), (1500, 103), (2000, 109)]]
    assert out == [
        f"Dumping {index}",
        *(f"offset: {last} position: {pos}" for last, pos, _ in facts),
        f"Dumping {tindex}",
        *expected_time,
    ]
    rc, out, err = run([index, tindex], index_sanity_check=True)
    assert (rc, err) == (0, [])
    assert out == [
        f"Dumping {index}",
        f"{index} passed sanity check.",
        f"Dumping {tindex}",
        f"{tindex} passed sanity check.",
    ]


def test_wrong_index_entries_are_mismatches(tmp_path: Path) -> None:
    log, facts = make_segment(tmp_path)
    index = log.with_suffix(".index")
    index.write_bytes(
        struct.pack(">ii", facts[0][0] - 100, facts[0][1])
        + struct.pack(">ii", 3, facts[1][1])  # offset 103 is right: batch 2 holds 103 only
        + struct.pack(">ii", 4, facts[2][1])  # batch 3 holds 104-105: the entry should say 105
        + struct.pack(">ii", 6, facts[3][1])  # batch 4 holds 106-109
    )
    rc, out, err = run([index], verify_index_only=True)
    assert rc == 1 and out == [f"Dumping {index}"]
    assert err == [
        f"Mismatches in :{os.path.abspath(index)}",
        "  Index offset: 106, log offset: 109",
        "  Index offset: 104, log offset: 105",
    ]


def test_time_index_errors(tmp_path: Path) -> None:
    log, _ = make_segment(tmp_path)
    tindex = log.with_suffix(".timeindex")
    tindex.write_bytes(struct.pack(">qi", 999, 2) + struct.pack(">qi", 1500, 4) + struct.pack(">qi", 1400, 9))
    rc, out, err = run([tindex], verify_index_only=True)
    assert rc == 1 and out == [f"Dumping {tindex}"]
    abs_path = os.path.abspath(tindex)
    assert err == [
        f"Found timestamp mismatch in :{abs_path}",
        "  Index timestamp: 999, log timestamp: 1000",
        "  Index timestamp: 1400, log timestamp: 2000",  # batch 106-109's records reach 2000
        f"Found out of order timestamp in :{abs_path}",
        "  Index timestamp: 1400, Previously indexed timestamp: 1500",
        "The following indexed offsets are not found in the log.",
        "Indexed offset: 104, found log offset: 105",
    ]


def test_sparse_file_stop_rule_and_empty_index(tmp_path: Path) -> None:
    log, facts = make_segment(tmp_path)
    index, tindex = log.with_suffix(".index"), log.with_suffix(".timeindex")
    index.write_bytes(struct.pack(">ii", 2, 0) + b"\x00" * 8 + struct.pack(">ii", 9, facts[3][1]))
    tindex.write_bytes(struct.pack(">qi", 1000, 2) + b"\x00" * 24)
    rc, out, err = run([index, tindex])
    assert (rc, err) == (0, [])
    assert out == [
        f"Dumping {index}",
        "offset: 102 position: 0",
        f"Dumping {tindex}",
        "timestamp: 1000 offset: 102",
    ]
    index.write_bytes(b"")
    rc, out, _ = run([index], index_sanity_check=True)
    assert (rc, out) == (0, [f"Dumping {index}", f"{index} is empty."])


def test_sanity_check_failures(tmp_path: Path) -> None:
    log, _ = make_segment(tmp_path)
    index, tindex = log.with_suffix(".index"), log.with_suffix(".timeindex")
    index.write_bytes(struct.pack(">ii", 2, 0) + b"\x00\x00\x00\x07")
    tindex.write_bytes(struct.pack(">qi", 1000, 2) + struct.pack(">qi", 10, 3))
    rc, out, err = run([index, tindex], index_sanity_check=True)
    assert rc == 1 and out == [f"Dumping {index}", f"Dumping {tindex}"]
    assert (
        err[0]
        == f"{index}: Index file is corrupt, found 12 bytes which is neither positive nor a multiple of 8"
    )
    assert err[1].startswith(f"{tindex}: Corrupt time index found")
    assert "last timestamp is 10 which is less than the first timestamp 1000" in err[1]


def test_index_needs_its_log(tmp_path: Path) -> None:
    log, _ = make_segment(tmp_path)
    log.unlink()
    index = log.with_suffix(".index")
    rc, out, err = run([index])
    assert rc == 1 and out == [f"Dumping {index}"]
    assert err == [f"{index}: the segment's log file {log} does not exist"]


def test_txn_index(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    idx = TxnIndex(storage, "00000000000000000100.txnindex", 100)
    idx.append(7, 100, 105, 106)
    idx.append(8, 103, 110, 111)
    idx.close()
    path = tmp_path / "00000000000000000100.txnindex"
    rc, out, err = run([path], verify_index_only=True)
    assert (rc, err) == (0, [])
    assert out == [
        f"Dumping {path}",
        "version: 0 producerId: 7 firstOffset: 100 lastOffset: 105 lastStableOffset: 106",
        "version: 0 producerId: 8 firstOffset: 103 lastOffset: 110 lastStableOffset: 111",
    ]


# --------------------------------------------------------------------------- directories and JSON


def test_directories_stand_for_their_segment_files(tmp_path: Path) -> None:
    """``pylog dump --files`` takes a partition directory, a topic (``<dir>/<topic>``) or a log
    directory: the segment files in offset order, other files (checkpoints, ``.deleted``,
    producer snapshots) left out."""
    import pylog

    root = tmp_path / "logs"
    with pylog.open(root) as r:
        r.create_topic("my-topic", partitions=2, config={"segment.bytes": 200})
        r.create_topic("other", partitions=1)
        for i in range(6):
            r.append("my-topic", {"key": [b"k"], "value": [b"v%d" % i * 20]}, partition=i % 2)
        r.append("other", {"value": [b"x"]})
    part = root / "my-topic-0"
    write(part / "00000000000000000000.log.deleted", b"old")
    write(part / "00000000000000000000.snapshot", b"")
    write(part / "leader-epoch-checkpoint", b"0\n0\n")
    logs = sorted(p.name for p in part.glob("*.log"))
    assert len(logs) >= 2  # rolled

    def dumped(path: Path) -> list[str]:
        rc, out, err = run([path])
        assert (rc, err) == (0, [])
        return [line.removeprefix("Dumping ") for line in out if line.startswith("Dumping ")]

    files = dumped(part)
    suffixes = [".log", ".index", ".timeindex"]
    assert files == [str(part / (name.removesuffix(".log") + s)) for name in logs for s in suffixes]
    topic = dumped(root / "my-topic")
    assert topic[: len(files)] == files and {Path(f).parent.name for f in topic} == {
        "my-topic-0",
        "my-topic-1",
    }
    assert [Path(f).parent.name for f in dumped(root)][-1] == "other-0"
    assert set(dumped(root)) == set(topic) | set(dumped(root / "other"))
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run([empty])
    assert (rc, err) == (1, [f"{empty}: no segment files in it or in its partition directories"])


def test_json_is_one_object_with_the_fields_of_the_lines(tmp_path: Path) -> None:
    """``as_json``: one object; each file's batches, records and index entries carry the fields
    Kafka's lines print (bytes that are not UTF-8 in base64), problems and errors included."""
    values = [b"a", b"\xff\xfe", None]
    raw = records.encode(values, [b"k", None, b"k"], [10, 11, 12], base_offset=5).tobytes()
    log = write(tmp_path / "00000000000000000005.log", raw)
    idx = OffsetIndex(LocalStorage(tmp_path), "00000000000000000005.index", 5)
    idx.append(6, 0)  # the batch at 0 ends at 7: a mismatch
    idx.close()
    missing = tmp_path / "00000000000000000099.log"
    out = io.StringIO()
    rc = dump(
        [str(log), str(log.with_suffix(".index")), str(missing)], print_data_log=True, as_json=True, out=out
    )
    doc = json.loads(out.getvalue())
    text_rc, text, _ = run([log], print_data_log=True)
    assert rc == 1 and doc["ok"] is False and text_rc == 0
    first, index, gone = doc["files"]
    assert first["file"] == str(log) and first["baseOffset"] == 5
    (batch,) = first["batches"]
    assert (batch["baseOffset"], batch["lastOffset"], batch["count"], batch["isvalid"]) == (5, 7, 3, True)
    assert (batch["timestampType"], batch["maxTimestamp"], batch["deleteHorizonMs"]) == (
        "CreateTime",
        12,
        None,
    )
    assert text[2].startswith(f"baseOffset: 5 lastOffset: 7 count: 3 baseSequence: {batch['baseSequence']} ")
    assert [r["offset"] for r in batch["records"]] == [5, 6, 7]
    assert batch["records"][0]["key"] == "k" and batch["records"][0]["payload"] == "a"
    assert (
        base64.b64decode(batch["records"][1]["payload_b64"]) == b"\xff\xfe"
        and "key" not in batch["records"][1]
    )
    assert "payload" not in batch["records"][2] and batch["records"][2]["valueSize"] == -1
    assert index["entries"] == [{"offset": 6, "position": 0}]
    assert doc["problems"] == [
        {"file": str(log.with_suffix(".index")), "kind": "index-mismatch", "indexOffset": 6, "logOffset": 7}
    ]
    assert gone == {"file": str(missing), "errors": [f"{missing}: no such file"]}
