"""Closing what an application left in Spark's Python workers, from the driver.

A Python worker keeps an application's Kafka clients, cached backends and background
materializations across tasks (:class:`~spark_integration.streaming.worker_resources.
WorkerResources`), and Spark keeps idle workers for the next tasks (it kills them once
none ran for a minute). :func:`release_workers` runs a small job of
:data:`RELEASE_TASKS_PER_CORE` tasks per core in which each task releases the
application in the worker running it. Spark hands idle Python workers out oldest first
and each task returns its worker to the back of the queue, so with no other job
running, every idle worker of the driver's own executor (all of them in local mode)
runs one of the tasks as long as there are no more idle workers than tasks. On a
cluster, each executor's workers are reached as far as the scheduler puts tasks there:
best effort; an executor that ends takes its workers (and their clients) along.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from ..sessions.connect import is_connect
from .config import StreamingStateConfig
from .worker_resources import WorkerResources

logger = logging.getLogger(__name__)

#: Release tasks per core of the Spark application (see the module docstring).
RELEASE_TASKS_PER_CORE = 4


def release_workers(config: StreamingStateConfig, session: Any = None) -> list[int]:
    """Run :meth:`WorkerResources.release` of ``config`` in the Python workers of
    ``session`` (default: the active session); the process ids that ran it. Returns []
    without a session, under Spark Connect (the workers are the server's), or when the
    job fails (logged: the workers close their clients when Spark stops them)."""
    try:
        from pyspark.sql import SparkSession

        spark = session if session is not None else SparkSession.getActiveSession()
        if spark is None or is_connect(spark):
            return []
        tasks = RELEASE_TASKS_PER_CORE * max(1, spark.sparkContext.defaultParallelism)
        rows = (spark.range(tasks, numPartitions=tasks)
                .mapInPandas(_releaser(config), "pid long").collect())
    except Exception as exc:  # a stopped session: its workers are gone
        logger.warning("application %s: could not release the Python workers (%s); they "
                       "close their clients when Spark stops them", config.application, exc)
        return []
    return sorted({int(r.pid) for r in rows})


def _releaser(config: StreamingStateConfig) -> Any:
    def release(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        for _ in batches:
            pass
        WorkerResources.release(config)
        yield pd.DataFrame({"pid": [os.getpid()]})

    return release


__all__ = ["RELEASE_TASKS_PER_CORE", "release_workers"]
