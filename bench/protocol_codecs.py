"""Kafka message codecs for ``pylog serve``: kio against kafka-python 3's ``kafka.protocol``.

    python bench/protocol_codecs.py [--quick]

The server parses every request and writes every response with kio (``pylog.server.protocol``:
``kio.serial.entity_reader`` / ``entity_writer`` over the dataclasses kio generates from Kafka's
JSON message schemas).  kafka-python 3 holds the same schemas and compiles an encoder and a
decoder per message version (``ApiMessage.decode`` / ``encode``).  Both are run here on the
messages that carry a server's bytes and on a small one:

- parse a ProduceRequest v11 body of 4 MiB (one topic, 4 partitions of 1 MiB record sets);
- parse the same 4 MiB as 64 partitions of 64 KiB;
- build and write a FetchResponse v12 of 4 MiB (4 partitions of 1 MiB), framed with its header;
- build and write a small MetadataResponse v12 (1 broker, 10 topics of 4 partitions);
- parse a small MetadataRequest v12 (one topic): the fixed cost of a request.

Record sets are opaque bytes to both (neither decodes them).  Before timing, each pair of
encodings is compared byte for byte (the two libraries must agree on the wire).  Each figure is
the median of several runs on one core, the two libraries' runs alternating.  Prints a table,
then as its last line one JSON object with every figure and ``ratio`` = kafka-python's time /
kio's time per case (above 1: kio is faster).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer import FetchResponse as KpFetchResponse
from kafka.protocol.metadata import MetadataRequest as KpMetadataRequest
from kafka.protocol.metadata import MetadataResponse as KpMetadataResponse
from kafka.protocol.producer import ProduceRequest as KpProduceRequest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

MiB = 1 << 20
PRODUCE_V, FETCH_V, METADATA_V = 11, 12, 12
NO_TOPIC_ID = uuid.UUID(int=0)


def kio_module(api_key: int, version: int, kind: EntityType) -> Any:
    return load_payload_module(api_key, version, kind)


def record_sets(n: int, size: int) -> list[bytes]:
    """``n`` distinct opaque record sets of ``size`` bytes (their content does not matter)."""
    block = bytes(range(256)) * (size // 256 + 1)
    return [bytes([i % 256]) + block[: size - 1] for i in range(n)]


def timed(fns: tuple[Callable[[], Any], Callable[[], Any]], repeat: int) -> tuple[float, float]:
    """The median time of each of two functions, run alternately (so that a busy moment of the
    machine falls on both)."""
    for fn in fns:
        fn()  # warm up: caches of readers, writers and compiled codecs
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


# ---------------------------------------------------------------------------- ProduceRequest


def produce_request_body(sets: list[bytes]) -> bytes:
    """A ProduceRequest body (no header), as kio writes it."""
    mod = kio_module(0, PRODUCE_V, EntityType.request)
    req = mod.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=dt.timedelta(seconds=30),
        topic_data=(
            mod.TopicProduceData(
                name="events",
                partition_data=tuple(
                    mod.PartitionProduceData(index=i, records=s) for i, s in enumerate(sets)
                ),
            ),
        ),
    )
    out = io.BytesIO()
    entity_writer(type(req))(out, req)
    return out.getvalue()


def produce_cases(sets: list[bytes]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    body = produce_request_body(sets)
    kp = KpProduceRequest[PRODUCE_V]
    kp_out = kp.decode(body, version=PRODUCE_V)
    mod = kio_module(0, PRODUCE_V, EntityType.request)
    read = entity_reader(mod.ProduceRequest)
    view = memoryview(body)
    kio_out, size = read(view, 0)
    assert size == len(body)
    got = [bytes(p.records) for p in kp_out.topic_data[0].partition_data]
    assert got == [bytes(p.records) for p in kio_out.topic_data[0].partition_data] == sets
    built = kp(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            kp.TopicProduceData(
                name="events",
                partition_data=[
                    kp.TopicProduceData.PartitionProduceData(index=i, records=s) for i, s in enumerate(sets)
                ],
            )
        ],
    )
    assert built.encode(version=PRODUCE_V) == body, (
        "kio and kafka-python write different ProduceRequest bytes"
    )
    return (lambda: read(view, 0)), (lambda: kp.decode(view, version=PRODUCE_V))


# ---------------------------------------------------------------------------- FetchResponse


def kio_fetch_response(sets: list[bytes]) -> Any:
    mod = kio_module(1, FETCH_V, EntityType.response)
    return mod.FetchResponse(
        throttle_time=dt.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(
            mod.FetchableTopicResponse(
                topic="events",
                partitions=tuple(
                    mod.PartitionData(
                        partition_index=i,
                        error_code=ErrorCode.none,
                        high_watermark=1_000_000,
                        last_stable_offset=1_000_000,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=s,
                    )
                    for i, s in enumerate(sets)
                ),
            ),
        ),
    )


def kp_fetch_response(sets: list[bytes]) -> Any:
    R = KpFetchResponse
    return R[FETCH_V](
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            R.FetchableTopicResponse(
                topic="events",
                partitions=[
                    R.FetchableTopicResponse.PartitionData(
                        partition_index=i,
                        error_code=0,
                        high_watermark=1_000_000,
                        last_stable_offset=1_000_000,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=s,
                    )
                    for i, s in enumerate(sets)
                ],
            )
        ],
    )


def kio_frame(body: Any, correlation: int, flexible: bool) -> bytes:
    """A response frame as ``pylog.server.protocol.encode_response`` writes it."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(correlation.to_bytes(4, "big", signed=True))
    if flexible:
        out.write(b"\0")  # response header v1: no tagged fields
    entity_writer(type(body))(out, body)
    data = out.getbuffer()
    data[:4] = (len(data) - 4).to_bytes(4, "big")
    del data
    return out.getvalue()


