"""``spark.read.format("kafka-changelog")``: a checkpoint's changes or state as a DataFrame.

A PySpark Python data source (Spark 4). Register it once per session with
:func:`register`, then::

    df = (spark.read.format("kafka-changelog")
          .option("kafka.bootstrap.servers", "localhost:9092")
          .option("application", "shop")
          .option("mode", "state")           # or "changes" (default), "timers"
          .option("checkpoint", "41")        # default: the latest
          .load())

Planning (which checkpoint, which input partitions) is in
:mod:`.planning` and :mod:`.packing`, reading one
input partition in :mod:`.task_reading` (changes decoded column-wise
by :mod:`.change_columns`, state rows by :mod:`.rows`,
timer rows by :mod:`.timer_rows`).
See ``docs/reading.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..sessions.connect import is_connect
from ..sessions.spark_versions import SparkFeature, require_supported_spark, supports
from .change_schema import CHANGES_SCHEMA
from .feed_planning import is_feed_read, parse_feed_options
from .feed_schema import FEED_SCHEMA
from .feed_source import ChangeFeedStreamReader, ChangesBetweenReader, check_schema
from .packing import ChangesGroup, pack_changes
from .planning import (
    FORMAT,
    MODE_CHANGES,
    MODE_STATE,
    ChangesTask,
    ReaderOptionError,
    ReaderOptions,
    ReadPlan,
    StateTask,
    parse_options,
    plan_read,
)
from .pushdown import KeySelection, pushdown_enabled, select
from .rows import STATE_SCHEMA
from .selected_plan import plan_selected
from .timer_rows import TIMERS_SCHEMA
from .worker_gc import freeze_start_up_objects

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter


def _spark_type(arrow: pa.DataType) -> DataType:
    if pa.types.is_string(arrow):
        return StringType()
    if pa.types.is_int32(arrow):
        return IntegerType()
    if pa.types.is_int64(arrow):
        return LongType()
    if pa.types.is_binary(arrow):
        return BinaryType()
    if pa.types.is_list(arrow):
        return ArrayType(_spark_type(arrow.value_type))
    if pa.types.is_timestamp(arrow) and arrow.tz is not None:
        return TimestampType()
    raise TypeError(f"no Spark type for Arrow type {arrow}")


def spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema whose Arrow form is ``arrow`` (every column nullable)."""
    return StructType([StructField(f.name, _spark_type(f.type), True) for f in arrow])


#: Spark schema of mode ``changes``.
CHANGES_STRUCT = spark_schema(CHANGES_SCHEMA)
#: Spark schema of mode ``state``.
STATE_STRUCT = spark_schema(STATE_SCHEMA)
#: Spark schema of mode ``timers``.
TIMERS_STRUCT = spark_schema(TIMERS_SCHEMA)
#: Spark schema of the change feed and of changes between checkpoints.
FEED_STRUCT = spark_schema(FEED_SCHEMA)

#: The Spark SQL setting that runs ``trigger(availableNow=True)`` over a source without
#: ``SupportsTriggerAvailableNow`` (the change feed before PySpark 4.2) in as many batches
#: as it takes, its end fixed at the start, instead of one batch.
AVAILABLE_NOW_WRAPPER_CONF = "spark.sql.streaming.triggerAvailableNowWrapper.enabled"
#: The Spark SQL setting PySpark needs for a reader with ``pushFilters``.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def schema_of(mode: str) -> StructType:
    """The Spark schema of a mode."""
    if mode == MODE_CHANGES:
        return CHANGES_STRUCT
    return STATE_STRUCT if mode == MODE_STATE else TIMERS_STRUCT


class TaskPartition(InputPartition):
    """One input partition: a :class:`ChangesTask`, a :class:`ChangesGroup` of them or a
    :class:`StateTask` (picklable)."""

    def __init__(self, task: ChangesTask | ChangesGroup | StateTask) -> None:
        super().__init__(task)
        self.task = task


class KafkaChangelogDataSource(DataSource):
    """The batch data source ``kafka-changelog`` (options in ``docs/reading.md``).

    ``default_min_partitions``: option ``minPartitions`` when not given (None: one input
    partition per slice); :func:`register` sets it to the session's parallelism.
    """

    default_min_partitions: int | None = None

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> StructType:
        """The schema of the requested mode (options are checked here, at ``load()``);
        with ``startingCheckpoint``, the change feed's."""
        if is_feed_read(self.options):
            return FEED_STRUCT
        return schema_of(parse_options(self.options).mode)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The change feed (``readStream``); needs option ``startingCheckpoint``."""
        options = parse_feed_options(self.options, streaming=True)
        check_schema(schema, FEED_STRUCT, "readStream (the change feed)")
        groups = options.reader.min_partitions or self.default_min_partitions
        return ChangeFeedStreamReader(options, groups)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader; a user-given schema must equal the mode's schema."""
        if is_feed_read(self.options):
            between = parse_feed_options(self.options, streaming=False)
            check_schema(schema, FEED_STRUCT, "with startingCheckpoint")
            groups = between.reader.min_partitions or self.default_min_partitions
            return ChangesBetweenReader(between, pushdown_enabled(self.options), groups)
        options = parse_options(self.options)
        expected = schema_of(options.mode)
        if schema != expected:
            raise ReaderOptionError(
                f"format('{FORMAT}') in mode {options.mode!r} has the fixed schema "
                f"{expected.simpleString()}; got {schema.simpleString()} (drop .schema(...))")
        if options.min_partitions is None and self.default_min_partitions is not None:
            options = dataclasses.replace(options, min_partitions=self.default_min_partitions)
        return KafkaChangelogBatchReader(options, pushdown_enabled(self.options))


