"""A batch cut short by ``query.stop()`` ends the query quietly.

``query.stop()`` cancels the running batch's Spark jobs: the ``foreachBatch`` function
then fails with the cancellation (a ``Py4JJavaError`` whose text holds the JVM's stack
traces). py4j hands Spark the function's failure as its Python traceback, and Spark
tells a stop's interruption from a failure by matching that text with a regular
expression (``StreamExecution.PROXY_ERROR``, ``(.|\\r\\n|\\r|\\n)*`` between
``py4j.protocol.Py4JJavaError: An error occurred while calling`` and
``java.lang.InterruptedException``) whose matcher recurses once per character: on a
traceback of a few thousand characters the stream execution thread dies of a
``StackOverflowError`` (logged by the JVM; queries with ticks hit it at most stops, a
batch being always under way).

:func:`stops_cleanly` wraps a ``foreachBatch`` function: when the function fails after
its query was stopped, it raises :class:`QueryStoppedError` instead, alone (no chained
traceback), whose short message is what Spark recognizes as the stop's interruption.
Nothing of the batch was committed by then that a re-run would not redo (the batch
commits its checkpoint last, and Spark runs a batch that did not end again at the next
start). Failures of a query that was not stopped are raised as they are.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kafka_changelog.errors import ChangelogError

from ..sessions.connect import is_connect

logger = logging.getLogger(__name__)

#: What Spark's ``StreamExecution.PROXY_ERROR`` looks for, in order, in the failure of a
#: ``foreachBatch`` function of a stopped query.
_INTERRUPTION_TEXT = ("py4j.protocol.Py4JJavaError: An error occurred while calling "
                      "foreachBatch: java.lang.InterruptedException")

S = TypeVar("S")


class QueryStoppedError(ChangelogError):
    """A batch cut short because its query was stopped (``query.stop()``): its checkpoint
    was not committed, and the next start of the query runs the batch again."""


def query_stopped(batch_df: Any) -> bool:
    """Whether the streaming query running ``batch_df``'s ``foreachBatch`` call was
    stopped (or is gone). False when that cannot be told: under Spark Connect, outside a
    query, or if the JVM does not answer."""
    try:
        session = batch_df.sparkSession
        if is_connect(session):
            return False
        query_id = session.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:
            return False
        jvm = session.sparkContext._jvm
        execution = (session._jsparkSession.sharedState().activeStreamingQueries()
                     .get(jvm.java.util.UUID.fromString(query_id)))
        return execution is None or not bool(execution.isActive())
    except Exception as exc:  # the JVM side of the query is going away
        logger.debug("cannot tell whether the query was stopped: %s", exc)
        return False


def stopped_error(batch_id: int, cause: BaseException) -> QueryStoppedError:
    """The short error a batch cut short by its query's stop raises (module docstring)."""
    first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
    return QueryStoppedError(
        f"{_INTERRUPTION_TEXT} (batch {batch_id} cut short by query.stop(), nothing "
        f"committed: {type(cause).__name__}: {first_line})")


def stops_cleanly(
    function: Callable[[S, Any, int], None]
) -> Callable[[S, Any, int], None]:
    """Wrap a ``foreachBatch`` method ``function(self, batch_df, batch_id)`` so that its
    failure after the query was stopped raises :func:`stopped_error` alone."""

    @functools.wraps(function)
    def call(self: S, batch_df: Any, batch_id: int) -> None:
        try:
            function(self, batch_df, batch_id)
        except Exception as exc:
            if not query_stopped(batch_df):
                raise
            logger.info("batch %d cut short by the query's stop: %s", batch_id,
                        (str(exc).strip().splitlines() or [""])[0][:200])
            raise stopped_error(batch_id, exc) from None

    return call


__all__ = ["QueryStoppedError", "query_stopped", "stopped_error", "stops_cleanly"]
