"""Spark 4.1's Kafka source after a restart: its progress report must find the latest offsets.

PySpark 4.1.1's ``KafkaMicroBatchStream`` reports a batch's progress from the latest offsets
it fetched when it planned a batch, wrapped in ``Some`` without a null check (4.0 passes the
map as it is, 4.2 wraps it with ``Option``). A restarted query whose first batch is one
Spark's offset log already planned (the driver died during it) runs that batch without
planning it, and its progress report fails with a ``NullPointerException`` in
``KafkaMicroBatchStream.metrics`` after the batch ran, and the query stops.
:func:`prime_latest_offsets` asks such a source for its latest offsets once per run, as
planning would have, so that the report has them. Only on 4.1; a failure is logged and
changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from ..sessions.spark_versions import spark_release

logger = logging.getLogger(__name__)

#: The sources primed in this driver (JVM identity hashes of the streams of query runs).
_primed: set[int] = set()


def prime_latest_offsets(jvm: Any, stream: Any, end: Any) -> None:
    """Before the batch whose end offset is ``end`` (a Scala ``Option``) runs, let Spark
    4.1's Kafka ``stream`` fetch its latest offsets once per query run (module docstring)."""
    if spark_release()[:2] != (4, 1) or not end.isDefined():
        return
    try:
        key = int(jvm.java.lang.System.identityHashCode(stream))
        if key in _primed:
            return
        if len(_primed) > 10_000:  # one per query run: a long-lived driver's are forgotten
            _primed.clear()
        _primed.add(key)
        limit = jvm.org.apache.spark.sql.connector.read.streaming.ReadLimit.allAvailable()
        stream.latestOffset(stream.deserializeOffset(end.get().json()), limit)
    except Exception as exc:  # never fails a batch: the report may then fail as before
        logger.warning("could not fetch the Kafka source's latest offsets before the first "
                       "batch of a restarted query (Spark 4.1's progress report may fail): %s",
                       exc)
