"""``pylog serve``: Kafka's wire protocol over a pylog root (see :mod:`pylog.server.broker`).

Needs the ``serve`` extra (``pip install 'pylog[serve]'``: kio, Kafka's message types generated
from Kafka's JSON schemas).
"""

from __future__ import annotations

__all__ = ["Broker", "run"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from pylog.server import broker

        return getattr(broker, name)
    raise AttributeError(name)
