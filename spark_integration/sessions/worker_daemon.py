"""Spark's Python worker daemon, with this library imported before it forks any worker.

Spark starts one daemon per executor (``spark.python.daemon.module``) and forks a Python
worker from it for each task slot; every worker then imports what its function needs.
The library's tasks need pandas, pyarrow and the library itself: about 1.4 CPU-s per
worker, paid again by every new worker of every executor and after every restart. Imported
once in the daemon, the forked workers share them (copy-on-write) and start at once.

Invariants: nothing imported here starts a thread (a fork keeps only the forking thread;
``tests/spark/test_worker_daemon.py`` checks it), and nothing is printed on standard output
(where the daemon tells Spark its port).
"""

from __future__ import annotations

import importlib

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
    preload()
    from pyspark.daemon import manager

    manager()
