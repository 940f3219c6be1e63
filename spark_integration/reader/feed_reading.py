"""Input partitions of the change feed read into Arrow record batches (no pyspark).

A :class:`~.checkpoint_changes.FeedTask` is an offset slice filtered to the sequence
numbers and key groups its checkpoint committed: its records are decoded as mode
``changes`` decodes them (:func:`~.change_columns.column_change_batches`), registrations
left out where another task emits them, and every row stamped with the checkpoint
(:func:`~.feed_schema.stamped`). An input partition's tasks are read with one consumer,
a window of them at a time (:meth:`~.scan.SliceReader.records_of`): one fetch round trip
for a window's slices, not one per slice (a micro-batch of many small checkpoints has
many small slices).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc

from .change_columns import column_change_batches
from .change_schema import BATCH_ROWS, META_OP
from .checkpoint_changes import FeedTask
from .feed_schema import stamped
from .planning import FORMAT, ReaderOptions
from .scan import WINDOW_BYTES, SliceReader, read_windows


def read_feed_tasks(tasks: Sequence[FeedTask], options: ReaderOptions,
                    batch_rows: int = BATCH_ROWS, window_bytes: int = WINDOW_BYTES
                    ) -> Iterator[pa.RecordBatch]:
    """The record batches (of ``FEED_SCHEMA``, at most ``batch_rows`` rows each) of
    ``tasks``, task after task, each in offset order. An error names the task (or the
    window of tasks) it was met in."""
    with SliceReader(options.changelog_config()) as reader:
        for window in read_windows([t.estimated_bytes for t in tasks], window_bytes):
            part = tasks[window.start:window.stop]
            with _noted(part):
                records = reader.records_of([t.slice for t in part])
            for task, task_records in zip(part, records, strict=True):
                with _noted((task,)):
                    yield from _task_batches(task, task_records, batch_rows)


def read_feed_task(task: FeedTask, options: ReaderOptions, batch_rows: int = BATCH_ROWS
                   ) -> Iterator[pa.RecordBatch]:
    """The record batches of one feed task (:func:`read_feed_tasks` of it alone)."""
    return read_feed_tasks((task,), options, batch_rows)


def _task_batches(task: FeedTask, records: list[tuple[int, bytes]], batch_rows: int
                  ) -> Iterator[pa.RecordBatch]:
    for batch in column_change_batches(records, task.operator, task.subtask, task.slice,
                                       batch_rows, task.key_types):
        if not task.with_meta:
            batch = batch.filter(pc.invert(pc.equal(batch.column("op"), META_OP)))
        if batch.num_rows:
            yield stamped(batch, task.stamp)


@contextmanager
def _noted(tasks: Sequence[FeedTask]) -> Iterator[None]:
    """Adds a note naming ``tasks`` to an exception raised in the block."""
    try:
        yield
    except Exception as exc:
        described = describe_feed_task(tasks[0])
        if len(tasks) > 1:
            described += (f" (and {len(tasks) - 1} later task(s), up to "
                          f"{describe_feed_task(tasks[-1])})")
        add_note = getattr(exc, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note(f"while reading {described} for format('{FORMAT}')")
        raise


def describe_feed_task(task: FeedTask) -> str:
    """A short description of a feed task for messages."""
    s = task.slice
    return (f"changes checkpoint {task.stamp.checkpoint_id} committed, operator "
            f"{task.operator!r} subtask {task.subtask}, log {s.log_id}, {s.topic}[{s.partition}] "
            f"offsets [{s.start_offset}, {s.end_offset})")


__all__ = ["describe_feed_task", "read_feed_task", "read_feed_tasks"]
