"""The Spark Data Source ``pylog`` (the only package that imports pyspark).

``DefaultSource`` (in :mod:`pylog.connector.source`) is imported lazily, so the pyspark-free
modules here (:mod:`.options`, :mod:`.offsets`, :mod:`.scan`, :mod:`.progress`) can be used
without pyspark installed, e.g. by the CLI to show consumer lag.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DefaultSource"]


def __getattr__(name: str) -> Any:
    if name == "DefaultSource":
        from pylog.connector.source import DefaultSource

        return DefaultSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
