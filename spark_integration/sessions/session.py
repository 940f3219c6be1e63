"""Spark sessions for kafka-changelog: the right Python on the workers, the Kafka connector.

Spark starts Python workers with ``PYSPARK_PYTHON`` (else ``python3`` from PATH),
which on most machines is not the interpreter that has this project and pyarrow
installed: the workers then crash on a missing import. :func:`spark_session` points
it at this interpreter (for a local session, and for the executors of a cluster on
the same machine, through ``spark.pyspark.python``) unless the user set it, and adds
the jars of Spark's Kafka connector (:mod:`spark_integration.sessions.connector`) to
``spark.jars``, so ``format("kafka")`` works in every session it builds.
"""

from __future__ import annotations

import os
import sys
from typing import Any
from urllib.parse import urlsplit

from .connect import CONNECT_SCHEME, connect_session
from .connector import ensure_connector_jars
from .connector import spark_version as spark_version
from .spark_versions import require_supported_spark
from .worker_daemon import WORKER_DAEMON

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def ensure_worker_python() -> str:
    """Make Spark's Python workers run this interpreter unless ``PYSPARK_PYTHON`` (or
    ``PYSPARK_DRIVER_PYTHON``) is set already; returns the workers' interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return os.environ["PYSPARK_PYTHON"]


def connector_config(existing_jars: str | None = None) -> dict[str, str]:
    """``spark.jars`` with the Kafka connector's jars (after ``existing_jars``, if any)."""
    jars = [str(path) for path in ensure_connector_jars()]
    if existing_jars:
        jars = [*existing_jars.split(","), *jars]
    return {"spark.jars": ",".join(jars)}


def driver_address_config(master: str) -> dict[str, str]:
    """Loopback driver settings when ``master`` is a standalone master on this machine.

    Executors connect back to the driver at ``spark.driver.host``; Spark's default
    (the host name's address) may not be reachable where only loopback is, and a
    master on 127.0.0.1 implies executors on this machine.
    """
    if master.startswith("local"):
        return {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    host = urlsplit(master.split(",")[0]).hostname or ""
    if host in LOOPBACK_HOSTS:
        return {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return {}


def spark_session(
    master: str = "local[2]",
    app_name: str = "kafka-changelog",
    parallelism: int = 2,
    extra_config: dict[str, Any] | None = None,
    *,
    kafka_connector: bool = True,
) -> Any:
    """A SparkSession on ``master`` set up for this project.

    ``master`` is ``local[n]`` or a cluster (``spark://host:port``). ``parallelism``
    sets ``spark.sql.shuffle.partitions``. With ``kafka_connector`` (default) the
    session can read and write ``format("kafka")``. ``extra_config`` wins over
    everything else (a ``spark.jars`` in it is kept, the connector's are added).

    A Spark Connect URL (``sc://host:port``) as ``master`` gives a Connect client session
    (:func:`spark_integration.sessions.connect.connect_session`): the server brings the connector
    and the workers' Python (:mod:`spark_integration.sessions.connect_server`).

    Raises :class:`~spark_integration.sessions.spark_versions.UnsupportedSparkVersionError`
    when the installed PySpark is not one the library supports (4.0 to 4.2).
    """
    require_supported_spark()
    if master.startswith(CONNECT_SCHEME):
        return connect_session(master, app_name, parallelism, extra_config)
    python = ensure_worker_python()
    address = driver_address_config(master)
    if address:
        # Read when the JVM starts: Spark then binds nothing to the host's other addresses.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    config: dict[str, Any] = {
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # Executors of a cluster on this machine run this interpreter (this project's).
        "spark.pyspark.python": python,
        # Workers fork with pandas, Arrow and the library already imported.
        "spark.python.daemon.module": WORKER_DAEMON,
        **address,
    }
    extra = dict(extra_config or {})
    if kafka_connector:
        config |= connector_config(extra.pop("spark.jars", None))
    config |= extra
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_session(
    app_name: str = "kafka-changelog",
    parallelism: int = 2,
    extra_config: dict[str, Any] | None = None,
) -> Any:
    """A ``local[parallelism]`` SparkSession set up for this project (small, quiet, fast)."""
    return spark_session(f"local[{parallelism}]", app_name, parallelism, extra_config)
