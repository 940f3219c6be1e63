"""Spark Connect: sessions of a Connect client, and what the driver needs of them.

Under Spark Connect the client holds no SparkContext, no RDDs and no JVM gateway, and a
``foreachBatch`` function runs in a Python process the *server* starts, with a Connect
session of its own: the session of the client that started the query (Spark's
``foreach_batch_worker`` attaches to it by session id). This module gives the streaming
driver and the reader the Connect-safe ways to learn what they otherwise ask the JVM:

- :func:`is_connect`: whether a session is a Connect session (no ``sparkContext``);
- :func:`connect_query_id`: which streaming query runs the ``foreachBatch`` call (classic
  Spark sets it as a local property of the query's thread; Connect passes the function
  only the batch's DataFrame and id): the query of the session named like the
  application, else the session's only active query;
- :func:`connect_query_running`: whether that query still runs (the driver's hold lets go
  of the application once it stopped);
- :func:`connect_session`: a Connect client session set up like
  :func:`spark_integration.sessions.session.spark_session`'s classic ones.

The server itself (its jars and Python) is :mod:`spark_integration.sessions.connect_server`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka_changelog.errors import ChangelogError

#: The scheme of Spark Connect URLs (``sc://host:port``).
CONNECT_SCHEME = "sc://"


class ConnectQueryError(ChangelogError):
    """The streaming query running a ``foreachBatch`` call under Spark Connect cannot be
    told: the session runs several queries and none is named like the application."""


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect``): it has no
    SparkContext, RDDs or JVM gateway."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_query_id(session: Any, application: str) -> str:
    """The id of the streaming query whose ``foreachBatch`` call runs with ``session`` (a
    Connect session: the session that started the query): among the session's active
    queries, the one named ``application`` (``writeStream.queryName(application)``),
    else the only one; "" when none is active.

    Raises:
        ConnectQueryError: several queries are active in the session and none is named
            ``application``.
    """
    active = list(session.streams.active)
    named = [q for q in active if q.name == application]
    if len(named) == 1:
        return str(named[0].id)
    if len(active) == 1:
        return str(active[0].id)
    if not active:
        return ""
    raise ConnectQueryError(
        f"application {application!r}: the Spark Connect session runs {len(active)} "
        f"streaming queries ({sorted(str(q.name or q.id) for q in active)}) and none is named "
        f"{application!r}: name the stateful query after its application "
        f"(writeStream.queryName({application!r})) so that its batches can be told apart")


def connect_query_running(session: Any, query_id: str) -> Callable[[], bool]:
    """Whether Spark query ``query_id`` still runs in ``session`` (a Connect session): a
    restart of the query (same ``checkpointLocation``) from a new client stops it, and so
    does the end of the client's session."""
    def running() -> bool:
        query = session.streams.get(query_id)
        return query is not None and bool(query.isActive)
    return running


def connect_session(url: str, app_name: str = "kafka-changelog", parallelism: int = 2,
                    extra_config: dict[str, Any] | None = None) -> Any:
    """A Spark Connect client session on ``url`` (``sc://host:port``) set up for this project.

    ``parallelism`` sets the session's ``spark.sql.shuffle.partitions`` (Connect servers
    default to 200); ``extra_config`` (session settings) wins. The server must run with
    this library and Spark's Kafka connector (see
    :mod:`spark_integration.sessions.connect_server`): the client only sends plans and pickled
    functions. Register the reader with :func:`spark_integration.register`, as
    with classic sessions.
    """
    if not url.startswith(CONNECT_SCHEME):
        raise ValueError(f"a Spark Connect URL starts with {CONNECT_SCHEME!r}, got {url!r}")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url).appName(app_name)
    session = builder.getOrCreate()
    settings = {"spark.sql.shuffle.partitions": str(parallelism), **(extra_config or {})}
    for key, value in settings.items():
        session.conf.set(key, value)
    return session


__all__ = ["CONNECT_SCHEME", "ConnectQueryError", "connect_query_id", "connect_query_running",
           "connect_session", "is_connect"]
