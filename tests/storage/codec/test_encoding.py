"""Encoding a sink task's rows into many partitions at once (``encoding.encode_partitioned``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylog.storage.codec import encoding, records

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
rows_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=30)),
        st.one_of(st.none(), st.binary(max_size=200)),
        st.integers(-(2**62), 2**62),
        st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=9))), max_size=2),
        st.integers(-1, 4),  # partition; -1: the row goes nowhere (another topic)
    ),
    max_size=60,
)


@SETTINGS
@given(
    rows=rows_strategy,
    batch_bytes=st.integers(68, 2000),
    max_records=st.integers(1, 50),
    codec=st.sampled_from(["none", "lz4"]),
    log_append=st.booleans(),
)
def test_one_pass_over_the_rows_makes_each_partitions_batches_byte_for_byte(
    kernels: str, rows: list, batch_bytes: int, max_records: int, codec: str, log_append: bool
) -> None:
    """The oracle is encode of each partition's rows in their order: same batches, same bytes
    (offsets from each partition's own base, CRCs, compression)."""
    keys = [r[0] for r in rows]
    vals = [r[1] for r in rows]
    ts = np.array([r[2] for r in rows], np.int64)
    hdrs = [r[3] for r in rows]
    parts = np.array([r[4] for r in rows], np.int64)
    inp = encoding.EncodeInput.of(vals, keys, ts, hdrs)
    bases = np.array([0, 7, 2**40, 5, 123], np.int64)
    kw = {
        "codec": codec,
        "batch_bytes": batch_bytes,
        "max_records": max_records,
        "timestamp_type": 1 if log_append else 0,
    }
    got = encoding.encode_partitioned(inp, parts, bases, **kw)
    assert sorted(got) == sorted({int(p) for p in parts if p >= 0})
    for p, enc in got.items():
        mine_rows = np.flatnonzero(parts == p).tolist()
        want = encoding.encode(
            [vals[i] for i in mine_rows],
            [keys[i] for i in mine_rows],
            ts[mine_rows],
            [hdrs[i] for i in mine_rows],
            base_offset=int(bases[p]),
            **kw,
        )
        assert enc.buffer.tobytes() == want.buffer.tobytes()
        assert enc.batches.position.tolist() == want.batches.position.tolist()
        assert enc.batches.size.tolist() == want.batches.size.tolist()
        rs = records.decode(enc.buffer)  # and it decodes to the partition's rows
        assert rs.records.column("offset").to_pylist() == list(range(int(bases[p]), int(bases[p]) + len(rs)))
        mine = [v for v, q in zip(vals, parts, strict=True) if q == p]
        assert rs.records.column("value").to_pylist() == mine


def test_partitions_out_of_range_are_refused() -> None:
    inp = encoding.EncodeInput.of([b"a", b"b"])
    with pytest.raises(IndexError, match="partition below 2"):
        encoding.encode_partitioned(inp, np.array([0, 2]), np.zeros(2, np.int64))
    with pytest.raises(IndexError, match="2 rows"):
        encoding.encode_partitioned(inp, np.array([0]), np.zeros(2, np.int64))
