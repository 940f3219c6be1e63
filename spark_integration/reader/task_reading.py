"""One input partition of ``format("kafka-changelog")`` read into Arrow record batches.

What a Spark task of the reader runs (no pyspark import): mode ``changes`` decodes its
offset slice column-wise (:mod:`.change_columns`), modes ``state`` and
``timers`` restore their key groups and turn the table into rows
(:mod:`.rows`, :mod:`.timer_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from kafka_changelog.state.backend.restore import load_keyed_state
from kafka_changelog.state.tables.memory import StateTable

from .change_columns import column_change_batches
from .change_schema import BATCH_ROWS
from .packing import ChangesGroup
from .planning import ChangesTask, ReaderOptions, StateTask
from .rows import state_batches
from .scan import WINDOW_BYTES, ChunkReader, SliceReader, read_windows
from .timer_rows import timer_batches


def read_task(task: ChangesTask | ChangesGroup | StateTask, options: ReaderOptions,
              batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The record batches of one input partition, at most ``batch_rows`` rows each.

    ``ChangesTask``: the changes of its offset slice, in offset order (append order
    within a record); ``ChangesGroup``: those of each of its slices in turn, with one
    consumer, a window of slices fetched at once (:meth:`~.scan.SliceReader.records_of`).
    ``StateTask``: its key groups' snapshot chunks, then the changelog replayed on top
    (exactly as a restore does, with
    :func:`~kafka_changelog.state.backend.restore.load_keyed_state`), as rows of its states'
    entries, or of its timers (``StateTask.timers``).
    """
    if isinstance(task, ChangesTask | ChangesGroup):
        slices = task.tasks if isinstance(task, ChangesGroup) else (task,)
        with SliceReader(options.changelog_config()) as reader:
            for window in read_windows([t.estimated_bytes for t in slices], WINDOW_BYTES):
                part = slices[window.start:window.stop]
                records = reader.records_of([t.slice for t in part])
                for one, one_records in zip(part, records, strict=True):
                    yield from column_change_batches(one_records, one.operator, one.subtask,
                                                     one.slice, batch_rows, one.key_types)
        return
    table = StateTable()
    snapshot = task.handle.snapshot
    chunks = ChunkReader(options.snapshot_config(
        topic=snapshot.topic if snapshot is not None else None))
    with SliceReader(options.changelog_config()) as reader:
        load_keyed_state(table, task.handle, task.key_groups, chunks, reader)
    if task.timers:
        yield from timer_batches(table, task.operator, batch_rows, task.key_types)
        return
    yield from state_batches(table, task.operator, batch_rows, task.key_types, task.at_ms)


__all__ = ["read_task"]
