"""Spark discovers Python data sources in top-level ``pyspark_*`` modules exporting
``DefaultSource``; this module makes ``format("pylog")`` available without registration."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "DefaultSource":
        from pylog.connector import DefaultSource  # type: ignore[attr-defined]

        return DefaultSource
    raise AttributeError(name)
