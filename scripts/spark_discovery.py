"""Let Spark find ``format("pylog")`` in an editable install, from any working directory.

Spark 4.3 registers Python data sources by scanning, in a Python worker, the top-level modules
``pkgutil.iter_modules()`` lists (``pyspark/sql/worker/lookup_data_sources.py``): it imports each
one named ``pyspark_*`` and registers its ``DefaultSource``.  ``iter_modules()`` walks the
entries of ``sys.path`` only.  A regular install puts ``pyspark_pylog.py`` in site-packages, which
is on ``sys.path``; setuptools' editable install (``pip install -e .``) does not: for pylog's
mapped layout (``pylog.storage`` is ``storage/``...) it installs an import hook (a meta path
finder, from ``__editable__.pylog-*.pth``), which imports the module but is invisible to the scan.
Spark then found the module only when the worker's working directory was the clone's root.

This script, run by ``make`` after the editable install, gives the module a plain ``sys.path``
entry: a directory in site-packages holding only a link to ``pyspark_pylog.py`` (so nothing else
of the clone becomes importable by accident), named by a ``.pth`` file.  It does nothing where
``pyspark_pylog.py`` is installed in site-packages already, and running it again changes nothing.

Usage: ``.venv/bin/python scripts/spark_discovery.py`` (the venv's interpreter)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULE = "pyspark_pylog.py"
DIR_NAME = "pylog-spark-discovery"  # not an importable name: only its content is
PTH_NAME = "pylog_spark_discovery.pth"


def install(site_packages: Path | None = None) -> Path | None:
    """Create the entry; return its directory (``None`` when the module is installed already)."""
    site = Path(site_packages or sysconfig.get_paths()["purelib"])
    if (site / MODULE).exists():
        return None
    target = site / DIR_NAME
    target.mkdir(exist_ok=True)
    link = target / MODULE
    if link.is_symlink() or link.exists():
        link.unlink()
    try:
        link.symlink_to(REPO / MODULE)
    except OSError:  # no symlinks here: a copy (re-run after editing the module)
        link.write_text((REPO / MODULE).read_text())
    (site / PTH_NAME).write_text(f"{target}\n")
    return target


if __name__ == "__main__":
    where = install()
    print(f"pyspark_pylog on sys.path from {where}" if where else "pyspark_pylog is installed already")
