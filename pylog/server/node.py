"""The server's state that every request handler reads: the node's identity and address, the store
(the root), the group coordinator, the committed offsets and the producer ids.

:class:`~pylog.server.broker.Broker` is a :class:`Node` that also accepts connections; handlers
see only the node, so they sit below the broker that routes requests to them.
"""

from __future__ import annotations

import asyncio
import hashlib

from pylog.server.committed import CommittedOffsets
from pylog.server.coordinator import Coordinator
from pylog.server.producers import Producers
from pylog.server.store import Store
from pylog.storage.root.manager import Root


class Node:
    """Node 0 of a one-node cluster over ``root``: leader of every partition, coordinator of
    every group."""

    def __init__(
        self,
        root: Root,
        *,
        host: str = "127.0.0.1",
        port: int = 9092,
        advertised_host: str | None = None,
        maintenance_budget_s: float = 0.25,
    ) -> None:
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or host
        self.node_id = 0
        self.cluster_id = "pylog-" + hashlib.sha256(root.storage.describe().encode()).hexdigest()[:16]
        self.store = Store(root, maintenance_budget_s=maintenance_budget_s)
        self.coordinator = Coordinator()
        self.committed = CommittedOffsets(self.store)
        self.producers = Producers(self.store)
        self.stopping = asyncio.Event()
        """Set when the server begins to stop: long-polling fetches answer at once."""

    @property
    def root(self) -> Root:
        return self.store.root
