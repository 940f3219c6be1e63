"""Ticks: micro-batches at every trigger, with or without new input.

Spark runs a micro-batch (and so calls ``foreachBatch``) only when a source has new data,
so a query whose input pauses would not fire processing-time timers or expire TTL'd
state during the pause. :func:`with_ticks` adds Spark's ``rate-micro-batch`` source,
which has new rows at every trigger, to the input stream: with a processing-time trigger
(``trigger(processingTime="10 seconds")``), Spark runs a micro-batch every interval. The
processor drops the tick rows before anything else (:func:`without_ticks`), so the
user's function never sees them.

Limits: the ticks are a source of the query, recorded in its ``checkpointLocation``:
add them when the query is first started (Spark refuses to restart a query from a
checkpoint with another set of sources). Every tick makes a batch, and every batch a
checkpoint: the trigger interval bounds how late a due timer fires and what a quiet
query costs. Without a processing-time trigger, Spark starts the next batch as soon as
one ends: a busy loop of empty batches.
"""

from __future__ import annotations

from typing import Any

#: True on tick rows; null on the input's rows.
TICK_COLUMN = "__kc_tick"


def with_ticks(stream: Any, rows_per_batch: int = 1) -> Any:
    """``stream`` (a streaming DataFrame) with one tick row per micro-batch, so that
    Spark runs a micro-batch at every trigger even when the input has no new rows.

    Give the result to a query that has a processing-time trigger and whose
    ``foreachBatch`` function is a :class:`~spark_integration.streaming.StatefulProcessor`
    (which drops the ticks). The result has the input's columns (null on tick rows) and
    :data:`TICK_COLUMN`.
    """
    if not getattr(stream, "isStreaming", False):
        raise ValueError("with_ticks needs a streaming DataFrame (spark.readStream...): a "
                         "batch DataFrame has no micro-batches to tick")
    if TICK_COLUMN in stream.columns:
        raise ValueError(f"the stream already has ticks (column {TICK_COLUMN})")
    if rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be at least 1, got {rows_per_batch}")
    from pyspark.sql import functions as F

    ticks = (stream.sparkSession.readStream.format("rate-micro-batch")
             .option("rowsPerBatch", str(rows_per_batch)).load()
             .select(F.lit(True).alias(TICK_COLUMN)))
    return stream.unionByName(ticks, allowMissingColumns=True)


def without_ticks(batch_df: Any) -> Any:
    """A micro-batch's rows without the tick rows (``batch_df`` as it is when its stream
    has no ticks)."""
    if TICK_COLUMN not in batch_df.columns:
        return batch_df
    from pyspark.sql import functions as F

    return batch_df.where(F.col(TICK_COLUMN).isNull()).drop(TICK_COLUMN)
