"""OffsetCommit and OffsetFetch: consumer groups' committed offsets, durable in the root.

Each group's offsets are the file the Spark source writes for its queries,
``pylog-consumer-offsets.<group>`` (Kafka's checkpoint format), so ``pylog describe`` lists Kafka
consumer groups and Spark queries alike, with their lag; the metadata strings committed with
them are kept beside it (``pylog-consumer-metadata.<group>``) and returned by OffsetFetch.
A commit is answered once both files are replaced (atomically, on the store's thread: on an
object store, one commit).  Group ids with characters outside ``[A-Za-z0-9._-]`` are
percent-encoded in the file names.
"""

from __future__ import annotations

from pylog.server.store import Key, Store
from pylog.storage.root import consumers

Committed = dict[Key, tuple[int, str]]


class CommittedOffsets:
    """Every group's committed offsets and metadata, as in the root."""

    def __init__(self, store: Store):
        self.store = store
        self.groups: dict[str, Committed] = {}

    async def load(self) -> None:
        self.groups = await self.store.call(self._read_all)

    def _read_all(self) -> dict[str, Committed]:
        storage = self.store.root.storage
        out: dict[str, Committed] = {}
        for group, offsets in consumers.read_consumer_offsets(storage).items():
            meta = consumers.read_consumer_metadata(storage, group)
            out[group] = {tp: (off, meta.get(tp, "")) for tp, off in offsets.items()}
        return out

    async def commit(self, group: str, offsets: Committed) -> None:
        await self.store.call(self._write, group, offsets)

    async def settled(self) -> None:
        """Return once the commits accepted before this call are written and in ``groups`` (the
        storage thread runs its calls in order).  A connection's requests are handled
        concurrently: a member's JoinGroup or LeaveGroup can complete a rebalance while the
        OffsetCommit it sent first is being written, and the partitions' next owner must still
        fetch that commit."""
        await self.store.call(_nothing)

    def _write(self, group: str, offsets: Committed) -> None:
        # merged on the storage thread, which runs one call at a time: two members' concurrent
        # commits to one group must not each start from the offsets before the other's
        committed = {**self.groups.get(group, {}), **offsets}
        root = self.store.root

        def write() -> None:
            root.become_writer()
            consumers.write_consumer_metadata(
                root.storage, group, {tp: m for tp, (_, m) in committed.items()}
            )
            consumers.write_consumer_offsets(root.storage, group, {tp: o for tp, (o, _) in committed.items()})

        root.transaction(write)
        self.groups[group] = committed


def _nothing() -> None:
    pass
