"""Exactly-once keyed state for Structured Streaming, through ``foreachBatch``.

Checkpoint ids are the application's own (latest + 1 per committed batch); which
checkpoint a batch commits and starts from is :mod:`spark_integration.batch_identity`
(a re-run of a committed batch, a fresh ``checkpointLocation``). The driver adds
each row's state key (``kafka_changelog.keys``, computed by Spark SQL from the key
columns), its key group ``pmod(hash(key), max_parallelism)`` and its subtask, and
runs one Spark task per subtask, in parallel (``partition_by_subtask`` then
``mapInPandas``; Spark calls the function for empty partitions too, so every subtask
checkpoints). A task gets a keyed state backend for its key-group range at the base
checkpoint (reused from the Python worker's cache when it is exactly there; with
``state_backend="rocksdb"``, the default, reattached from the host's local state
directory when the subtask's store is exactly there, whichever worker left it: see
:mod:`spark_integration.local_state`; else restored from Kafka), calls the user's
function per key in a deterministic order,
persists the changelog, and reports its state handle to the driver. With a
:class:`~spark_integration.kafka_sink.KafkaOutputSink` the task itself commits its
outputs together with its part of the checkpoint in a Kafka transaction of its own
(:mod:`kafka_changelog.kafka.task_commit`), and no output row reaches the driver;
with a sink function the outputs stay in Spark (persisted) and the function gets
them as a DataFrame. The driver commits the checkpoint only when every subtask
succeeded (and committed).

A batch that Spark runs again after a crash starts from the checkpoint before it.
With a ``KafkaOutputSink``, whatever its subtasks committed before the crash is
reused, not computed again, and a batch whose checkpoint completed is not run at
all: every output is written once. With a sink function the batch is computed again
from the same base (the state comes out the same and is not committed twice) and
its outputs are given again (make the function idempotent per batch id, as with any
``foreachBatch`` sink).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from kafka_changelog import KeyGroupRange, key_group_range_for_operator
from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import (
    KafkaCheckpointStore,
    high_watermark,
)
from kafka_changelog.kafka.job_process import spawn_job
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore
from kafka_changelog.kafka.task_commit import (
    TRANSACTION_TIMEOUT_MS,
    SubtaskCommitter,
    check_output_topics,
    fence,
)
from kafka_changelog.kafka.transactional_commit import OutputRecord
from kafka_changelog.keys import NullKeyError
from kafka_changelog.state.backend_config import BackendKind
from kafka_changelog.state.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.coordinator import CheckpointCoordinator
from kafka_changelog.state.descriptors import StateDescriptor
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.local_store import remove_operator_stores
from kafka_changelog.state.materializer import MaterializationConfig
from kafka_changelog.state.restore import restore_backend
from kafka_changelog.state.store_materialization import StartedJob, run_job
from kafka_changelog.state.subtask_commit import SubtaskCommit

from . import local_state
from .batch_identity import BatchPlan, plan_batch
from .kafka_sink import KafkaOutputSink
from .key_rows import KeyRows
from .key_runs import keys_at, run_starts
from .keys import key_columns_of, key_sql
from .local_state import CachedBackend
from .metrics import BatchReport as BatchReport  # public here too
from .metrics import SubtaskMetrics, log_batch
from .output_rows import output_records
from .streaming_config import StreamingStateConfig as StreamingStateConfig  # public here too
from .subtask_partitioning import partition_by_subtask
from .vectorized import VectorizedFunction, call_vectorized

logger = logging.getLogger(__name__)

HANDLE_COLUMN = "__kc_handle"
SUBTASK_COLUMN = "__kc_subtask"
KEY_COLUMN = "__kc_key"
KEY_GROUP_COLUMN = "__kc_key_group"
PARTITION_COLUMN = "__kc_partition"
METRICS_COLUMN = "__kc_metrics"
_INTERNAL_COLUMNS = [SUBTASK_COLUMN, KEY_COLUMN, KEY_GROUP_COLUMN]
#: Seconds ``_Process.release`` waits for a materialization process before stopping it.
JOB_PROCESS_WAIT_S = 120.0

#: The points of a micro-batch a :data:`BatchListener` hears about, in order:
#: ``before_commit`` comes when every subtask has finished (with a ``KafkaOutputSink``:
#: committed its outputs) and the checkpoint record is not yet written.
BATCH_EVENTS = ("batch_start", "before_commit", "after_commit")

#: ``listener(event, batch_id)``: called on the driver at each of :data:`BATCH_EVENTS`.
#: For metrics, logging, and fault injection in tests; an exception it raises fails the
#: batch.
BatchListener = Callable[[str, int], None]

#: The points of a subtask's task a :data:`TaskListener` hears about, in order
#: (``subtask_in_transaction`` and ``subtask_committed`` only with a
#: ``KafkaOutputSink``: its outputs and its part of the checkpoint are produced, the
#: transaction not yet committed; then committed).
TASK_EVENTS = ("subtask_start", "subtask_in_transaction", "subtask_committed")

#: ``task_listener(event, batch_id, subtask)``: called in the Spark task at each of
#: :data:`TASK_EVENTS` (pickled to the executors). An exception it raises fails the task.
TaskListener = Callable[[str, int, int], None]


class StringKey(str):
    """The key of a string key column, as the user's function gets it.

    Keys used to be given as UTF-8 bytes; ``decode()`` still works (it returns the
    string itself) so that functions written that way keep working.
    """

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The key itself (deprecated: keys are strings already)."""
        warnings.warn("stateful functions get string keys as str; drop the .decode()",
                      DeprecationWarning, stacklevel=2)
        return str(self)


