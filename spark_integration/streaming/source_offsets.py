"""The input offsets a micro-batch consumed up to, read from the query's offset log.

Spark's micro-batch engine writes, before it runs batch ``b``, the end offset of every
source for that batch to the offset log of the query's ``checkpointLocation``
(``offsets/<b>``); the batch reads exactly up to them, and a restart re-runs the batch
with exactly them. For the Kafka source an end offset is the JSON
``{"topic": {"partition": next offset}}``, the very form of ``startingOffsets``. So
the offset log is exact where the alternatives are not: the rows' ``offset`` columns
are gone once the query projects them away, miss partitions without rows and end
before transaction markers; a query's progress is only known after ``foreachBatch``
returned, too late for the checkpoint the batch commits.

The driver reads the log through the running query (py4j, classic Spark only); a
batch of Spark Connect or of a query without Kafka sources records nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kafka_changelog.state.source_offsets import SourceOffsets

logger = logging.getLogger(__name__)


def kafka_end_offsets(offset_jsons: list[str | None]) -> SourceOffsets:
    """The Kafka-shaped end offsets among a batch's sources' offset JSONs, merged
    (others, e.g. ``rate-micro-batch`` ticks, are left out)."""
    merged: SourceOffsets = {}
    for text in offset_jsons:
        if text is None:
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            continue
        try:
            parsed = {str(t): {int(p): int(o) for p, o in parts.items()}
                      for t, parts in data.items()}
        except (TypeError, ValueError):
            continue
        for topic, partitions in parsed.items():
            merged.setdefault(topic, {}).update(partitions)
    return merged


def batch_end_offsets(batch_df: Any, query_id: str, batch_id: int) -> SourceOffsets:
    """The Kafka end offsets of batch ``batch_id`` of the query ``query_id`` from its
    offset log (empty when they cannot be read: logged, never raised)."""
    if not query_id:
        return {}
    try:
        session = batch_df.sparkSession
        jvm = session.sparkContext._jvm
        # The query's session is a clone of the user's; active queries are kept in the
        # state every clone shares.
        execution = session._jsparkSession.sharedState().activeStreamingQueries().get(
            jvm.java.util.UUID.fromString(query_id))
        if execution is None:
            return {}
        logged = execution.offsetLog().get(batch_id)
        if not logged.isDefined():
            return {}
        offsets = logged.get().offsets()
        found: list[str | None] = []
        for i in range(offsets.size()):
            offset = offsets.apply(i)
            found.append(str(offset.get().json()) if offset.isDefined() else None)
    except Exception as exc:  # Spark Connect, another engine: nothing to record
        logger.debug("batch %d of query %s: source offsets not readable: %s", batch_id,
                     query_id, exc)
        return {}
    return kafka_end_offsets(found)
