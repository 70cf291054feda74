"""The pylog sink on the driver: planning a write and committing what its tasks staged (Spark's
Kafka writer does this in ``KafkaStreamingWrite`` / ``KafkaBatchWrite``).

:func:`prepare_topics` checks (or creates) the target topic when the write is planned and hands
the tasks the root's metadata; :func:`publish` links every staged file of a batch into the logs
exactly once (see ``storage/root/publish.py``), then runs the embedded maintenance;
:func:`discard` removes what the tasks of an aborted batch staged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pylog.connector.sink_options import SinkOptions, TopicMeta, open_sink_root
from pylog.storage import faults
from pylog.storage.backends.objectstore.storage import ObjectStorage
from pylog.storage.errors import ConfigError, StorageError
from pylog.storage.maintenance import merge
from pylog.storage.maintenance import runner as maintenance
from pylog.storage.root import publish as pub
from pylog.storage.root.manager import Root

log = logging.getLogger("pylog.connector")


def _topic_meta(root: Root) -> TopicMeta:
    return {t: (root.partitions(t), root.config(t)) for t in root.topics()}


def prepare_topics(opts: SinkOptions) -> TopicMeta:
    """Check (or, with the ``partitions`` option, create) the target topic on the driver, and
    return the root's topics as its tasks will stage for them.  Like a Kafka producer's
    metadata, this is as of the planning of the write (each micro-batch plans again)."""
    for trust_known in (True, False):  # a topic missing from a known state: ask the store
        try:
            root = open_sink_root(opts, read_only=True, trust_known=trust_known)
        except StorageError:
            root = None  # the root does not exist yet
        if root is not None:
            try:
                meta = _topic_meta(root)
            finally:
                root.close()
            if opts.topic is None or opts.topic in meta:
                return meta
    if opts.topic is None:
        return {}
    if opts.partitions is None:
        raise ConfigError(
            f"topic {opts.topic!r} does not exist in {opts.path}; create it (pylog create-topic) or set "
            f'.option("partitions", N) to create it on first write'
        )
    with open_sink_root(opts, read_only=False) as writer:
        writer.create_topic(opts.topic, opts.partitions, opts.topic_config, exist_ok=True)
        return _topic_meta(writer)


def publish(
    opts: SinkOptions,
    messages: list[Any],
    batch_id: int,
    *,
    overwrite: bool = False,
    streaming: bool = True,
    now: int | None = None,
) -> None:
    """Publish every staged file of ``batch_id`` exactly once.

    A streaming batch is keyed by the query id its tasks sent (see :mod:`.sink`); a batch write
    (``streaming=False``) is published unconditionally and leaves no record."""
    messages = [m for m in messages if m is not None]
    staged = [pub.StagedFile.from_dict(d) for m in messages for d in m.staged]
    queries = {q for m in messages if (q := getattr(m, "query_id", None))}
    if len(queries) > 1:
        raise RuntimeError(
            f"pylog sink: the tasks of batch {batch_id} name several queries {sorted(queries)}"
        )
    writer_id = next(iter(queries)) if queries else opts.sink_id
    exactly_once = streaming
    now = int(time.time() * 1000) if now is None else now
    # an overwrite decides what to hide from the partitions it sees: from the newest state
    with open_sink_root(opts, read_only=False, trust_known=not overwrite) as root:
        # crash-point tests of a real driver: off unless PYLOG_TEST_CRASH_AT_STEP is set
        store = [root.storage.faults] if isinstance(root.storage, ObjectStorage) else []  # its commit's
        faults.arm_from_environment(root.faults, *store)

        def commit() -> None:
            # a replayed batch publishes nothing, so it must not truncate either
            if overwrite and (not exactly_once or batch_id > root.last_committed_batch(writer_id)):
                _truncate_topics(root, {f.topic for f in staged} | ({opts.topic} if opts.topic else set()))
            root.publish(
                writer_id,
                batch_id,
                staged,
                exactly_once=exactly_once,
                now=now,
                retention_ms=opts.query_retention_ms,
            )

        # one atomic change on an object store: the truncation of an overwrite and the publish
        # are committed (or, after losing a race to another writer, run again) together
        root.transaction(commit)
        if opts.maintenance:
            _maintain(root, {(f.topic, f.partition) for f in staged}, opts.maintenance_budget_ms)


def _truncate_topics(root: Root, topics: set[str]) -> None:
    """Overwrite semantics: every existing record of the topics becomes unreadable (the log
    start offset moves to the end); offsets keep growing, as readers expect of a log."""
    for topic in sorted(topics):
        for p in range(root.partitions(topic)):
            lg = root.writable_log(topic, p)
            lg.delete_segments(list(lg.segments))


def _maintain(root: Root, touched: set[tuple[str, int]], budget_ms: int) -> None:
    """Retention and compaction of the partitions just written, within a time budget; never
    fails the commit (the data is already durable and recorded)."""
    try:
        report = maintenance.maintain(
            root,
            now=int(time.time() * 1000),
            budget_s=budget_ms / 1000.0,
            partitions=sorted(touched),
            merge_below=merge.COMMIT_SMALL_MAX,  # larger segments: a maintenance run of their own
        )
        if report.budget_exhausted:  # the rest waits for the next commits, or a job of its own
            log.warning(
                "%s: maintenance after this commit used up its budget (maintenance.budgetMs=%d) with "
                "work left: it goes on after the next commits; for a backlog, run "
                "pylog.connector.maintenance.run(spark, path) or pylog compact (pylog describe shows "
                "the compaction backlog)",
                root.storage.describe(),
                budget_ms,
            )
    except Exception as e:  # maintenance must not fail a durable commit
        log.warning("maintenance after publish failed: %s", e)


def discard(opts: SinkOptions, messages: list[Any]) -> None:
    """abort: remove what the tasks staged."""
    root = open_sink_root(opts, read_only=True)
    try:
        for m in messages:
            for d in getattr(m, "staged", None) or []:
                for path in pub.StagedFile.from_dict(d).paths():  # none: carried in the message
                    root.storage.delete(path)
    finally:
        root.close()
