"""The driver of a stateful query: the ``foreachBatch`` function that plans each
micro-batch, runs one Spark task per subtask and commits the checkpoint.

Checkpoint ids are the application's own (latest + 1 per committed batch); which
checkpoint a batch commits and starts from is :mod:`spark_integration.streaming.batch_identity`
(a re-run of a committed batch, a fresh ``checkpointLocation``). The driver adds each
row's state key (``kafka_changelog.keys``, computed by Spark SQL from the key columns),
its key group ``pmod(hash(key), max_parallelism)`` and its subtask, assigns each subtask
the base checkpoint's handles overlapping its key groups, and runs one Spark task per
subtask, in parallel (``partition_by_subtask`` then ``mapInPandas``; see
:mod:`spark_integration.streaming.task`). It commits the checkpoint only when every
subtask succeeded (and, with a ``KafkaOutputSink``, committed its outputs).

A batch that Spark runs again after a crash starts from the checkpoint before it.
With a ``KafkaOutputSink``, whatever its subtasks committed before the crash is
reused, not computed again, and a batch whose checkpoint completed is not run at
all: every output is written once. With a sink function the batch is computed again
from the same base (the state comes out the same and is not committed twice) and
its outputs are given again (make the function idempotent per batch id, as with any
``foreachBatch`` sink).

Over 600 lines: the batch's steps (plan, input check, placement, tasks, commit) read in
order here; the next cut is the subtask placement (``_placement``, ``_spread_placement``)
into ``subtask_hosts``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pandas as pd

from kafka_changelog import key_group_range_for_operator
from kafka_changelog.errors import ChangelogError
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.checkpoints.input_progress import InputProgress
from kafka_changelog.state.checkpoints.subtask_commit import SubtaskCommit
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.host.subtask_backend import StateSource
from kafka_changelog.state.schema.descriptors import StateDescriptor

from ..checkpoint_properties import QUERY_ID, STATE_PROPERTY_PREFIX
from ..keys import key_columns_of, key_sql
from ..sessions.connect import connect_query_id, is_connect
from ..sessions.spark_versions import (
    SparkFeature,
    missing,
    require_supported_spark,
    supports,
)
from .batch_identity import BatchPlan, plan_batch
from .batch_input import batch_input
from .batch_time import (
    batch_context,
    check_event_time_column,
    next_watermark,
    time_properties,
    wall_clock_ms,
)
from .columns import (
    HANDLE_COLUMN,
    KEY_COLUMN,
    KEY_GROUP_COLUMN,
    MARKER_COLUMN,
    METRICS_COLUMN,
    PARTITION_COLUMN,
    RESULT_SCHEMA,
    SUBTASK_COLUMN,
)
from .config import StreamingStateConfig
from .driver_hold import hold_application
from .events import BatchEvent, BatchListener, TaskListener
from .initial_state import (
    InitialStateFunction,
    check_applicable,
    initial_properties,
    initial_state_of,
    marked_rows,
)
from .input_check import (
    BatchWhere,
    InputCheck,
    InputPolicy,
    check_input,
    check_rerun,
    skip_condition,
    skip_files_condition,
)
from .kafka_sink import KafkaOutputSink
from .key_state import BatchContext, EventTime
from .metrics import BatchReport, SubtaskMetrics, log_batch
from .query_stop import stops_cleanly
from .state_declarations import StateDeclarations, registered_properties
from .subtask_hosts import SubtaskHosts, assign, inverse, placement_hosts
from .subtask_partitioning import (
    PLACEMENT_SETTINGS,
    executor_ids,
    partition_by_subtask,
    placement_possible,
    subtask_markers,
    subtask_placement,
)
from .task import StatefulFunction, SubtaskTask, TaskCommit
from .task_time import TaskTime, TimerFunction
from .ticks import TICK_COLUMN, without_ticks
from .vectorized import VectorizedFunction, VectorizedTimerFunction
from .worker_release import release_workers
from .worker_resources import WorkerResources

logger = logging.getLogger(__name__)

#: Seconds ``close()`` waits for a batch still running in the driver (its query was
#: stopped while the batch's Python side went on) before it releases the application.
IN_FLIGHT_WAIT_S = 60.0


class StatefulProcessor:
    """The ``foreachBatch`` function of a stateful query.

    ``fn(key, rows, state)`` is called once per key present in a micro-batch, with the
    key's rows (ordered by ``order_by``) and ``state(descriptor)`` to reach its state;
    it returns the output rows (schema ``output_schema``, a DDL string). The key is
    ``key_column``'s value, or a tuple when ``key_column`` names several columns; a
    row with a null key column fails the batch with
    :class:`~kafka_changelog.keys.NullKeyError` (filter or fill nulls first).

    ``sink`` is either a :class:`KafkaOutputSink` (each task commits its outputs with
    its part of the checkpoint in a Kafka transaction of its own: exactly once, and no
    output row goes through the driver) or a function ``sink(df, batch_id)`` called
    with every batch's outputs as a DataFrame after the checkpoint committed (the
    tasks' results are kept by Spark, so handing them over runs no stateful task again;
    at least once: a batch Spark runs again after a crash gives its outputs again). A
    sink function with a ``checkpoint_id`` parameter is also given the batch's checkpoint
    id, keyword: unique per application and the same when a batch runs again, unlike
    Spark's batch id, which starts at 0 again with a new ``checkpointLocation``; make the
    sink idempotent per checkpoint id. ``listener`` hears the batch's progress on the driver
    (:data:`BatchListener`), ``task_listener`` each task's (:data:`TaskListener`).

    With ``vectorized=True``, ``fn(rows, state)`` is called once per subtask per batch
    instead, with all of the subtask's rows (sorted by key, then ``order_by``) and a
    :class:`~spark_integration.streaming.vectorized.BatchState` that reads and writes the
    state of many keys per call (see :mod:`spark_integration.streaming.vectorized`).

    Time: ``state.context`` is the batch's :class:`BatchContext` (its processing time is
    fixed for the batch and recorded with its checkpoint: TTL'd state and processing-time
    timers follow it, and a re-run sees the same instant). ``state.timers`` registers the
    key's timers; after the batch's rows, ``on_timer(key, timer, state)`` is called for
    each due timer (processing time, then event time) and returns output rows like
    ``fn``. ``event_time`` (:class:`EventTime`) declares the event-time column and the
    watermark delay: event-time timers fire once the watermark (from the batches before)
    reaches them, and rows before the watermark follow ``EventTime.late_rows``.
    ``clock`` gives new batches their processing time (default: the wall clock; a test
    may drive time by hand).

    Initial state: ``initial_state`` (a DataFrame keyed like the query, or a function of
    the batch's ``SparkSession`` returning one) is given to ``on_initial_state(key, rows,
    state)`` (vectorised: ``(rows, state)``) once per key, before the rows of the first
    batch of an application without checkpoint: exactly once, at any parallelism; an
    application whose state did not start from it is refused (see initial_state.py).

    Versions: ``states`` declares state descriptors up front: the driver checks each
    against the registration the application's latest checkpoint recorded before any
    task runs (a change that cannot read the old values raises
    :class:`~kafka_changelog.state.errors.StateSchemaError`), and every task registers
    them before the function runs. ``dropped_states`` names states whose entries every
    task deletes (the next materialization writes the key groups without them). See
    docs/schema-evolution.md.

    :attr:`reports` keeps the :class:`BatchReport` of the last ``reports_kept`` batches
    of this driver (oldest first; a query that runs for months keeps a bounded window);
    :attr:`batches_run` counts them all. ``on_report(report)`` is called with each report
    as the batch ends (e.g. :meth:`~.prometheus.PrometheusStateMetrics.recorder`); an
    exception it raises is logged, never fails the batch (which has committed).

    Refused on a PySpark the library does not support
    (:class:`~spark_integration.sessions.spark_versions.UnsupportedSparkVersionError`).
    """

    def __init__(
        self,
        config: StreamingStateConfig,
        fn: StatefulFunction | VectorizedFunction,
        key_column: str | Sequence[str],
        output_schema: str,
        sink: Callable[..., None] | KafkaOutputSink | None = None,
        order_by: Iterable[str] = (),
        listener: BatchListener | None = None,
        task_listener: TaskListener | None = None,
        vectorized: bool = False,
        on_timer: TimerFunction | VectorizedTimerFunction | None = None,
        event_time: EventTime | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        reports_kept: int = 1000,
        states: Sequence[StateDescriptor] = (),
        dropped_states: Sequence[str] = (),
        on_report: Callable[[BatchReport], None] | None = None,
        initial_state: Any = None,
        on_initial_state: InitialStateFunction | None = None,
    ) -> None:
        require_supported_spark()
        if reports_kept < 1:
            raise ValueError(f"reports_kept must be at least 1, got {reports_kept}")
        self.config = config
        #: Where new batches take their processing time from (ms since the epoch).
        self.clock = clock
        self.fn = fn
        #: The states declared up front and those dropped (see state_declarations).
        self.declarations = StateDeclarations.of(states, dropped_states)
        #: The state a new application starts from (see initial_state.py), or None.
        self.initial = initial_state_of(initial_state, on_initial_state)
        self.vectorized = vectorized
        self.on_timer = on_timer
        self.event_time = event_time
        self.key_columns = [key_column] if isinstance(key_column, str) else list(key_column)
        if not self.key_columns:
            raise ValueError("key_column must name at least one column")
        self.output_schema = output_schema
        self.sink = sink
        self.order_by = tuple(order_by)
        self.listener = listener
        self.task_listener = task_listener
        self.on_report = on_report
        #: The reports of the last ``reports_kept`` batches, oldest first.
        self.reports: deque[BatchReport] = deque(maxlen=reports_kept)
        #: Batches this processor ran (its reports beyond the window included).
        self.batches_run = 0
        self._struct: Any = None
        #: The subtask placement: (parallelism, cached DataFrame, the executors the
        #: scheduler knew when it was made: None where unknown).
        self._placement_of: tuple[int, Any, frozenset[str] | None] | None = None
        #: The JVM session the placement's DataFrame was made in (classic Spark only).
        self._placement_session: Any = None
        #: Which subtask each partition of the placement runs (None: in order), and the
        #: hosts each subtask ran on (from the tasks' reports).
        self._partition_subtasks: tuple[int, ...] | None = None
        self._subtask_hosts: SubtaskHosts | None = None
        #: Whether "the input cannot be read here" was logged (once per processor).
        self._input_unknown_logged = False
        self._placement_missing_logged = False
        #: Batches running in this process now, and whether close() is under way.
        self._calls = threading.Condition()
        self._running_calls = 0
        self._closing = False

    def _emit(self, event: BatchEvent, batch_id: int) -> None:
        if self.listener is not None:
            self.listener(event, batch_id)

    def close(self) -> None:
        """Stop everything this processor's application runs in this Spark application,
        and drop its subtask placement. Call it once the query has stopped (the processor
        works again afterwards, reopening what it needs).

        Guarantees on return (docs/streaming.md, "Stopping a query"): in the driver process,
        the application's Kafka producers, consumers and admin clients are closed, its
        driver lease is released and its heartbeat thread ended, its garbage collection
        of subsumed checkpoints ended (within ``COLLECTION_WAIT_S``), its snapshot sweep
        ended (or, still reading after ``SWEEP_WAIT_S``, deletes nothing); in Spark's
        Python workers that :func:`~spark_integration.streaming.worker_release.
        release_workers` reaches (every idle one in local mode), the same for their
        clients, their background materializations written or stopped with their
        chunks tombstoned, and their cached backends closed; the operator's host stores
        nobody holds are removed (``state_backend="rocksdb"``). Bounded by the
        constants of :meth:`WorkerResources.release` (about three minutes at worst,
        seconds when nothing runs in the background).
        """
        # A batch whose query was stopped may still run here (Spark stopped waiting for
        # it): it would take the application again after the release.
        with self._calls:
            self._closing = True
            if not self._calls.wait_for(lambda: self._running_calls == 0, IN_FLIGHT_WAIT_S):
                logger.warning("application %s: a batch still runs in the driver after %.0f "
                               "s; closing anyway", self.config.application, IN_FLIGHT_WAIT_S)
        try:
            self._drop_placement()
            release_workers(self.config)
            WorkerResources.release(self.config)
        finally:
            with self._calls:
                self._closing = False

    def _drop_placement(self) -> None:
        kept, self._placement_of = self._placement_of, None
        self._placement_session = None
        if kept is not None:
            try:
                kept[1].unpersist()
            except Exception as exc:  # a stopped session has nothing cached any more
                logger.debug("dropping the subtask placement: %s", exc)

    def _placement(self, spark: Any, parallelism: int, config: StreamingStateConfig
                   ) -> tuple[Any, tuple[int, ...] | None]:
        """The subtask placement at ``parallelism`` (see
        :mod:`spark_integration.streaming.subtask_partitioning`) as a DataFrame of ``spark`` (each
        micro-batch has a session of its own; the cache is the application's, so every
        batch's placement reads the same cached partitions), and which subtask each of
        its partitions runs (None: partition i runs subtask i). The placement of another
        parallelism is dropped, and so is the placement when executors joined since it
        was made (an executor the scheduler did not know then): the new one is
        computed first, and each partition gets a subtask that ran on its host before
        (:mod:`spark_integration.streaming.subtask_hosts`)."""
        executors = executor_ids(spark)
        if self._placement_of is not None:
            made_at, _, known = self._placement_of
            joined = (executors - known if executors is not None and known is not None
                      else frozenset())
            if made_at != parallelism:
                self._drop_placement()
            elif joined:
                # Executors joined (a host back, a worker added; maybe while others
                # left): place the subtasks anew, over every executor, rather than keep
                # them where they were.
                logger.info("executor(s) %s joined (%d now): subtasks are placed anew",
                            ", ".join(sorted(joined)), len(executors or ()))
                self._drop_placement()
        # Executors only left: the placement stays (the lost hosts' partitions are
        # computed again elsewhere), and so do the executors it was made on.
        known = self._placement_of[2] if self._placement_of is not None else executors
        if self._subtask_hosts is None or self._subtask_hosts.parallelism != parallelism:
            self._subtask_hosts = SubtaskHosts(parallelism)
        placement = self._kept_placement(spark)
        if placement is None:
            placement = subtask_placement(spark, SUBTASK_COLUMN, MARKER_COLUMN, parallelism)
            self._placement_session = None if is_connect(spark) else spark._jsparkSession
        if self._placement_of is None:
            self._partition_subtasks = None
            # On a cluster (two executors at least), the placement is computed in a job
            # of its own: its small tasks spread over the idle executors (in the batch's
            # job they would follow its input), and they say where each partition is,
            # for the subtasks that ran there before.
            if executors is not None and len(executors) > 1:
                placement, hosts = _spread_placement(spark, placement, parallelism, config,
                                                     len(executors))
                if hosts is not None and self._subtask_hosts.last_ran:
                    self._partition_subtasks = assign(hosts, self._subtask_hosts)
                if hosts is not None:
                    logger.info("subtask placement: partition -> (subtask, host) %s", {
                        q: (self._partition_subtasks[q] if self._partition_subtasks
                            else q, hosts.get(q)) for q in range(parallelism)})
        self._placement_of = (parallelism, placement, known)
        return placement, self._partition_subtasks

    def _kept_placement(self, spark: Any) -> Any:
        """The kept placement's DataFrame when it was made in ``spark``'s JVM session (the
        batches of a query run share one; each has a Python session of its own), else
        None. Reusing it spares every batch the round trips to the JVM of building the
        same plan again."""
        if self._placement_of is None or self._placement_session is None:
            return None
        try:
            same = bool(spark._jsparkSession.equals(self._placement_session))
        except Exception:  # no JVM session (Spark Connect): made anew each batch
            return None
        return self._placement_of[1] if same else None

    def _declared_properties(self, coordinator: CheckpointCoordinator, base: int | None
                             ) -> dict[str, str]:
        """The declared states checked against checkpoint ``base``'s registrations (before
        any task runs), as the properties the batch's checkpoint records."""
        recorded = (coordinator.checkpoints.get(self.config.application, base).properties
                    if base is not None else {})
        if not self.declarations:
            return {k: v for k, v in recorded.items() if k.startswith(STATE_PROPERTY_PREFIX)}
        return self.declarations.checked_properties(
            self.config.application, self.config.operator_id, recorded)

    def _check_input(self, coordinator: CheckpointCoordinator, plan: BatchPlan,
                     batch_df: Any, query_id: str, batch_id: int, ticks: bool) -> InputCheck:
        """The batch's input checked against its base checkpoint's (raises
        :class:`InputOffsetsError` before any task runs; see input_check.py)."""
        config = self.config
        found = batch_input(batch_df, query_id, batch_id)
        if not found.known and not self._input_unknown_logged:
            self._input_unknown_logged = True
            logger.info("application %s: the input of Spark query %s cannot be read here "
                        "(Spark Connect?): its offsets are neither checked nor recorded",
                        config.application, query_id or "(none)")
        store = coordinator.checkpoints
        if not plan.commit:  # a re-run: its input must be the committed batch's
            committed = store.get(config.application, plan.checkpoint_id)
            check_rerun(BatchWhere(config.application, query_id, batch_id,
                                   plan.checkpoint_id, True), plan.checkpoint_id,
                        _recorded_input(committed), found)
        if plan.base is None:
            return check_input(BatchWhere(config.application, query_id, batch_id, 0, True),
                               InputProgress(), found, InputPolicy())
        base = store.get(config.application, plan.base)
        where = BatchWhere(config.application, query_id, batch_id, plan.base,
                           base.properties.get(QUERY_ID) == query_id, ticks)
        return check_input(where, _recorded_input(base), found, InputPolicy(
            config.skip_applied_input, config.allow_input_gaps,
            config.allow_uncompared_sources))

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect pickles the foreachBatch function: a condition does not pickle.
        state = dict(self.__dict__)
        del state["_calls"]
        state["_placement_session"] = None  # a JVM object
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._calls = threading.Condition()
        self._running_calls = 0
        self._closing = False

    def __enter__(self) -> StatefulProcessor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @stops_cleanly
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        with self._calls:
            if self._closing:
                raise ChangelogError(f"application {self.config.application!r}: batch "
                                     f"{batch_id} started while its processor was closing")
            self._running_calls += 1
        try:
            self._run_batch(batch_df, batch_id)
        finally:
            with self._calls:
                self._running_calls -= 1
                self._calls.notify_all()

    def _run_batch(self, batch_df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.monotonic()
        config = self.config
        self._emit(BatchEvent.BATCH_START, batch_id)
        coordinator = WorkerResources.coordinator(config)
        sink = self.sink
        kafka_sink = sink if isinstance(sink, KafkaOutputSink) else None
        query_id = _query_id(batch_df, config.application)
        hold = hold_application(coordinator, config, query_id, kafka_sink,
                                batch_df.sparkSession)
        ticks = TICK_COLUMN in batch_df.columns
        batch_df = without_ticks(batch_df)
        columns, types = key_columns_of(batch_df.schema, self.key_columns)
        if self.event_time is not None:
            check_event_time_column(batch_df.schema, self.event_time)
        plan = plan_batch(coordinator.checkpoints, config.application, query_id, batch_id,
                          config.operator_id, types)
        # A declared state that cannot read what was written is refused before any task.
        self._declared_properties(coordinator, plan.base)
        base_properties = (coordinator.checkpoints.get(config.application, plan.base).properties
                           if plan.base is not None else {})
        applying = self.initial is not None and check_applicable(
            config.application, plan.base, base_properties)
        # Input the state holds is never applied again, whatever the checkpointLocation.
        check_started = time.monotonic()
        checked = self._check_input(coordinator, plan, batch_df, query_id, batch_id, ticks)
        input_check_s = time.monotonic() - check_started
        if kafka_sink is not None and not plan.commit:
            # The checkpoint and every subtask's outputs are committed: nothing to redo.
            self._report(BatchReport(batch_id, plan.checkpoint_id, plan.base, False, 0,
                                     time.monotonic() - started, kind=plan.kind,
                                     query_id=query_id, input_check_s=input_check_s))
            return
        if checked.skip:
            batch_df = batch_df.where(skip_condition(checked.skip, batch_df.columns))
        if checked.skip_files:
            batch_df = batch_df.where(skip_files_condition(checked.skip_files))
        reused: dict[int, SubtaskCommit] = {}
        if kafka_sink is not None:
            config, reused = self._pending_commits(coordinator, plan, query_id, batch_id)
        if plan.base is None:
            # Before the first checkpoint: keep other applications' GC off what the tasks
            # are about to write (see CheckpointCoordinator.guard_first_writes).
            coordinator.guard_first_writes()
        context = batch_context(coordinator.checkpoints, config.application, plan, batch_id,
                                reused.values(), self.clock)
        p, max_p = config.parallelism, config.max_parallelism
        rows_df = batch_df
        if applying:
            assert self.initial is not None
            # The initial state's rows join the batch's, to the subtasks of their keys.
            rows_df = batch_df.unionByName(
                marked_rows(self.initial.frame(batch_df.sparkSession), columns, types),
                allowMissingColumns=True)
        # One projection (each withColumn is a plan analysed again, round trips each).
        key_group = F.expr(f"pmod(hash({key_sql(columns, types)}), {max_p})")
        keyed = rows_df.select(
            "*", F.expr(key_sql(columns, types)).alias(KEY_COLUMN),
            key_group.alias(KEY_GROUP_COLUMN),
            F.floor(key_group * p / max_p).cast("int").alias(SUBTASK_COLUMN))
        outputs_to_driver = sink is not None and kafka_sink is None
        output_struct = self._output_struct(batch_df)
        spark = batch_df.sparkSession
        possible = placement_possible(spark)
        if not possible and not self._placement_missing_logged:
            self._placement_missing_logged = True
            logger.info("application %s: subtasks are not kept on the hosts of their stores: %s",
                        config.application, missing(SparkFeature.SUBTASK_PLACEMENT)
                        if not supports(SparkFeature.SUBTASK_PLACEMENT)
                        else f"the session's settings differ from {PLACEMENT_SETTINGS}")
        placement, partition_subtasks = (self._placement(spark, p, config)
                                         if possible else (None, None))
        task = SubtaskTask(
            config, self.fn, columns, self.order_by, plan.base,
            _assigned_handles(coordinator, config, plan.base), plan.checkpoint_id,
            output_struct.fieldNames(), batch_id,
            TaskCommit(kafka_sink, output_struct, hold.floor, query_id,
                       {s: c.to_bytes() for s, c in reused.items()}, hold.holder)
            if kafka_sink is not None else None,
            outputs_to_driver, self.task_listener, vectorized=self.vectorized,
            time=TaskTime(context, self.event_time, self.on_timer, tuple(types)),
            partition_subtasks=partition_subtasks, declarations=self.declarations,
            on_initial_state=self.initial.fn if applying and self.initial is not None else None)

        def run_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            return task.run_partition(batches)

        # The placement's marker rows (two per subtask) keep each subtask's task on the
        # host of its store, and make every subtask's partition exist, so that its task
        # runs even when the batch has no rows (Spark drops the tasks of an empty input):
        # its checkpoint, its due timers and its expired state. They are filtered out
        # after the union, by a condition the optimizer cannot push below it. (A null key
        # hashes like any value, Spark's hash(null) being its seed; the task that gets it
        # refuses it, naming the column.)
        if placement is not None:
            partitioned = partition_by_subtask(
                keyed, SUBTASK_COLUMN, p, placement,
                inverse(partition_subtasks) if partition_subtasks is not None else None)
        else:  # the same rows, shuffled with the batch's: no placement
            markers = subtask_markers(spark, SUBTASK_COLUMN, MARKER_COLUMN, p)
            partitioned = partition_by_subtask(
                keyed.unionByName(markers, allowMissingColumns=True), SUBTASK_COLUMN, p)
        # (spark_partition_id() is not deterministic: the filter stays where it is.)
        unmarked = partitioned.where(
            F.col(MARKER_COLUMN).isNull() | (F.spark_partition_id() < 0)).drop(MARKER_COLUMN)
        result = unmarked.mapInPandas(run_partition, f"{self.output_schema}, {RESULT_SCHEMA}"
                      if outputs_to_driver else RESULT_SCHEMA)
        tasks_started = time.monotonic()
        if outputs_to_driver:
            # The sink gets the outputs as a DataFrame: keep the tasks' results so that
            # handing them over runs no stateful task again.
            result = result.persist()
        handles = result.where(F.col(HANDLE_COLUMN).isNotNull()).select(
            SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN).toPandas()
        task_s = time.monotonic() - tasks_started
        try:
            self._finish(batch_id, plan, query_id, coordinator, config, handles,
                         result, started, task_s, context,
                         {**checked.progress.properties(),
                          **initial_properties(applying, plan.checkpoint_id, base_properties)},
                         input_check_s)
        finally:
            if outputs_to_driver:
                result.unpersist()

    def _finish(self, batch_id: int, plan: BatchPlan, query_id: str,
                coordinator: CheckpointCoordinator, config: StreamingStateConfig,
                handles: pd.DataFrame, result: Any, started: float, task_s: float,
                context: BatchContext, input_record: dict[str, str],
                input_check_s: float) -> None:
        """Commit the checkpoint of the subtasks' ``handles`` (with the batch's processing
        time, the next watermark and the input the state then holds), then call a sink
        function."""
        from pyspark.sql import functions as F

        p = config.parallelism
        if sorted(handles[SUBTASK_COLUMN]) != list(range(p)):
            raise ChangelogError(
                f"batch {batch_id}: expected state handles of subtasks 0..{p - 1}, got "
                f"{sorted(handles[SUBTASK_COLUMN])}")
        subtasks = [SubtaskState.from_bytes(bytes(h)) for h in handles[HANDLE_COLUMN]]
        partitions = {int(s): int(q) for s, q in
                      zip(handles[SUBTASK_COLUMN], handles[PARTITION_COLUMN], strict=True)}
        metrics = {m.subtask: m for m in map(SubtaskMetrics.from_json, handles[METRICS_COLUMN])}
        if self._subtask_hosts is not None and self._subtask_hosts.parallelism == p:
            self._subtask_hosts.record({s: m.host for s, m in metrics.items()})
        restores = {s: m.restore_s for s, m in metrics.items()
                    if m.state_source is StateSource.RESTORED and not m.reused}
        materializations = {
            s.subtask_index: (s.keyed.materialization_id
                              if s.keyed is not None and s.keyed.snapshot is not None else 0)
            for s in subtasks}
        watermark = next_watermark(context, self.event_time, metrics.values())
        self._emit(BatchEvent.BEFORE_COMMIT, batch_id)
        commit_started = time.monotonic()
        if plan.commit:
            declared = self._declared_properties(coordinator, plan.base)
            coordinator.complete(plan.checkpoint_id, subtasks,
                                 properties={**plan.properties(query_id, batch_id),
                                             **time_properties(context, watermark),
                                             **registered_properties(
                                                 [metrics[i].registrations
                                                  for i in sorted(metrics)], declared,
                                                 self.declarations),
                                             **declared, **input_record})
        commit_s = time.monotonic() - commit_started
        self._emit(BatchEvent.AFTER_COMMIT, batch_id)
        sink_started = time.monotonic()
        sink = self.sink
        if sink is not None and not isinstance(sink, KafkaOutputSink):
            outputs = result.where(F.col(HANDLE_COLUMN).isNull()).drop(
                SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN)
            if takes_checkpoint_id(sink):
                sink(outputs, batch_id, checkpoint_id=plan.checkpoint_id)
            else:
                sink(outputs, batch_id)
        self._report(BatchReport(
            batch_id, plan.checkpoint_id, plan.base, plan.commit,
            sum(m.rows_out for m in metrics.values()), time.monotonic() - started, task_s,
            commit_s, time.monotonic() - sink_started, partitions, restores,
            materializations, plan.kind, query_id, metrics,
            sorted(s for s, m in metrics.items() if m.reused), context.processing_time_ms,
            context.watermark_ms, watermark, input_check_s))

    def _report(self, report: BatchReport) -> None:
        self.reports.append(report)
        self.batches_run += 1
        log_batch(report)
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:
                logger.exception("on_report failed for batch %d (checkpoint %d); the batch "
                                 "is committed", report.batch_id, report.checkpoint_id)

    def _output_struct(self, batch_df: Any) -> Any:
        """``output_schema`` as a Spark ``StructType`` (parsed once, by Spark's DDL parser:
        an empty DataFrame of the schema costs a first batch a few tenths of a second
        more; it is made only under Spark Connect, or for a schema that is no struct)."""
        if self._struct is None:
            from pyspark.sql.types import DataType, StructType

            session = batch_df.sparkSession
            parsed = None if is_connect(session) else DataType.fromDDL(self.output_schema)
            self._struct = (parsed if isinstance(parsed, StructType) else
                            session.createDataFrame([], self.output_schema).schema)
        return self._struct

    def _pending_commits(self, coordinator: CheckpointCoordinator, plan: BatchPlan,
                         query_id: str, batch_id: int
                         ) -> tuple[StreamingStateConfig, dict[int, SubtaskCommit]]:
        """What subtasks of this batch committed already (an earlier run of the batch
        crashed before the checkpoint completed; the driver's hold read them): the config
        to run the batch with (the earlier run's parallelism) and those commits."""
        config = self.config
        store = coordinator.checkpoints
        pending = store.subtask_commits(config.application, config.operator_id)
        reused = {s: c for s, c in pending.items()
                  if c.is_for(config.application, config.operator_id, plan.checkpoint_id,
                              batch_id, query_id)}
        stale = sorted(s for s, c in pending.items()
                       if c.checkpoint_id >= plan.checkpoint_id and s not in reused)
        if stale:
            logger.warning(
                "application %s: subtasks %s committed outputs for checkpoint %d in a batch "
                "that never completed and is not this one (batch %d of query %s): those "
                "outputs stay published; the state goes on from checkpoint %s",
                config.application, stale, plan.checkpoint_id, batch_id, query_id or "(none)",
                plan.base)
        if reused:
            parallelism = {c.parallelism for c in reused.values()}
            if len(parallelism) != 1:
                raise ChangelogError(
                    f"batch {batch_id}: the subtasks committed before a crash ran at "
                    f"different parallelisms {sorted(parallelism)}")
            earlier = parallelism.pop()
            logger.warning(
                "application %s: batch %d ran before and subtasks %s committed their outputs "
                "then; reusing them%s", config.application, batch_id, sorted(reused),
                "" if earlier == config.parallelism else
                f" (at their parallelism {earlier}; {config.parallelism} from the next batch)")
            config = dataclasses.replace(config, parallelism=earlier)
        return config, reused


#: Times a new placement is computed at most until its partitions are on as many hosts
#: as there are executors (or partitions), and the pause between two tries.
PLACEMENT_TRIES = 3
PLACEMENT_RETRY_PAUSE_S = 1.0


def _spread_placement(spark: Any, placement: Any, parallelism: int,
                      config: StreamingStateConfig, executors: int
                      ) -> tuple[Any, dict[int, str] | None]:
    """Compute and cache ``placement`` in a job of its own (``subtask_hosts``), again
    (dropped and cached anew) while its partitions are on fewer hosts than they could
    be: Spark puts a task where its input is, and an executor that has just joined may
    hold none of the placement's input yet. Returns the placement and where each of its
    partitions is (None: not known)."""
    wanted = min(parallelism, executors)
    hosts = placement_hosts(placement, config)
    tries = 1
    while hosts is not None and len(set(hosts.values())) < wanted and tries < PLACEMENT_TRIES:
        logger.info("subtask placement on %d host(s) of %d executors: computed again",
                    len(set(hosts.values())), executors)
        placement.unpersist(blocking=True)
        time.sleep(PLACEMENT_RETRY_PAUSE_S)
        placement = subtask_placement(spark, SUBTASK_COLUMN, MARKER_COLUMN, parallelism)
        hosts = placement_hosts(placement, config)
        tries += 1
    return placement, hosts


def _recorded_input(checkpoint: CompletedCheckpoint) -> InputProgress:
    """The input ``checkpoint``'s state holds, as it recorded it."""
    return InputProgress.of(checkpoint.properties,
                            f"checkpoint {checkpoint.checkpoint_id} of application "
                            f"{checkpoint.application!r}")


def _query_id(batch_df: Any, application: str) -> str:
    """The id of the streaming query running this ``foreachBatch`` call ("" if none).

    Spark sets it as a local property of the query's thread, which is the thread
    calling the function (py4j pins Python threads to JVM threads). Under Spark Connect
    there is no such thread here: the query is found among its session's
    (:func:`~spark_integration.sessions.connect.connect_query_id`).
    """
    session = batch_df.sparkSession
    if is_connect(session):
        return connect_query_id(session, application)
    context = session.sparkContext
    return context.getLocalProperty("sql.streaming.queryId") or ""



def takes_checkpoint_id(sink: object) -> bool:
    """Whether a sink function has a ``checkpoint_id`` parameter (it is then given it)."""
    if sink is None or isinstance(sink, KafkaOutputSink):
        return False
    try:
        return "checkpoint_id" in inspect.signature(sink).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a callable without a signature (a builtin)
        return False


def _assigned_handles(coordinator: CheckpointCoordinator, config: StreamingStateConfig,
                      base: int | None) -> dict[int, list[KeyedStateHandle]]:
    """Per subtask of ``config.parallelism``, the keyed state handles of checkpoint ``base``
    that overlap its key groups (read once, on the driver)."""
    if base is None:
        return {}
    checkpoint = coordinator.checkpoints.get(config.application, base)
    checkpoint.require_max_parallelism(config.max_parallelism)
    old = [s.keyed for s in checkpoint.subtasks_of(config.operator_id) if s.keyed is not None]
    assigned = {}
    for subtask in range(config.parallelism):
        key_groups = key_group_range_for_operator(config.max_parallelism, config.parallelism,
                                                  subtask)
        assigned[subtask] = [h for h in old
                             if not h.key_group_range.intersection(key_groups).is_empty]
    return assigned



def stateful_foreach_batch(
    config: StreamingStateConfig,
    fn: StatefulFunction | VectorizedFunction,
    key_column: str | Sequence[str],
    output_schema: str,
    sink: Callable[..., None] | KafkaOutputSink | None = None,
    order_by: Iterable[str] = (),
    listener: BatchListener | None = None,
    task_listener: TaskListener | None = None,
    vectorized: bool = False,
    on_timer: TimerFunction | VectorizedTimerFunction | None = None,
    event_time: EventTime | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    reports_kept: int = 1000,
    states: Sequence[StateDescriptor] = (),
    dropped_states: Sequence[str] = (),
    on_report: Callable[[BatchReport], None] | None = None,
    initial_state: Any = None,
    on_initial_state: InitialStateFunction | None = None,
) -> StatefulProcessor:
    """A function for ``df.writeStream.foreachBatch(...)`` that keeps ``fn``'s state.

    See :class:`StatefulProcessor` (``vectorized=True``: ``fn(rows, state)`` once per
    subtask per batch, see :mod:`spark_integration.streaming.vectorized`). Spark's Python
    workers must run an interpreter with this library installed:
    :func:`spark_integration.sessions.session.local_session` sets that up for local sessions; on a
    cluster, set ``spark.pyspark.python``.
    """
    return StatefulProcessor(config, fn, key_column, output_schema, sink, order_by, listener,
                             task_listener, vectorized, on_timer, event_time, clock,
                             reports_kept, states, dropped_states, on_report, initial_state,
                             on_initial_state)


__all__ = ["StatefulProcessor", "stateful_foreach_batch"]