class KafkaChangelogBatchReader(DataSourceReader):
    """Plans on the driver (checkpoint, tasks) and reads one task per Spark task.

    Holds only the parsed options, so it pickles small; the plan is made again by
    each query that uses the DataFrame (pin ``checkpoint`` for the same data).
    """

    def __init__(self, options: ReaderOptions, pushdown: bool = False) -> None:
        self.options = options
        self.pushdown = pushdown
        self.selection = KeySelection()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """With option ``pushdown``, keep what filters on ``key``, ``key_decoded`` and
        ``key_group`` select (:mod:`.pushdown`); every filter goes back to
        Spark, which applies it to the rows read."""
        if self.pushdown:
            self.selection = select(filters)
        yield from filters

    def partitions(self) -> list[InputPartition]:
        """One input partition per task of the plan; in mode ``changes`` with
        ``min_partitions``, per group of slices (:func:`~.packing.pack_changes`). Pushed
        key filters: one per selected run of key groups (or slice), not packed."""
        if self.selection.is_empty:
            plan = plan_read(self.options)
            return [TaskPartition(task) for task in input_partitions(plan, self.options)]
        plan, narrowed = plan_selected(self.options, self.selection)
        if narrowed:
            return [TaskPartition(task) for task in plan.tasks]
        return [TaskPartition(task) for task in input_partitions(plan, self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow record batches (about 10k rows each) of one input partition."""
        task = getattr(partition, "task", None)
        if task is None:  # Spark's placeholder when the plan has no task
            return iter(())
        # Imported here: the processes that only plan (Spark's Python planner, the
        # streaming source's runner) start without the read path's modules.
        from .task_reading import read_task

        # Spark collects garbage after every task: not the worker's modules again and again.
        freeze_start_up_objects()
        return _with_context(read_task(task, self.options), task)


def input_partitions(plan: ReadPlan, options: ReaderOptions
                     ) -> list[ChangesTask | ChangesGroup | StateTask]:
    """What each input partition of ``plan`` reads."""
    if options.mode != MODE_CHANGES or options.min_partitions is None:
        return list(plan.tasks)
    return list(pack_changes([t for t in plan.tasks if isinstance(t, ChangesTask)],
                             options.min_partitions))


def _with_context(batches: Iterator[pa.RecordBatch],
                  task: ChangesTask | ChangesGroup | StateTask) -> Iterator[pa.RecordBatch]:
    """``batches``, with the task named in the traceback of any error (the message is kept)."""
    try:
        yield from batches
    except Exception as exc:
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(f"while reading {describe_task(task)} for format('{FORMAT}')")
        raise


def describe_task(task: ChangesTask | ChangesGroup | StateTask) -> str:
    """A short description of a task for messages."""
    if isinstance(task, ChangesGroup):
        return "; ".join(describe_task(t) for t in task.tasks)
    if isinstance(task, ChangesTask):
        s = task.slice
        return (f"changes of operator {task.operator!r} subtask {task.subtask}, log {s.log_id}, "
                f"{s.topic}[{s.partition}] offsets [{s.start_offset}, {s.end_offset})")
    what = "timers" if task.timers else "state"
    return (f"{what} of operator {task.operator!r} subtask {task.subtask}, key groups "
            f"{task.key_groups}")


def register_source(spark: Any, source: type[KafkaChangelogDataSource]) -> None:
    """Register ``source`` as ``format("kafka-changelog")`` with ``spark`` (a SparkSession);
    idempotent. Applications call :func:`spark_integration.register`, which registers the
    format that reads and writes (``spark_integration.writer.format``).

    Turns on ``spark.sql.python.filterPushdown.enabled`` for the session (filters on
    keys read only their key groups; PySpark 4.1+), and before PySpark 4.2
    ``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` (an AvailableNow run of the
    change feed emits what was committed when it started). Refuses an unsupported PySpark
    (:class:`~spark_integration.sessions.spark_versions.UnsupportedSparkVersionError`).
    Mode ``changes`` then packs its slices into a multiple of the session's parallelism
    of input partitions (option ``minPartitions``), when the session tells it.
    """
    require_supported_spark()
    if supports(SparkFeature.READER_FILTER_PUSHDOWN):
        # The reader pushes filters down; PySpark refuses such a reader unless this is on.
        spark.conf.set(PUSHDOWN_CONF, "true")
    if not supports(SparkFeature.STREAM_AVAILABLE_NOW):
        # Before 4.2 a Python source cannot fix an AvailableNow run's end: without Spark's
        # wrapper (which asks the feed once, at the start) the run is a single batch.
        spark.conf.set(AVAILABLE_NOW_WRAPPER_CONF, "true")
    parallelism = session_parallelism(spark)
    if parallelism is None:
        spark.dataSource.register(source)
        return
    # A subclass made here carries the parallelism to the workers: cloudpickle sends a
    # class that is not importable by name with its attributes.
    carried = type(source.__name__, (source,),
                   {"default_min_partitions": parallelism, "__module__": __name__,
                    "__doc__": source.__doc__})
    spark.dataSource.register(carried)


def session_parallelism(spark: Any) -> int | None:
    """``spark.default.parallelism`` of the session (Spark Connect: only if set), or None."""
    if not is_connect(spark):
        try:
            return int(spark.sparkContext.defaultParallelism)
        except Exception:  # a stopped session
            pass
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:
        return None
    return int(value) if value else None


__all__ = [
    "CHANGES_STRUCT",
    "FEED_STRUCT",
    "PUSHDOWN_CONF",
    "STATE_STRUCT",
    "TIMERS_STRUCT",
    "KafkaChangelogBatchReader",
    "KafkaChangelogDataSource",
    "TaskPartition",
    "input_partitions",
    "register_source",
    "session_parallelism",
]