class KeyState:
    """What the user's function gets: state objects scoped to the current key."""

    def __init__(self, backend: ChangelogKeyedStateBackend) -> None:
        self._backend = backend

    def __call__(self, descriptor: StateDescriptor) -> Any:
        """The state object (ValueState, ListState, MapState, ...) for ``descriptor``."""
        return self._backend.state(descriptor)


#: ``fn(key, rows, state) -> output rows`` (a DataFrame, a dict for one row, an iterable
#: of dicts, or None). ``key`` is the key column's value (str, int, Decimal, date,
#: Timestamp, bool or bytes), or a tuple of the values of several key columns.
StatefulFunction = Callable[[Any, pd.DataFrame, KeyState], Any]


class _Process:
    """Kafka clients and cached backends of one Python process.

    The driver holds a coordinator (the checkpoint store, commits, GC); a worker holds
    only what its tasks write to: the changelog storage and the snapshot store. Workers
    never open the checkpoint store: the driver hands each task its state handles.
    """

    storages: ClassVar[dict[tuple[str, ...], tuple[KafkaChangelogStorage,
                                                   KafkaSnapshotStore]]] = {}
    coordinators: ClassVar[dict[tuple[str, ...], CheckpointCoordinator]] = {}
    backends: ClassVar[dict[tuple[Any, ...], CachedBackend]] = {}
    committers: ClassVar[dict[tuple[str, ...], SubtaskCommitter]] = {}
    materializer: ClassVar[ThreadPoolExecutor | None] = None
    job_processes: ClassVar[list[subprocess.Popen[bytes]]] = []

    @staticmethod
    def _resource_key(config: StreamingStateConfig) -> tuple[str, ...]:
        return (config.bootstrap_servers, config.application, config.changelog_topic,
                config.snapshot_topic, config.checkpoint_topic)

    @classmethod
    def stores(cls, config: StreamingStateConfig
               ) -> tuple[KafkaChangelogStorage, KafkaSnapshotStore]:
        """The changelog storage and snapshot store of ``config`` in this process."""
        key = cls._resource_key(config)
        if key not in cls.storages:
            cls.storages[key] = (KafkaChangelogStorage(config.changelog()),
                                 KafkaSnapshotStore(config.snapshots()))
        return cls.storages[key]

    @classmethod
    def coordinator(cls, config: StreamingStateConfig) -> CheckpointCoordinator:
        """The driver's coordinator of ``config``'s application."""
        key = cls._resource_key(config)
        if key not in cls.coordinators:
            storage, snapshots = cls.stores(config)
            cls.coordinators[key] = CheckpointCoordinator(
                config.application, KafkaCheckpointStore(config.checkpoints()), snapshots,
                storage, config.max_parallelism)
        return cls.coordinators[key]

    @classmethod
    def task_committer(cls, config: StreamingStateConfig, sink: KafkaOutputSink,
                       subtask: int) -> SubtaskCommitter:
        """The transactional committer of ``subtask``'s outputs in this process."""
        tid = subtask_transactional_id(config, sink, subtask)
        key = (*cls._resource_key(config), tid)
        if key not in cls.committers:
            cls.committers[key] = SubtaskCommitter(config.checkpoints(), tid,
                                                   sink.producer_config)
        return cls.committers[key]

    @classmethod
    def drop_committer(cls, config: StreamingStateConfig, sink: KafkaOutputSink,
                       subtask: int) -> None:
        """Close ``subtask``'s committer in this process (a failed task: start afresh)."""
        key = (*cls._resource_key(config), subtask_transactional_id(config, sink, subtask))
        committer = cls.committers.pop(key, None)
        if committer is not None:
            committer.close()

    @classmethod
    def materialize(cls, config: StreamingStateConfig, started: StartedJob) -> None:
        """Write a background materialization (the task that started it has returned):
        in a process of its own at ``config.materialization_nice``, else (None, or no
        process could be started) on this process's materialization thread, one at a
        time."""
        if config.materialization_nice is not None:
            cls.job_processes = [p for p in cls.job_processes if p.poll() is None]
            try:
                cls.job_processes.append(spawn_job(started, config.snapshots(),
                                                   config.materialization_nice))
                return
            except OSError as exc:
                logger.warning("no process for materialization %d (%s): writing it on a "
                               "thread of this worker", started.job.materialization_id, exc)
        if cls.materializer is None:
            cls.materializer = ThreadPoolExecutor(
                1, thread_name_prefix="kafka-changelog-store-materialization")
        _, snapshots = cls.stores(config)
        cls.materializer.submit(run_job, started, snapshots)

    @classmethod
    def release(cls, config: StreamingStateConfig) -> None:
        """Close this process's backends and Kafka clients of ``config``'s application, and
        delete the operator's local state stores on this host (those nobody holds), once
        this process's background materializations are written."""
        if cls.materializer is not None:
            cls.materializer.shutdown(wait=True)
            cls.materializer = None
        for process in cls.job_processes:
            try:
                process.wait(JOB_PROCESS_WAIT_S)
            except subprocess.TimeoutExpired:
                logger.warning("materialization process %d still running after %.0f s: "
                               "stopped (its key groups are written by a later one)",
                               process.pid, JOB_PROCESS_WAIT_S)
                process.kill()
                process.wait()
        cls.job_processes = []
        for key in [k for k in cls.committers if k[:-1] == cls._resource_key(config)]:
            cls.committers.pop(key).close()
        for key in [k for k in cls.backends if k[:2] == (config.bootstrap_servers,
                                                         config.application)]:
            cls.backends.pop(key).backend.close()
        if config.state_backend == BackendKind.ROCKSDB:
            remove_operator_stores(config.local_state_root(), config.application,
                                   config.operator_id)
        coordinator = cls.coordinators.pop(cls._resource_key(config), None)
        if coordinator is not None:
            coordinator.checkpoints.close()
        stores = cls.storages.pop(cls._resource_key(config), None)
        if stores is not None:
            storage, snapshots = stores
            snapshots.close()
            storage.close()


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
    at least once: a batch Spark runs again after a crash gives its outputs again; make
    it idempotent per batch id). ``listener`` hears the batch's progress on the driver
    (:data:`BatchListener`), ``task_listener`` each task's (:data:`TaskListener`).

    With ``vectorized=True``, ``fn(rows, state)`` is called once per subtask per batch
    instead, with all of the subtask's rows (sorted by key, then ``order_by``) and a
    :class:`~spark_integration.vectorized.BatchState` that reads and writes the state of
    many keys per call (see :mod:`spark_integration.vectorized`).
    """

    def __init__(
        self,
        config: StreamingStateConfig,
        fn: StatefulFunction | VectorizedFunction,
        key_column: str | Sequence[str],
        output_schema: str,
        sink: Callable[[Any, int], None] | KafkaOutputSink | None = None,
        order_by: Iterable[str] = (),
        listener: BatchListener | None = None,
        task_listener: TaskListener | None = None,
        vectorized: bool = False,
    ) -> None:
        self.config = config
        self.fn = fn
        self.vectorized = vectorized
        self.key_columns = [key_column] if isinstance(key_column, str) else list(key_column)
        if not self.key_columns:
            raise ValueError("key_column must name at least one column")
        self.output_schema = output_schema
        self.sink = sink
        self.order_by = tuple(order_by)
        self.listener = listener
        self.task_listener = task_listener
        self.reports: list[BatchReport] = []
        self._struct: Any = None
        #: Whether this processor fenced its subtasks' transactional ids (once per process).
        self._fenced = False

    def _emit(self, event: str, batch_id: int) -> None:
        if self.listener is not None:
            self.listener(event, batch_id)

    def close(self) -> None:
        """Close the Kafka clients this processor opened in the driver process.

        Call it when the query has stopped (the processor works again afterwards,
        reopening them). Spark's Python workers close theirs when Spark stops them.
        """
        _Process.release(self.config)

    def __enter__(self) -> StatefulProcessor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.monotonic()
        config = self.config
        self._emit("batch_start", batch_id)
        coordinator = _Process.coordinator(config)
        sink = self.sink
        kafka_sink = sink if isinstance(sink, KafkaOutputSink) else None
        query_id = _query_id(batch_df)
        columns, types = key_columns_of(batch_df.schema, self.key_columns)
        plan = plan_batch(coordinator.checkpoints, config.application, query_id, batch_id,
                          config.operator_id, types)
        if plan.kind == "new-query":
            logger.warning(
                "application %s: batch %d of Spark query %s follows checkpoint %d of another "
                "query (a new checkpointLocation?): the state carries over from it",
                config.application, batch_id, query_id or "(none)", plan.base)
        if kafka_sink is not None and not plan.commit:
            # The checkpoint and every subtask's outputs are committed: nothing to redo.
            self._report(BatchReport(batch_id, plan.checkpoint_id, plan.base, False, 0,
                                     time.monotonic() - started, kind=plan.kind,
                                     query_id=query_id))
            return
        reused: dict[int, SubtaskCommit] = {}
        floor = 0
        if kafka_sink is not None:
            config, reused, floor = self._pending_commits(coordinator, kafka_sink, plan,
                                                          query_id, batch_id)
        if plan.base is None:
            # Before the first checkpoint: keep other applications' GC off what the tasks
            # are about to write (see CheckpointCoordinator.guard_first_writes).
            coordinator.guard_first_writes()
        p, max_p = config.parallelism, config.max_parallelism
        keyed = (
            batch_df
            .withColumn(KEY_COLUMN, F.expr(key_sql(columns, types)))
            .withColumn(KEY_GROUP_COLUMN, F.expr(f"pmod(hash({KEY_COLUMN}), {max_p})"))
            .withColumn(SUBTASK_COLUMN,
                        F.floor(F.col(KEY_GROUP_COLUMN) * p / max_p).cast("int"))
        )
        outputs_to_driver = sink is not None and kafka_sink is None
        output_struct = self._output_struct(batch_df)
        task = _SubtaskTask(
            config, self.fn, columns, self.order_by, plan.base,
            _assigned_handles(coordinator, config, plan.base), plan.checkpoint_id,
            output_struct.fieldNames(), batch_id,
            _TaskCommit(kafka_sink, output_struct, floor, query_id,
                        {s: c.to_bytes() for s, c in reused.items()})
            if kafka_sink is not None else None,
            outputs_to_driver, self.task_listener, vectorized=self.vectorized)

        def run_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            return task.run_partition(batches)

        internal = (f"{SUBTASK_COLUMN} int, {PARTITION_COLUMN} int, {METRICS_COLUMN} string, "
                    f"{HANDLE_COLUMN} binary")
        result = partition_by_subtask(
            # A null key hashes like any value (Spark's hash(null) is its seed); the task
            # that gets it refuses it, naming the column.
            keyed, SUBTASK_COLUMN, p,
        ).mapInPandas(run_partition, f"{self.output_schema}, {internal}"
                      if outputs_to_driver else internal)
        tasks_started = time.monotonic()
        if outputs_to_driver:
            # The sink gets the outputs as a DataFrame: keep the tasks' results so that
            # handing them over runs no stateful task again.
            result = result.persist()
        handles = result.where(F.col(HANDLE_COLUMN).isNotNull()).select(
            SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN).toPandas()
        task_s = time.monotonic() - tasks_started
        try:
            self._finish(batch_df, batch_id, plan, query_id, coordinator, config, handles,
                         result, started, task_s)
        finally:
            if outputs_to_driver:
                result.unpersist()

    def _finish(self, batch_df: Any, batch_id: int, plan: BatchPlan, query_id: str,
                coordinator: CheckpointCoordinator, config: StreamingStateConfig,
                handles: pd.DataFrame, result: Any, started: float, task_s: float) -> None:
        """Commit the checkpoint of the subtasks' ``handles``, then call a sink function."""
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
        restores = {s: m.restore_s for s, m in metrics.items()
                    if m.state_source == "restored" and not m.reused}
        materializations = {
            s.subtask_index: (s.keyed.materialization_id
                              if s.keyed is not None and s.keyed.snapshot is not None else 0)
            for s in subtasks}
        self._emit("before_commit", batch_id)
        commit_started = time.monotonic()
        if plan.commit:
            coordinator.complete(plan.checkpoint_id, subtasks,
                                 properties=plan.properties(query_id, batch_id))
        commit_s = time.monotonic() - commit_started
        self._emit("after_commit", batch_id)
        sink_started = time.monotonic()
        sink = self.sink
        if sink is not None and not isinstance(sink, KafkaOutputSink):
            outputs = result.where(F.col(HANDLE_COLUMN).isNull()).drop(
                SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN)
            sink(outputs, batch_id)
        self._report(BatchReport(
            batch_id, plan.checkpoint_id, plan.base, plan.commit,
            sum(m.rows_out for m in metrics.values()), time.monotonic() - started, task_s,
            commit_s, time.monotonic() - sink_started, partitions, restores,
            materializations, plan.kind, query_id, metrics,
            sorted(s for s, m in metrics.items() if m.reused)))

    def _report(self, report: BatchReport) -> None:
        self.reports.append(report)
        log_batch(report)

    def _output_struct(self, batch_df: Any) -> Any:
        """``output_schema`` as a Spark ``StructType`` (parsed once, by Spark)."""
        if self._struct is None:
            self._struct = batch_df.sparkSession.createDataFrame(
                [], self.output_schema).schema
        return self._struct

    def _pending_commits(self, coordinator: CheckpointCoordinator, sink: KafkaOutputSink,
                         plan: BatchPlan, query_id: str, batch_id: int
                         ) -> tuple[StreamingStateConfig, dict[int, SubtaskCommit], int]:
        """What subtasks of this batch committed already (an earlier run of the batch
        crashed before the checkpoint completed): the config to run the batch with (the
        earlier run's parallelism), those commits, and the checkpoint topic's end offset
        (where the tasks look for commits of their own earlier attempts)."""
        config = self.config
        store = coordinator.checkpoints
        assert isinstance(store, KafkaCheckpointStore)
        if not self._fenced:
            # A crashed driver may have left tasks behind: fence every subtask's id (of
            # this and of the last committed parallelism) before looking.
            last = store.latest(config.application)
            old = {s.parallelism for s in last.subtasks_of(config.operator_id)} if last else set()
            count = max([config.parallelism, *old,
                         *(c.parallelism for c in store.subtask_commits(
                             config.application, config.operator_id).values())])
            check_output_topics(config.checkpoints(), [sink.topic])
            fence(config.checkpoints(), [subtask_transactional_id(config, sink, s)
                                         for s in range(count)], sink.producer_config)
            self._fenced = True
        store.catch_up(TRANSACTION_TIMEOUT_MS / 1000 + store.config.request_timeout_s)
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
        return config, reused, high_watermark(config.checkpoints())


