"""Spark's Python worker daemon, with this library imported before it forks any worker.

Spark starts one daemon per executor (``spark.python.daemon.module``) and forks a Python
worker from it for each task slot; every worker then imports what its function needs.
The library's tasks need pandas, pyarrow and the library itself: about 1.4 CPU-s per
worker, paid again by every new worker of every executor and after every restart. Imported
once in the daemon, the forked workers share them (copy-on-write) and start at once.

Spark puts its own copies of PySpark and Py4J first on the workers' path, as zip files
(``$SPARK_HOME/python/lib``). Python cannot cache compiled code for a zip, so a daemon
compiled PySpark's modules from source at every start (~0.8 CPU-s), and every forked worker
re-read the zip's directory of ~1,400 entries when Spark invalidates the import caches
(~90 ms). When those zips are the ones inside the installed ``pyspark`` package (a
``pip install pyspark``, Spark's home), the installed package holds the same files: the
daemon drops the zips from the path and imports the compiled modules. A separate Spark
distribution's zips (a ``SPARK_HOME`` of its own) stay first, as Spark put them.

Spark's daemon runs a full garbage collection in a worker after each of its tasks; the
preloaded modules' objects (~90,000) made each one ~50 ms. They live as long as the
daemon, so it moves them out of the collector's sight (``gc.freeze``) before forking:
a worker's collections scan only what its tasks created (and the forked pages are not
touched by the collector, so they stay shared).

Invariants: nothing imported here starts a thread (a fork keeps only the forking thread;
``tests/spark/test_worker_daemon.py`` checks it), and nothing is printed on standard output
(where the daemon tells Spark its port).
"""

from __future__ import annotations

import gc
import importlib
import sys
from pathlib import Path

#: The ``spark.python.daemon.module`` that the library's sessions and Connect servers set.
WORKER_DAEMON = "spark_integration.sessions.worker_daemon"

#: What a task of the library imports before its first row (the streaming task paths and
#: the reader's), with their pandas and Arrow.
PRELOADED = (
    "pandas",
    "pyarrow",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "spark_integration.streaming.task",
    "spark_integration.streaming.vectorized",
    "spark_integration.reader",
)


def installed_copies(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips inside an installed ``pyspark`` package
    (``<dir>/pyspark/python/lib/*.zip``) whose ``<dir>`` is on ``path`` too, with the
    package the zip holds (``pyspark``, ``py4j``) installed there: the same files as the
    installed packages."""
    entries = {str(Path(entry).resolve()) for entry in path if entry}
    copies = []
    for entry in path:
        zip_path = Path(entry)
        if zip_path.suffix != ".zip" or zip_path.parent.parts[-3:] != ("pyspark", "python",
                                                                       "lib"):
            continue
        installed = zip_path.parents[3]
        package = "pyspark" if zip_path.name == "pyspark.zip" else "py4j"
        if (str(installed.resolve()) in entries
                and (installed / package / "__init__.py").is_file()):
            copies.append(entry)
    return copies


def prefer_installed_pyspark() -> list[str]:
    """Drop :func:`installed_copies` from ``sys.path`` (and their importers from the
    path importer cache); returns the entries dropped. Call before anything imports
    ``pyspark``."""
    dropped = installed_copies(sys.path)
    for entry in dropped:
        sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
    return dropped


def preload() -> list[str]:
    """Import :data:`PRELOADED`; returns the names that could not be imported (a worker
    imports them itself, as without this daemon)."""
    missing = []
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    return missing


if __name__ == "__main__":
    prefer_installed_pyspark()
    preload()
    gc.freeze()
    from pyspark.daemon import manager

    manager()
