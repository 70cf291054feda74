"""The Spark Data Source ``pylog`` (the only package that imports pyspark)."""
