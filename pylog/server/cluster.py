"""The cluster's own APIs: ApiVersions, Metadata, FindCoordinator, CreateTopics, DescribeConfigs,
and the mapping of pylog's errors to Kafka's error codes.

The cluster is one node (id 0, the advertised host and port) that leads every partition
(leader epoch 0, one replica, in sync) and coordinates every group.  Topics are not created by
producing to them (``auto.create.topics.enable`` is off, as in most production clusters):
CreateTopics, ``pylog create-topic`` or the Python API create them, with Kafka topic configs.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from pylog.server import protocol
from pylog.server.context import Request, error_for, make, response_module
from pylog.server.node import Node
from pylog.storage.config import LogConfig, validate_topic_name
from pylog.storage.errors import (
    ConfigError,
    PylogError,
    TopicExistsError,
)

NO_TOPIC_ID = uuid.UUID(int=0)
DEFAULT_PARTITIONS = 1
"""Partitions of a topic created without a count (Kafka's ``num.partitions``)."""

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5


# ---------------------------------------------------------------------------- ApiVersions


def _version_ranges(mod: Any) -> tuple[Any, ...]:
    return tuple(
        make(mod, "ApiVersion", api_key=key, min_version=lo, max_version=hi)
        for key, (_, lo, hi, _flex) in sorted(protocol.SUPPORTED.items())
    )


async def handle_api_versions(node: Node, req: Request) -> Any:
    mod = response_module(req)
    return make(mod, "ApiVersionsResponse", error_code=ErrorCode.none, api_keys=_version_ranges(mod))


_ENTRY = struct.Struct(">hhh")


def unsupported_api_versions(header: protocol.RequestHeader) -> bytes:
    """KIP-511: an ApiVersions request of a version this server does not know is answered in
    v0's format with UNSUPPORTED_VERSION and the supported ranges, so the client can retry."""
    body = struct.pack(">hi", int(ErrorCode.unsupported_version), len(protocol.SUPPORTED))
    body += b"".join(_ENTRY.pack(k, lo, hi) for k, (_, lo, hi, _f) in sorted(protocol.SUPPORTED.items()))
    payload = protocol.CORRELATION.pack(header.correlation_id) + body
    return protocol.FRAME.pack(len(payload)) + payload


# ---------------------------------------------------------------------------- Metadata


def _broker_entry(node: Node, mod: Any, cls: str) -> Any:
    return make(mod, cls, node_id=node.node_id, host=node.advertised_host, port=node.port, rack=None)


def topic_metadata(node: Node, mod: Any, name: str) -> Any:
    root = node.root
    if name not in root.topics():
        return make(
            mod,
            "MetadataResponseTopic",
            error_code=ErrorCode.unknown_topic_or_partition,
            name=name,
            topic_id=NO_TOPIC_ID,
            is_internal=False,
            partitions=(),
        )
    parts = tuple(
        make(
            mod,
            "MetadataResponsePartition",
            error_code=ErrorCode.none,
            partition_index=p,
            leader_id=node.node_id,
            leader_epoch=0,
            replica_nodes=(node.node_id,),
            isr_nodes=(node.node_id,),
            offline_replicas=(),
        )
        for p in range(root.partitions(name))
    )
    return make(
        mod,
        "MetadataResponseTopic",
        error_code=ErrorCode.none,
        name=name,
        topic_id=NO_TOPIC_ID,
        is_internal=False,
        partitions=parts,
    )


async def handle_metadata(node: Node, req: Request) -> Any:
    mod = response_module(req)
    wanted = req.body.topics
    every = wanted is None or (req.version == 0 and not wanted)  # v0: an empty list means all

    def topics() -> tuple[Any, ...]:  # on the storage thread, which changes the topics
        names = node.root.topics() if every else [t.name for t in wanted if t.name is not None]
        return tuple(topic_metadata(node, mod, n) for n in names)

    return make(
        mod,
        "MetadataResponse",
        brokers=(_broker_entry(node, mod, "MetadataResponseBroker"),),
        cluster_id=node.cluster_id,
        controller_id=node.node_id,
        topics=await node.store.call(topics),
    )


# ---------------------------------------------------------------------------- FindCoordinator


async def handle_find_coordinator(node: Node, req: Request) -> Any:
    mod = response_module(req)
    if req.version >= 4:
        return make(
            mod,
            "FindCoordinatorResponse",
            coordinators=tuple(
                make(
                    mod,
                    "Coordinator",
                    key=key,
                    node_id=node.node_id,
                    host=node.advertised_host,
                    port=node.port,
                    error_code=ErrorCode.none,
                    error_message=None,
                )
                for key in req.body.coordinator_keys
            ),
        )
    return make(
        mod,
        "FindCoordinatorResponse",
        error_code=ErrorCode.none,
        error_message=None,
        node_id=node.node_id,
        host=node.advertised_host,
        port=node.port,
    )


# ---------------------------------------------------------------------------- CreateTopics


def _create_one(node: Node, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None, int]:
    root = node.root
    partitions = DEFAULT_PARTITIONS if topic.num_partitions in (-1, None) else int(topic.num_partitions)
    if topic.replication_factor not in (-1, 1):
        return (
            ErrorCode.invalid_replication_factor,
            (f"replication factor {topic.replication_factor}: this cluster has one node (pylog serve)"),
            partitions,
        )
    if topic.assignments:
        return ErrorCode.invalid_request, "replica assignments are not supported by pylog serve", partitions
    if partitions <= 0:
        return ErrorCode.invalid_partitions, f"{partitions} partitions: must be at least 1", partitions
    configs = {c.name: c.value for c in topic.configs if c.value is not None}
    try:
        validate_topic_name(topic.name)
    except ConfigError as e:
        return ErrorCode.invalid_topic_exception, str(e), partitions
    try:
        if topic.name in root.topics():
            raise TopicExistsError(f"topic {topic.name!r} already exists")
        if validate_only:
            LogConfig.from_dict(configs)
        else:
            root.create_topic(topic.name, partitions, configs)
    except TopicExistsError as e:
        return ErrorCode.topic_already_exists, str(e), partitions
    except ConfigError as e:
        return ErrorCode.invalid_config, str(e), partitions
    except PylogError as e:
        return error_for(e), str(e), partitions
    return ErrorCode.none, None, partitions


async def handle_create_topics(node: Node, req: Request) -> Any:
    mod = response_module(req)
    results = []
    for topic in req.body.topics:
        code, message, partitions = await node.store.call(
            _create_one, node, topic, bool(getattr(req.body, "validate_only", False))
        )
        results.append(
            make(
                mod,
                "CreatableTopicResult",
                name=topic.name,
                topic_id=NO_TOPIC_ID,
                error_code=code,
                error_message=message,
                topic_config_error_code=0,
                num_partitions=partitions if code == ErrorCode.none else -1,
                replication_factor=1 if code == ErrorCode.none else -1,
                configs=None if code != ErrorCode.none else (),
            )
        )
    return make(mod, "CreateTopicsResponse", topics=tuple(results))


# ---------------------------------------------------------------------------- DescribeConfigs


def _describe_topic(node: Node, mod: Any, resource: Any) -> Any:
    root = node.root
    name = resource.resource_name
    if name not in root.topics():
        return make(
            mod,
            "DescribeConfigsResult",
            error_code=ErrorCode.unknown_topic_or_partition,
            error_message=f"unknown topic {name!r}",
            resource_type=resource.resource_type,
            resource_name=name,
            configs=(),
        )
    explicit = set((root._topic(name).get("config") or {}).keys())
    values = root.config(name).to_dict()
    keys = resource.configuration_keys
    configs = tuple(
        make(
            mod,
            "DescribeConfigsResourceResult",
            name=key,
            value=value,
            read_only=False,
            config_source=DYNAMIC_TOPIC_CONFIG if key in explicit else DEFAULT_CONFIG,
            is_default=key not in explicit,
            is_sensitive=False,
            synonyms=(),
            config_type=0,
            documentation=None,
        )
        for key, value in sorted(values.items())
        if keys is None or key in keys
    )
    return make(
        mod,
        "DescribeConfigsResult",
        error_code=ErrorCode.none,
        error_message=None,
        resource_type=resource.resource_type,
        resource_name=name,
        configs=configs,
    )


async def handle_describe_configs(node: Node, req: Request) -> Any:
    mod = response_module(req)
    results = []
    for resource in req.body.resources:
        if resource.resource_type == TOPIC_RESOURCE:
            results.append(await node.store.call(_describe_topic, node, mod, resource))
        elif resource.resource_type == BROKER_RESOURCE:
            results.append(
                make(
                    mod,
                    "DescribeConfigsResult",
                    error_code=ErrorCode.none,
                    error_message=None,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=(),
                )
            )
        else:
            results.append(
                make(
                    mod,
                    "DescribeConfigsResult",
                    error_code=ErrorCode.invalid_request,
                    error_message=f"resource type {resource.resource_type} is not supported",
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=(),
                )
            )
    return make(mod, "DescribeConfigsResponse", results=tuple(results))
