"""One input partition of the change feed read into Arrow record batches (no pyspark).

A :class:`~.checkpoint_changes.FeedTask` is an offset slice filtered to the sequence
numbers and key groups its checkpoint committed: its records are decoded as mode
``changes`` decodes them (:func:`~.change_columns.column_change_batches`), registrations
left out where another task emits them, and every row stamped with the checkpoint
(:func:`~.feed_schema.stamped`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .change_columns import column_change_batches
from .change_schema import BATCH_ROWS, META_OP
from .checkpoint_changes import FeedTask
from .feed_schema import stamped
from .planning import ReaderOptions
from .scan import SliceReader


def read_feed_task(task: FeedTask, options: ReaderOptions, batch_rows: int = BATCH_ROWS
                   ) -> Iterator[pa.RecordBatch]:
    """The record batches (of ``FEED_SCHEMA``, at most ``batch_rows`` rows each) of one
    feed task, in offset order."""
    piece = task.slice
    with SliceReader(options.changelog_config()) as reader:
        for batch in column_change_batches(reader.records(piece), task.operator, task.subtask,
                                           piece, batch_rows, task.key_types):
            if not task.with_meta:
                batch = batch.filter(pc.invert(pc.equal(batch.column("op"), META_OP)))
            if batch.num_rows:
                yield stamped(batch, task.stamp)


def describe_feed_task(task: FeedTask) -> str:
    """A short description of a feed task for messages."""
    s = task.slice
    return (f"changes checkpoint {task.stamp.checkpoint_id} committed, operator "
            f"{task.operator!r} subtask {task.subtask}, log {s.log_id}, {s.topic}[{s.partition}] "
            f"offsets [{s.start_offset}, {s.end_offset})")


__all__ = ["describe_feed_task", "read_feed_task"]