def _query_id(batch_df: Any) -> str:
    """The id of the streaming query running this ``foreachBatch`` call ("" if none).

    Spark sets it as a local property of the query's thread, which is the thread
    calling the function (py4j pins Python threads to JVM threads).
    """
    context = batch_df.sparkSession.sparkContext
    return context.getLocalProperty("sql.streaming.queryId") or ""


def subtask_transactional_id(config: StreamingStateConfig, sink: KafkaOutputSink,
                             subtask: int) -> str:
    """The transactional id subtask ``subtask`` commits its outputs with."""
    return f"{sink.transactional_id_for(config.application, config.operator_id)}-{subtask}"


@dataclass(frozen=True)
class _TaskCommit:
    """How the tasks of a batch commit their outputs to a ``KafkaOutputSink``."""

    sink: KafkaOutputSink
    #: The output schema (Spark ``StructType``): rows are cast to it before they are written.
    struct: Any
    #: The checkpoint topic's end offset when the batch started: an earlier attempt's
    #: commit of this batch lies after it.
    floor: int
    query_id: str
    #: ``SubtaskCommit`` bytes of subtasks an earlier run of the batch committed.
    reused: dict[int, bytes]


class _SubtaskTask:
    """What a Spark task runs for its subtask's rows (pickled to workers)."""

    def __init__(self, config: StreamingStateConfig,
                 fn: StatefulFunction | VectorizedFunction,
                 key_columns: list[str], order_by: tuple[str, ...], base: int | None,
                 handles: dict[int, list[KeyedStateHandle]], checkpoint_id: int,
                 output_columns: Sequence[str], batch_id: int,
                 commit: _TaskCommit | None = None,
                 outputs_to_driver: bool = True, listener: TaskListener | None = None,
                 vectorized: bool = False) -> None:
        self.config = config
        self.fn = fn
        self.vectorized = vectorized
        self.key_columns = key_columns
        self.order_by = order_by
        self.base = base
        # Per subtask, the base checkpoint's handles overlapping its key groups (assigned
        # by the driver, as Flink's JobManager assigns state).
        self.handles = handles
        self.checkpoint_id = checkpoint_id
        self.batch_id = batch_id
        # The output schema's column names (as Spark parsed the DDL on the driver): every
        # output row has exactly these.
        self.output_columns = list(output_columns)
        self._output_column_set = frozenset(output_columns)
        self.commit = commit
        self.outputs_to_driver = outputs_to_driver
        self.listener = listener

    def _columns(self) -> list[str]:
        internal = [SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN]
        return [*self.output_columns, *internal] if self.outputs_to_driver else internal

    def run_partition(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """Run the subtask of one Spark partition: partition ``i`` is subtask ``i``
        (``partition_by_subtask``), and Spark calls this for empty partitions too."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise ChangelogError("the stateful task runs outside a Spark task")
        subtask = context.partitionId()
        frames = list(batches)
        rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (
            frames[0] if frames else None)
        if rows is not None and len(rows):
            wrong = rows[rows[SUBTASK_COLUMN] != subtask]
            if len(wrong):
                raise ChangelogError(
                    f"batch {self.batch_id}: Spark partition {subtask} holds rows of subtask "
                    f"{int(wrong[SUBTASK_COLUMN].iloc[0])}; every partition must hold "
                    "exactly its own subtask's rows")
        frame = self(rows, subtask)
        frame[PARTITION_COLUMN] = subtask
        yield frame[self._columns()]

    def _emit(self, event: str, subtask: int) -> None:
        if self.listener is not None:
            self.listener(event, self.batch_id, subtask)

    def __call__(self, rows: pd.DataFrame | None, subtask: int) -> pd.DataFrame:
        """One subtask's rows (None or empty: no input) -> its state handle row (and its
        outputs, when they go to the driver)."""
        self._emit("subtask_start", subtask)
        commit = self.commit
        committer: SubtaskCommitter | None = None
        if commit is not None:
            earlier = commit.reused.get(subtask)
            if earlier is not None:
                return self._handle_frame(subtask, SubtaskCommit.from_bytes(earlier))
            committer = _Process.task_committer(self.config, commit.sink, subtask)
            try:
                # After this task's producer fenced every earlier attempt's.
                found = committer.find(self._commit_key(subtask), commit.floor, self._same)
            except BaseException:
                _Process.drop_committer(self.config, commit.sink, subtask)
                raise
            if found is not None:
                return self._handle_frame(subtask, found)
        attached: local_state.LocalAttachment | None = None
        if self.config.state_backend == BackendKind.ROCKSDB:
            storage, snapshots = _Process.stores(self.config)
            attached = local_state.attach(
                self.config, subtask, self.base, self.handles.get(subtask, []),
                _Process.backends.pop(self._cache_key(subtask), None), storage, snapshots,
                self._materialization())
            backend, attach_s, source = attached.backend, attached.seconds, attached.source
        else:
            backend, attach_s, source = self._backend(subtask)
        try:
            outputs, metrics, handle = self._run(backend, rows, subtask, source, attach_s)
            metrics = dataclasses.replace(metrics, rows_out=len(outputs))
            encoded = SubtaskState(self.config.operator_id, subtask, self.config.parallelism,
                                   handle, None).to_bytes()
            if attached is not None:
                metrics = self._materialize_in_background(attached, metrics, encoded)
            holding = None
            if committer is not None and commit is not None:
                holding, ours = committer.commit(
                    self._output_records(outputs, commit),
                    self._subtask_commit(subtask, encoded, metrics, len(outputs), commit),
                    commit.floor, lambda: self._emit("subtask_in_transaction", subtask))
                if not ours:
                    raise _SupersededError
        except _SupersededError:
            # Another attempt committed this subtask first: its results stand; this
            # backend is at no checkpoint.
            self._discard(backend, attached, subtask)
            assert holding is not None
            return self._handle_frame(subtask, holding)
        except BaseException:
            # A failed task's backend is at no checkpoint: never kept (a local store is
            # left without manifest, so the next task restores it).
            self._discard(backend, attached, subtask)
            if commit is not None:
                _Process.drop_committer(self.config, commit.sink, subtask)
            raise
        if committer is not None:
            self._emit("subtask_committed", subtask)
        if attached is None:
            _Process.backends[self._cache_key(subtask)] = CachedBackend(backend,
                                                                        self.checkpoint_id)
        else:
            kept = local_state.release(attached, self.config, subtask, self.checkpoint_id,
                                       encoded)
            if kept is not None:
                _Process.backends[self._cache_key(subtask)] = kept
            _, snapshots = _Process.stores(self.config)
            # A job process outlives the worker; a thread only a worker Spark reuses.
            local_state.run_started(attached, snapshots,
                                    lambda job: _Process.materialize(self.config, job),
                                    self.config.materialization_nice is not None
                                    or _worker_outlives_task())
        return self._frame(subtask, outputs, encoded, metrics.to_json())

    def _materialize_in_background(self, attached: local_state.LocalAttachment,
                                   metrics: SubtaskMetrics, encoded: bytes) -> SubtaskMetrics:
        """Start a due materialization from a copy of the store (written after this task
        lets the store go); the metrics count it, and those this task applied."""
        started = local_state.materialize_in_background(attached, self.checkpoint_id, encoded,
                                                        self._materialization())
        return dataclasses.replace(
            metrics,
            materializations_started=metrics.materializations_started + int(started),
            materializations_completed=metrics.materializations_completed + attached.applied,
            materialized_bytes=metrics.materialized_bytes + attached.applied_bytes)

    def _discard(self, backend: ChangelogKeyedStateBackend,
                 attached: local_state.LocalAttachment | None, subtask: int) -> None:
        try:
            if attached is not None:
                local_state.abandon(attached)
            else:
                backend.close()
        except Exception as exc:
            logger.warning("closing subtask %d's backend after a failure: %s", subtask, exc)

    def _commit_key(self, subtask: int) -> str:
        from kafka_changelog.state.subtask_commit import subtask_commit_key

        return subtask_commit_key(self.config.application, self.config.operator_id, subtask)

    def _same(self, found: SubtaskCommit) -> bool:
        assert self.commit is not None
        return found.is_for(self.config.application, self.config.operator_id,
                            self.checkpoint_id, self.batch_id, self.commit.query_id)

    def _subtask_commit(self, subtask: int, encoded: bytes, metrics: SubtaskMetrics,
                        rows_out: int, commit: _TaskCommit) -> SubtaskCommit:
        c = self.config
        return SubtaskCommit(c.application, c.operator_id, self.checkpoint_id, subtask,
                             c.parallelism, self.batch_id, commit.query_id,
                             int(time.time() * 1000), rows_out, encoded,
                             dataclasses.replace(metrics, reused=True).to_json())

    def _output_records(self, outputs: list[dict[str, Any]], commit: _TaskCommit
                        ) -> list[OutputRecord]:
        """The outputs as records of the sink, cast to the output schema first (as Spark
        casts what a task returns)."""
        if not outputs:
            return []
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        frame = pd.DataFrame(outputs, columns=self.output_columns)
        table = pa.Table.from_pandas(frame, schema=to_arrow_schema(commit.struct),
                                     preserve_index=False, safe=True)
        return list(commit.sink.records_of(table.to_pylist(), self.batch_id,
                                           self.checkpoint_id))

    def _handle_frame(self, subtask: int, commit: SubtaskCommit) -> pd.DataFrame:
        """The handle row of a subtask whose results an earlier attempt committed."""
        logger.info("batch %d: subtask %d reuses what an earlier attempt committed "
                    "(checkpoint %d)", self.batch_id, subtask, commit.checkpoint_id)
        return self._frame(subtask, [], commit.subtask_state, commit.metrics)

    def _frame(self, subtask: int, outputs: list[dict[str, Any]], encoded: bytes,
               metrics: str) -> pd.DataFrame:
        if not self.outputs_to_driver:
            outputs = []
        marker: dict[str, Any] = dict.fromkeys(self.output_columns)
        marker.update({HANDLE_COLUMN: encoded})
        records = [{**row, HANDLE_COLUMN: None} for row in outputs] + [marker]
        frame = pd.DataFrame(records, columns=[*self.output_columns, HANDLE_COLUMN])
        frame[SUBTASK_COLUMN] = subtask
        frame[METRICS_COLUMN] = [None] * len(outputs) + [metrics]  # handle row only
        return frame

    def _run(self, backend: ChangelogKeyedStateBackend, rows: pd.DataFrame | None,
             subtask: int, source: str, attach_s: float
             ) -> tuple[list[dict[str, Any]], SubtaskMetrics, KeyedStateHandle]:
        """Call the user's function per key (vectorised: once), then snapshot: outputs,
        metrics, handle."""
        materialized_before = backend.materialization_stats
        # A due materialization runs to its end before the batch, so that this batch's
        # checkpoint refers to it: the backend may not outlive this task.
        backend.materialize_if_due()
        # No reset of the logged counts here: a cached backend's were taken at its last
        # batch's end, and what a restore or reattach logged (registrations) is persisted
        # by this batch's checkpoint.
        outputs: list[dict[str, Any]] = []
        state = KeyState(backend)
        keys = 0
        if rows is not None and len(rows):
            self._check_keys(rows)
            data = rows.sort_values([KEY_COLUMN, *self.order_by], kind="stable")
            user_columns = [c for c in data.columns if c not in _INTERNAL_COLUMNS]
            if self.vectorized:
                produced, keys = call_vectorized(
                    self.fn, backend, data[user_columns],  # type: ignore[arg-type]
                    data[KEY_COLUMN], data[KEY_GROUP_COLUMN], self.key_columns, _natural,
                    self._output_column_set)
                outputs.extend(produced)
            else:
                keys = self._call_per_key(backend, data, user_columns, state, outputs)
        handle = backend.snapshot(self.checkpoint_id).result()
        # Everything logged since the previous checkpoint of this backend (for a restored
        # one: since the restore, whose re-logged registrations this checkpoint persists).
        changes, change_bytes = backend.take_logged()
        materialized = backend.materialization_stats
        metrics = SubtaskMetrics(
            subtask=subtask, rows_in=0 if rows is None else len(rows), keys=keys,
            state_rows=backend.state_rows(), checkpoint_bytes=handle.state_size,
            changes=changes, change_bytes=change_bytes,
            materializations_started=materialized.started - materialized_before.started,
            materializations_completed=materialized.completed - materialized_before.completed,
            materialized_bytes=materialized.bytes_written - materialized_before.bytes_written,
            state_source=source, restore_s=attach_s if source == "restored" else 0.0,
            attach_s=attach_s)
        return outputs, metrics, handle

    def _call_per_key(self, backend: ChangelogKeyedStateBackend, data: pd.DataFrame,
                      user_columns: list[str], state: KeyState,
                      outputs: list[dict[str, Any]]) -> int:
        """Call the user's function once per key with the key's rows (``data`` sorted by
        key); returns the number of keys. Each key's rows are a slice of the rows (a copy:
        the function may change it), found from where the key bytes change, which costs
        far less per key than a pandas ``groupby``."""
        encoded = data[KEY_COLUMN].to_numpy()
        starts = run_starts(encoded)
        ends = [*starts[1:].tolist(), len(encoded)]
        keys = keys_at(data, starts, self.key_columns, _natural)
        key_groups = data[KEY_GROUP_COLUMN].to_numpy()[starts].tolist()
        rows = data[user_columns]
        fn: StatefulFunction = self.fn  # type: ignore[assignment]
        set_current_key, rows_of = backend.set_current_key, KeyRows.copy_of_rows
        columns = self._output_column_set
        for i, start in enumerate(starts.tolist()):
            key_bytes = encoded[start]
            set_current_key(key_bytes if type(key_bytes) is bytes else bytes(key_bytes),
                            key_groups[i])
            produced = fn(keys[i], rows_of(rows, start, ends[i]), state)
            if produced is not None:
                outputs.extend(output_records(produced, columns, keys[i]))
        return len(keys)

    def _check_keys(self, rows: pd.DataFrame) -> None:
        """Refuse rows whose key is null (Spark's null key bytes): never drop them."""
        missing = rows[KEY_COLUMN].isna()
        if not missing.any():
            return
        null_columns = [c for c in self.key_columns if rows.loc[missing, c].isna().any()]
        raise NullKeyError(
            f"batch {self.batch_id}: {int(missing.sum())} rows have a null in key column(s) "
            f"{null_columns} (application {self.config.application!r}, operator "
            f"{self.config.operator_id!r}); a null key has no state: filter these rows or "
            "fill the nulls before the stateful step")

    def _cache_key(self, subtask: int) -> tuple[Any, ...]:
        c = self.config
        return (c.bootstrap_servers, c.application, c.operator_id, c.parallelism, subtask,
                c.state_backend, c.local_state_dir)

    def _materialization(self) -> MaterializationConfig:
        interval = self.config.materialization_interval_s
        return MaterializationConfig(interval_s=interval,
                                     start_jitter_s=min(60.0, (interval or 0) / 10))

    def _backend(self, subtask: int) -> tuple[ChangelogKeyedStateBackend, float, str]:
        """The subtask's in-memory backend at ``base``, the seconds getting it, and where
        its state came from ("reattached", "restored" or "fresh")."""
        config = self.config
        key_groups: KeyGroupRange = key_group_range_for_operator(
            config.max_parallelism, config.parallelism, subtask)
        cached = _Process.backends.pop(self._cache_key(subtask), None)
        if cached is not None:
            if cached.checkpoint_id == self.base and self.base is not None:
                cached.backend.notify_checkpoint_complete(cached.checkpoint_id)
                return cached.backend, 0.0, "reattached"
            cached.backend.close()
        started = time.monotonic()
        storage, snapshots = _Process.stores(config)
        materialization = self._materialization()
        handles = self.handles.get(subtask, [])
        if handles:
            backend = restore_backend(storage, snapshots, config.operator_id, key_groups,
                                      config.max_parallelism, handles,
                                      materialization=materialization)
        else:
            backend = ChangelogKeyedStateBackend(storage, snapshots, config.operator_id,
                                                 key_groups, config.max_parallelism,
                                                 materialization)
            return backend, 0.0, "fresh"
        return backend, time.monotonic() - started, "restored"


class _SupersededError(Exception):
    """Another attempt of the task committed the subtask first (internal)."""


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


def _worker_outlives_task() -> bool:
    """Whether this process runs on after the current task: a Spark Python worker only
    when Spark reuses workers (``spark.python.worker.reuse``, the default; its daemon
    exits a worker after one task otherwise)."""
    import os

    from pyspark import TaskContext

    return TaskContext.get() is None or bool(os.environ.get("SPARK_REUSE_WORKER"))


def _natural(value: Any) -> Any:
    """A key column value as Python gives it: numpy scalars become ints, floats and
    bools, strings a :class:`StringKey`; a floating-point key as the one value its key
    stands for (``-0.0`` as ``0.0``, any NaN as ``math.nan``)."""
    if isinstance(value, str):
        return StringKey(value)
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (bytes, pd.Timestamp)):
        value = item()
    if type(value) is float:
        return math.nan if value != value else value + 0.0  # -0.0 + 0.0 is 0.0
    return value


def stateful_foreach_batch(
    config: StreamingStateConfig,
    fn: StatefulFunction | VectorizedFunction,
    key_column: str | Sequence[str],
    output_schema: str,
    sink: Callable[[Any, int], None] | KafkaOutputSink | None = None,
    order_by: Iterable[str] = (),
    listener: BatchListener | None = None,
    task_listener: TaskListener | None = None,
    vectorized: bool = False,
) -> StatefulProcessor:
    """A function for ``df.writeStream.foreachBatch(...)`` that keeps ``fn``'s state.

    See :class:`StatefulProcessor` (``vectorized=True``: ``fn(rows, state)`` once per
    subtask per batch, see :mod:`spark_integration.vectorized`). Spark's Python workers
    must run an interpreter with this library installed:
    :func:`spark_integration.session.local_session` sets that up for local sessions; on
    a cluster, set ``spark.pyspark.python``.
    """
    return StatefulProcessor(config, fn, key_column, output_schema, sink, order_by, listener,
                             task_listener, vectorized)
