"""Spark discovers Python data sources in top-level ``pyspark_*`` modules exporting
``DefaultSource``; this module makes ``format("pylog")`` available without registration."""

from pylog.connector.datasource import DefaultSource

__all__ = ["DefaultSource"]
