"""The rows of the change feed: mode ``changes``' columns plus the committing checkpoint.

``readStream.format("kafka-changelog")`` and ``read`` with ``startingCheckpoint`` emit the
changes each checkpoint committed; every row says which checkpoint that was, the Spark
batch that committed it and when. No pyspark import (the Spark schema is derived from
:data:`FEED_SCHEMA` by ``spark_integration.reader.datasource.spark_schema``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from ..checkpoint_properties import BATCH_ID
from .change_schema import CHANGES_SCHEMA

#: The feed's columns: those of mode ``changes``, then ``checkpoint_id`` (the checkpoint
#: that committed the change), ``batch_id`` (its Spark batch; null when not committed by a
#: Spark query) and ``commit_time`` (when the checkpoint was committed).
FEED_SCHEMA = pa.schema([
    *CHANGES_SCHEMA,
    pa.field("checkpoint_id", pa.int64()),
    pa.field("batch_id", pa.int64()),
    pa.field("commit_time", pa.timestamp("us", tz="UTC")),
])


@dataclass(frozen=True)
class CheckpointStamp:
    """What the feed's rows say about the checkpoint that committed them."""

    checkpoint_id: int
    #: The Spark batch id the checkpoint records (None: not committed by a Spark query).
    batch_id: int | None
    #: When the checkpoint was committed (ms since the epoch).
    commit_ms: int

    @staticmethod
    def of(checkpoint_id: int, timestamp_ms: int, properties: Mapping[str, str]
           ) -> CheckpointStamp:
        """The stamp of a checkpoint from its id, timestamp and properties."""
        raw = properties.get(BATCH_ID)
        return CheckpointStamp(checkpoint_id, int(raw) if raw is not None else None,
                               timestamp_ms)


def stamped(batch: pa.RecordBatch, stamp: CheckpointStamp) -> pa.RecordBatch:
    """``batch`` (of ``CHANGES_SCHEMA``) with the stamp's three columns appended."""
    n = batch.num_rows
    return pa.RecordBatch.from_arrays([
        *batch.columns,
        pa.repeat(pa.scalar(stamp.checkpoint_id, pa.int64()), n),
        pa.repeat(pa.scalar(stamp.batch_id, pa.int64()), n),
        pa.repeat(pa.scalar(stamp.commit_ms * 1000, pa.timestamp("us", tz="UTC")), n),
    ], schema=FEED_SCHEMA)


__all__ = ["FEED_SCHEMA", "CheckpointStamp", "stamped"]
