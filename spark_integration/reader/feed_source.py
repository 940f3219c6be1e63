"""The change feed: ``readStream.format("kafka-changelog")`` and batch reads between checkpoints.

``spark.readStream`` with option ``startingCheckpoint`` emits, per micro-batch, the
changes of every checkpoint committed since the previous micro-batch (offsets are
checkpoint ids, see :mod:`.feed_planning`), so Spark's own
``checkpointLocation`` makes the feed exactly once and resumable: a restarted query
plans the same range again and emits the same rows. With ``trigger(availableNow=True)``
the run's end is fixed at its start (by the stream reader, PySpark's
``SupportsTriggerAvailableNow``, from 4.2; by Spark, which asks the feed once, before):
the run emits every checkpoint committed before it started, in as many micro-batches as
it takes (a micro-batch that failed in an earlier run first), and ends. ``spark.read`` with
``startingCheckpoint`` (and ``endingCheckpoint``) reads the same rows for a range of
checkpoints at once, with key pushdown (:mod:`.pushdown`).

Input partitions are listed in checkpoint order, then by operator, subtask and
partition: a key's changes of one checkpoint are in one partition of the changelog
(one input partition, or consecutive ones when long), so reading the partitions in
order gives a key's changes in the order they were committed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter
    from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
else:
    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
    except ImportError:  # PySpark 4.0 and 4.1: Spark fixes an AvailableNow run's end itself

        class SupportsTriggerAvailableNow:
            """Stands in for PySpark 4.2's mixin, which older releases do not have."""

from .checkpoint_changes import FeedTask, contiguous_groups
from .feed_planning import FeedOptions, FeedPlanner
from .planning import FORMAT, ReaderOptionError
from .pushdown import KeySelection, select
from .worker_gc import freeze_start_up_objects

#: The offset's field: the last checkpoint whose changes were emitted.
OFFSET_KEY = "checkpoint"


class FeedPartition(InputPartition):
    """One input partition of the feed: consecutive :class:`FeedTask` s, read in turn
    (picklable)."""

    def __init__(self, tasks: tuple[FeedTask, ...]) -> None:
        super().__init__(tasks)
        self.tasks = tasks


def feed_partitions(tasks: Sequence[FeedTask], groups: int | None) -> list[InputPartition]:
    """The input partitions of ``tasks``: ``groups`` runs of consecutive tasks (None: one
    per task), in order."""
    if groups is None:
        return [FeedPartition((t,)) for t in tasks]
    return [FeedPartition(run) for run in contiguous_groups(tasks, groups)]


def check_schema(schema: StructType, expected: StructType, what: str) -> None:
    """A user-given schema must be the feed's."""
    if schema != expected:
        raise ReaderOptionError(
            f"format('{FORMAT}') {what} has the fixed schema {expected.simpleString()}; got "
            f"{schema.simpleString()} (drop .schema(...))")


def _read(partition: InputPartition, options: FeedOptions) -> Iterator[pa.RecordBatch]:
    tasks = getattr(partition, "tasks", None)
    if tasks is None:  # Spark's placeholder when the plan has no task
        return
    # Imported here: the stream reader's runner process only plans.
    from .feed_reading import read_feed_tasks

    freeze_start_up_objects()
    yield from read_feed_tasks(tasks, options.reader)


def _checkpoint(offset: dict[str, Any]) -> int:
    return int(offset[OFFSET_KEY])


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The change feed of one application (``readStream``), offsets ``{"checkpoint": id}``.

    A micro-batch ``(start, end]`` emits the changes of the retained checkpoints after
    ``start`` up to ``end``. ``end`` is the latest checkpoint when the batch is planned,
    except in a ``Trigger.AvailableNow`` run: there it is the latest checkpoint when the
    run started (:meth:`prepareForTriggerAvailableNow`, or Spark's own first call of
    :meth:`latestOffset` before PySpark 4.2), for every batch of the run. ``end`` is
    never before ``start``. Holds only the parsed options, that fixed end and the
    furthest offset planned (the planner reads the checkpoint topic each time)."""

    def __init__(self, options: FeedOptions, groups: int | None = None) -> None:
        self.options = options
        #: Input partitions per micro-batch at most (None: one per offset slice).
        self.groups = groups
        #: The end of a ``Trigger.AvailableNow`` run: the latest checkpoint when it started
        #: (None: another trigger, the end follows the latest checkpoint).
        self.available_now_end: int | None = None
        #: The furthest offset planned (the start of a new query, the end of a batch):
        #: PySpark before 4.2 gives :meth:`latestOffset` no start, so the end is kept at
        #: least here.
        self.planned: int = 0

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: option ``startingCheckpoint``."""
        start = FeedPlanner(self.options).start()
        self.planned = max(self.planned, start)
        return {OFFSET_KEY: start}

    def prepareForTriggerAvailableNow(self) -> None:
        """Start of a ``Trigger.AvailableNow`` run (before any batch, the one Spark runs
        again after a failure included): fix the run's end at the latest committed
        checkpoint now. :meth:`latestOffset` then never goes past it, so the run emits
        every checkpoint committed before it started and none committed after (those are
        for the next run); Spark ends the run when ``latestOffset`` returns its start."""
        self.available_now_end = FeedPlanner(self.options).latest()

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        """The latest committed checkpoint, or in a ``Trigger.AvailableNow`` run the one
        fixed when it started; never before ``start`` (PySpark before 4.2 passes no
        start: never before the furthest offset planned). ``limit`` is always
        all-available: the feed sets no read limit of its own (``getDefaultReadLimit``
        is PySpark's ``ReadAllAvailable``), so a batch takes every checkpoint up to the
        end."""
        end = self.available_now_end
        if end is None:
            end = FeedPlanner(self.options).latest()
        floor = _checkpoint(start) if start is not None else self.planned
        return {OFFSET_KEY: max(floor, end)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One input partition per offset slice of the changes of ``(start, end]``."""
        first, last = _checkpoint(start), _checkpoint(end)
        self.planned = max(self.planned, last)
        if last <= first:
            return []
        return feed_partitions(FeedPlanner(self.options).plan(first, last), self.groups)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow record batches of one input partition."""
        return _read(partition, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the feed only reads."""


class ChangesBetweenReader(DataSourceReader):
    """Batch reads of the changes of checkpoints ``(startingCheckpoint, endingCheckpoint]``,
    with filters on keys and key groups pushed down (option ``pushdown``)."""

    def __init__(self, options: FeedOptions, pushdown: bool = False,
                 groups: int | None = None) -> None:
        self.options = options
        self.pushdown = pushdown
        #: Input partitions at most (None: one per offset slice).
        self.groups = groups
        self.selection = KeySelection()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """With option ``pushdown``, keep what the filters on keys and key groups select;
        hand every filter back to Spark (the selection only narrows what is read)."""
        if self.pushdown:
            self.selection = select(filters)
        yield from filters

    def partitions(self) -> Sequence[InputPartition]:
        """One input partition per offset slice, in checkpoint order."""
        planner = FeedPlanner(self.options)
        start = planner.start()
        end = self.options.ending if self.options.ending is not None else planner.latest()
        if end <= start:
            return []
        selection = None if self.selection.is_empty else self.selection
        return feed_partitions(planner.plan(start, end, selection), self.groups)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow record batches of one input partition."""
        return _read(partition, self.options)


__all__ = ["OFFSET_KEY", "ChangeFeedStreamReader", "ChangesBetweenReader", "FeedPartition",
           "check_schema", "feed_partitions"]
