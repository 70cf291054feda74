"""The Spark Data Source ``pylog`` (the only package that imports pyspark).

``DefaultSource`` (in :mod:`pylog.connector.datasource`) is imported on first access, so the
pyspark-free modules here (:mod:`.options`, :mod:`.offsets`, :mod:`.scan`, :mod:`.progress`)
can be used without pyspark installed, e.g. by the CLI to show consumer lag.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DefaultSource"]


def __getattr__(name: str) -> Any:
    if name == "DefaultSource":
        # deferred, not to dodge a cycle: importing the data source imports pyspark, which the
        # pyspark-free modules of this package must not need
        from pylog.connector.datasource import DefaultSource

        return DefaultSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