def kp_frame(msg: Any, correlation: int) -> bytearray:
    """``msg`` (of a versioned class, ``Message[version]``) framed with its response header (a
    bytearray, which a socket writes as it is)."""
    msg.with_header(correlation_id=correlation)
    return msg.encode(header=True, framed=True)


def fetch_cases(sets: list[bytes]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    def with_kio() -> bytes:
        return kio_frame(kio_fetch_response(sets), 7, flexible=True)

    def with_kp() -> bytearray:
        return kp_frame(kp_fetch_response(sets), 7)

    assert with_kio() == with_kp(), "kio and kafka-python write different FetchResponse bytes"
    return with_kio, with_kp


# ---------------------------------------------------------------------------- Metadata


def metadata_cases(topics: int, partitions: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    def with_kio() -> bytes:
        mod = kio_module(3, METADATA_V, EntityType.response)
        body = mod.MetadataResponse(
            throttle_time=dt.timedelta(0),
            brokers=(mod.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=9092, rack=None),),
            cluster_id="pylog-0123456789abcdef",
            controller_id=0,
            topics=tuple(
                mod.MetadataResponseTopic(
                    error_code=ErrorCode.none,
                    name=f"topic-{t}",
                    topic_id=NO_TOPIC_ID,
                    is_internal=False,
                    partitions=tuple(
                        mod.MetadataResponsePartition(
                            error_code=ErrorCode.none,
                            partition_index=p,
                            leader_id=0,
                            leader_epoch=0,
                            replica_nodes=(0,),
                            isr_nodes=(0,),
                            offline_replicas=(),
                        )
                        for p in range(partitions)
                    ),
                )
                for t in range(topics)
            ),
        )
        return kio_frame(body, 7, flexible=True)

    def with_kp() -> bytearray:
        R = KpMetadataResponse
        P = R.MetadataResponseTopic.MetadataResponsePartition
        msg = R[METADATA_V](
            throttle_time_ms=0,
            brokers=[R.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=9092, rack=None)],
            cluster_id="pylog-0123456789abcdef",
            controller_id=0,
            topics=[
                R.MetadataResponseTopic(
                    error_code=0,
                    name=f"topic-{t}",
                    topic_id=NO_TOPIC_ID,
                    is_internal=False,
                    partitions=[
                        P(
                            error_code=0,
                            partition_index=p,
                            leader_id=0,
                            leader_epoch=0,
                            replica_nodes=[0],
                            isr_nodes=[0],
                            offline_replicas=[],
                        )
                        for p in range(partitions)
                    ],
                )
                for t in range(topics)
            ],
        )
        return kp_frame(msg, 7)

    a, b = with_kio(), with_kp()
    assert a == b, f"kio and kafka-python write different MetadataResponse bytes ({len(a)} / {len(b)})"
    return with_kio, with_kp


def metadata_request_cases() -> tuple[Callable[[], Any], Callable[[], Any]]:
    mod = kio_module(3, METADATA_V, EntityType.request)
    req = mod.MetadataRequest(
        topics=(mod.MetadataRequestTopic(topic_id=NO_TOPIC_ID, name="events"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    out = io.BytesIO()
    entity_writer(type(req))(out, req)
    body = memoryview(out.getvalue())
    read = entity_reader(mod.MetadataRequest)
    kp = KpMetadataRequest[METADATA_V]
    assert kp.decode(body, version=METADATA_V).topics[0].name == read(body, 0)[0].topics[0].name == "events"
    return (lambda: read(body, 0)), (lambda: kp.decode(body, version=METADATA_V))


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a few seconds)")
    args = ap.parse_args()
    big, small = (5, 200) if args.quick else (21, 2001)

    cases: list[tuple[str, int, tuple[Callable[[], Any], Callable[[], Any]], int]] = [
        ("parse ProduceRequest v11, 4 x 1 MiB", 4 * MiB, produce_cases(record_sets(4, MiB)), big),
        ("parse ProduceRequest v11, 64 x 64 KiB", 4 * MiB, produce_cases(record_sets(64, 64 << 10)), big),
        ("build+write FetchResponse v12, 4 x 1 MiB", 4 * MiB, fetch_cases(record_sets(4, MiB)), big),
        ("build+write MetadataResponse v12, 10 x 4", 0, metadata_cases(10, 4), small),
        ("parse MetadataRequest v12, 1 topic", 0, metadata_request_cases(), small),
    ]
    results: dict[str, Any] = {"cases": {}}
    print(f"{'case':<42} {'kio':>12} {'kafka-python':>14} {'ratio':>7}")
    for name, nbytes, fns, repeat in cases:
        t_kio, t_kp = timed(fns, repeat)
        ratio = t_kp / t_kio
        row: dict[str, Any] = {"kio_s": t_kio, "kafka_python_s": t_kp, "ratio": round(ratio, 2)}
        if nbytes:
            row["kio_mib_s"] = round(nbytes / MiB / t_kio, 1)
            row["kafka_python_mib_s"] = round(nbytes / MiB / t_kp, 1)
        results["cases"][name] = row
        print(f"{name:<42} {_fmt(t_kio):>12} {_fmt(t_kp):>14} {ratio:>6.2f}x")
    print("ratio: kafka-python's time / kio's (above 1: kio is faster); medians, one core")
    print(json.dumps(results, sort_keys=True))


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
