"""Spark sessions for kafka-changelog: the right Python on the workers, the Kafka connector.

Spark starts Python workers with ``PYSPARK_PYTHON`` (else ``python3`` from PATH), which
on most machines is not the interpreter that has this project and pyarrow installed:
the workers then crash on a missing import. :func:`local_session` points it at this
interpreter before it starts a local session, unless the user set it: on a cluster
the workers' Python is the cluster's business (``spark.pyspark.python``).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def ensure_worker_python() -> str:
    """Make Spark's Python workers run this interpreter unless ``PYSPARK_PYTHON`` (or
    ``PYSPARK_DRIVER_PYTHON``) is set already; returns the workers' interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return os.environ["PYSPARK_PYTHON"]


def spark_version() -> str:
    """The installed PySpark's version."""
    import pyspark

    return str(pyspark.__version__)


def local_session(
    app_name: str = "kafka-changelog",
    parallelism: int = 2,
    extra_config: dict[str, Any] | None = None,
) -> Any:
    """A ``local[parallelism]`` SparkSession set up for this project (small, quiet, fast)."""
    ensure_worker_python()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{parallelism}]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(parallelism))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in (extra_config or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
