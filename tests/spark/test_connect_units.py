"""The Spark Connect helpers without a server: which query a ``foreachBatch`` call runs
for, whether it still runs, the server's command line, and classic sessions left alone."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from spark_integration.reader.datasource import session_parallelism
from spark_integration.sessions.connect import (
    ConnectQueryError,
    connect_query_id,
    connect_query_running,
    connect_session,
    is_connect,
)
from spark_integration.sessions.connect_server import (
    SERVER_CLASS,
    ConnectServerConfig,
    server_command,
    server_environment,
)
from spark_integration.sessions.connector import ensure_connector_jars
from spark_integration.sessions.worker_daemon import WORKER_DAEMON
from spark_integration.streaming.subtask_partitioning import executor_ids


@dataclass
class Query:
    """What the helpers read of a Connect ``StreamingQuery``."""

    id: str
    name: str | None
    isActive: bool = True  # PySpark's name


@dataclass
class Streams:
    active: list[Query] = field(default_factory=list)

    def get(self, query_id: str) -> Query | None:
        return next((q for q in self.active if q.id == query_id), None)


@dataclass
class Session:
    """A stand-in for a Connect session's query manager (the real one needs a server)."""

    streams: Streams


def session_of(*queries: Query) -> Session:
    return Session(Streams(list(queries)))


def test_the_query_named_like_the_application_else_the_only_one() -> None:
    assert connect_query_id(session_of(Query("q-1", None), Query("q-2", "shop"),
                                       Query("q-3", "other")), "shop") == "q-2"
    assert connect_query_id(session_of(Query("q-1", "other")), "shop") == "q-1"
    assert connect_query_id(session_of(), "shop") == ""


def test_several_queries_none_named_like_the_application_are_refused() -> None:
    with pytest.raises(ConnectQueryError) as refused:
        connect_query_id(session_of(Query("q-1", None), Query("q-2", "other")), "shop")
    assert str(refused.value) == (
        "application 'shop': the Spark Connect session runs 2 streaming queries (['other', "
        "'q-1']) and none is named 'shop': name the stateful query after its application "
        "(writeStream.queryName('shop')) so that its batches can be told apart")


def test_a_query_runs_while_the_session_knows_it_active() -> None:
    query = Query("q-1", "shop")
    session = session_of(query)
    running = connect_query_running(session, "q-1")
    assert running() is True
    query.isActive = False
    assert running() is False
    session.streams.active.clear()  # stopped by a restart from another client
    assert running() is False


def test_a_connect_session_needs_a_connect_url() -> None:
    with pytest.raises(ValueError) as refused:
        connect_session("spark://127.0.0.1:7077")
    assert str(refused.value) == (
        "a Spark Connect URL starts with 'sc://', got 'spark://127.0.0.1:7077'")


def test_the_server_runs_with_the_connector_and_this_python() -> None:
    config = ConnectServerConfig(port=15123, spark_config={"spark.sql.shuffle.partitions": "3"},
                                 java_options="-Dtag=x", python_path=("/repo",))
    command = server_command(config)
    assert command[0].endswith("/pyspark/bin/spark-submit")
    assert command[command.index("--class") + 1] == SERVER_CLASS
    assert command[command.index("--master") + 1] == "local[2]"
    assert command[command.index("--jars") + 1].split(",") == [
        str(p) for p in ensure_connector_jars()]
    settings = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command)
                    if arg == "--conf")
    assert settings == {"spark.connect.grpc.binding.address": "127.0.0.1",
                        "spark.connect.grpc.binding.port": "15123",
                        "spark.ui.enabled": "false", "spark.pyspark.python": sys.executable,
                        "spark.python.daemon.module": WORKER_DAEMON,
                        "spark.driver.host": "127.0.0.1", "spark.sql.shuffle.partitions": "3"}
    assert command[command.index("--driver-java-options") + 1] == "-Dtag=x"
    assert command[-1] == "spark-internal"
    assert config.url == "sc://127.0.0.1:15123"
    env = server_environment(config, {"PYTHONPATH": "/lib", "HOME": "/h"})
    assert env == {"PYTHONPATH": os.pathsep.join(["/repo", "/lib"]), "HOME": "/h",
                   "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                   "SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.mark.spark
def test_classic_sessions_keep_their_context(spark: Any) -> None:
    assert not is_connect(spark)
    assert executor_ids(spark) == frozenset()  # local[2]: the driver runs the tasks
    assert session_parallelism(spark) == spark.sparkContext.defaultParallelism
