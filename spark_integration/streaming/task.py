"""What a Spark task runs for its subtask: get the backend, call the user's function,
snapshot, commit the outputs (with a ``KafkaOutputSink``), give the backend back.

One task per subtask per batch: Spark partition ``i`` holds exactly subtask ``i``'s rows
(:func:`~spark_integration.streaming.subtask_partitioning.partition_by_subtask`), and the task runs
for every partition: the driver gives each subtask one marker row (removed before the
task sees its rows), so every subtask checkpoints, fires its due timers and expires its
state even in a batch without rows. The task gets its backend through
:func:`kafka_changelog.state.host.acquire.acquire` (reattached, rolled back, restored or
fresh), and returns one handle row (the subtask's state in the checkpoint, its metrics)
plus, when the outputs go to a sink function, its output rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka.task_commit import SubtaskCommitter
from kafka_changelog.kafka.transactional_commit import OutputRecord
from kafka_changelog.keys import NullKeyError
from kafka_changelog.state.backend.config import BackendKind
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.checkpoints.driver_claim import DriverHolder
from kafka_changelog.state.checkpoints.subtask_commit import SubtaskCommit, subtask_commit_key
from kafka_changelog.state.host import host_store
from kafka_changelog.state.host.acquire import AcquiredBackend, acquire, discard, keep
from kafka_changelog.state.host.subtask_backend import StateSource, SubtaskPlacement
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.time.timers import TIMERS_STATE

from .columns import (
    HANDLE_COLUMN,
    INPUT_COLUMNS,
    KEY_COLUMN,
    KEY_GROUP_COLUMN,
    METRICS_COLUMN,
    PARTITION_COLUMN,
    RESULT_COLUMNS,
    SUBTASK_COLUMN,
)
from .config import StreamingStateConfig
from .events import TaskEvent, TaskListener
from .initial_state import InitialStateFunction, refuse_outputs, split_initial
from .kafka_sink import KafkaOutputSink
from .key_rows import KeyRows
from .key_runs import keys_at, natural_key_value, run_starts
from .key_state import BatchContext, KeyState
from .metrics import SubtaskMetrics
from .output_rows import output_records
from .state_declarations import StateDeclarations
from .subtask_hosts import host_identity
from .task_time import TaskTime, fire_timers, split_late_rows
from .vectorized import (
    VectorizedFunction,
    call_vectorized,
)
from .worker_resources import WorkerResources

logger = logging.getLogger(__name__)


#: ``fn(key, rows, state) -> output rows`` (a DataFrame, a dict for one row, an iterable
#: of dicts, or None). ``key`` is the key column's value (str, int, float, Decimal, date,
#: Timestamp, bool or bytes), or a tuple of the values of several key columns.
StatefulFunction = Callable[[Any, pd.DataFrame, KeyState], Any]

def placement_of(config: StreamingStateConfig, subtask: int) -> SubtaskPlacement:
    """Subtask ``subtask`` of ``config``'s operator at its parallelism."""
    return SubtaskPlacement(config.application, config.operator_id, subtask,
                            config.parallelism, config.max_parallelism)


def materialization_of(config: StreamingStateConfig) -> MaterializationConfig:
    """The materialization schedule of ``config`` (with a start jitter of a tenth of the
    interval, at most a minute, so that subtasks do not all materialize at once)."""
    interval = config.materialization_interval_s
    return MaterializationConfig(interval_s=interval,
                                 start_jitter_s=min(60.0, (interval or 0) / 10))


def host_store_settings(config: StreamingStateConfig) -> host_store.HostStoreSettings | None:
    """The host-local stores of ``state_backend="rocksdb"`` (None: in memory)."""
    if config.state_backend != BackendKind.ROCKSDB:
        return None
    return host_store.HostStoreSettings(config.local_state_root(), config.rocksdb_options,
                                        config.local_state_retention_s,
                                        max_job_age_s=config.snapshot_sweep_grace_s / 2)


@dataclass(frozen=True)
class TaskCommit:
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
    #: The driver that planned the batch: a task refuses to commit once another holds
    #: the application (that driver is a zombie).
    holder: DriverHolder | None = None


class _SupersededError(Exception):
    """Another attempt of the task committed the subtask first (internal)."""


class SubtaskTask:
    """What a Spark task runs for its subtask's rows (pickled to workers)."""

    def __init__(self, config: StreamingStateConfig,
                 fn: StatefulFunction | VectorizedFunction,
                 key_columns: list[str], order_by: tuple[str, ...], base: int | None,
                 handles: dict[int, list[KeyedStateHandle]], checkpoint_id: int,
                 output_columns: Sequence[str], batch_id: int,
                 commit: TaskCommit | None = None,
                 outputs_to_driver: bool = True, listener: TaskListener | None = None,
                 vectorized: bool = False, time: TaskTime | None = None,
                 partition_subtasks: Sequence[int] | None = None,
                 declarations: StateDeclarations | None = None,
                 on_initial_state: InitialStateFunction | None = None) -> None:
        self.config = config
        # Called with the initial state's rows before the batch's (see initial_state.py):
        # given only to the tasks of the batch that applies it.
        self.on_initial_state = on_initial_state
        # States registered (and dropped) before the function runs.
        self.declarations = declarations or StateDeclarations()
        # Partition -> the subtask it runs (None: partition i runs subtask i; see
        # spark_integration.streaming.subtask_hosts).
        self.partition_subtasks = tuple(partition_subtasks) if partition_subtasks else None
        # Without a batch time (a task run outside a query): the wall clock, fixed now.
        self.time = time or TaskTime(BatchContext(batch_id, checkpoint_id,
                                                  int(dt.datetime.now().timestamp() * 1000)))
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
        internal = list(RESULT_COLUMNS)
        return [*self.output_columns, *internal] if self.outputs_to_driver else internal

    def run_partition(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """Run the subtask of one Spark partition: partition ``i`` is subtask ``i``, or
        ``partition_subtasks[i]`` (``partition_by_subtask``); it runs for every subtask
        (see the driver's marker rows), its rows possibly none."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise ChangelogError("the stateful task runs outside a Spark task")
        partition = context.partitionId()
        if partition >= self.config.parallelism:
            raise ChangelogError(
                f"batch {self.batch_id}: Spark partition {partition} of a stateful step of "
                f"parallelism {self.config.parallelism}: the rows lost their partitioning "
                "on the way to the task (see spark_integration.streaming.subtask_partitioning's "
                "PLACEMENT_SETTINGS)")
        subtask = (self.partition_subtasks[partition] if self.partition_subtasks is not None
                   else partition)
        frames = list(batches)
        rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (
            frames[0] if frames else None)
        if rows is not None and len(rows):
            wrong = rows[rows[SUBTASK_COLUMN] != subtask]
            if len(wrong):
                raise ChangelogError(
                    f"batch {self.batch_id}: Spark partition {partition} of subtask "
                    f"{subtask} holds rows of subtask "
                    f"{int(wrong[SUBTASK_COLUMN].iloc[0])}; every partition must hold "
                    "exactly its own subtask's rows")
        frame = self(rows, subtask)
        frame[PARTITION_COLUMN] = partition
        yield frame[self._columns()]

    def _emit(self, event: TaskEvent, subtask: int) -> None:
        if self.listener is not None:
            self.listener(event, self.batch_id, subtask)

    def __call__(self, rows: pd.DataFrame | None, subtask: int) -> pd.DataFrame:
        """One subtask's rows (None or empty: no input) -> its state handle row (and its
        outputs, when they go to the driver)."""
        self._emit(TaskEvent.SUBTASK_START, subtask)
        commit = self.commit
        committer: SubtaskCommitter | None = None
        if commit is not None:
            earlier = commit.reused.get(subtask)
            if earlier is not None:
                return self._handle_frame(subtask, SubtaskCommit.from_bytes(earlier))
            committer = WorkerResources.task_committer(self.config, commit.sink, subtask)
            try:
                # After this task's producer fenced every earlier attempt's.
                found = committer.find(self._commit_key(subtask), commit.floor, self._same,
                                       commit.holder)
            except BaseException:
                WorkerResources.drop_committer(self.config, commit.sink, subtask)
                raise
            if found is not None:
                return self._handle_frame(subtask, found)
        config = self.config
        storage, snapshots = WorkerResources.stores(config)
        acquired = acquire(placement_of(config, subtask), self.base,
                           self.handles.get(subtask, []),
                           WorkerResources.take_backend(config, subtask), storage, snapshots,
                           materialization_of(config), host_store_settings(config))
        try:
            outputs, metrics, handle = self.run_function(acquired, rows, subtask)
            metrics = dataclasses.replace(metrics, rows_out=len(outputs))
            encoded = SubtaskState(config.operator_id, subtask, config.parallelism,
                                   handle, None).to_bytes()
            if acquired.store is not None:
                metrics = self._materialize_in_background(acquired.store, metrics, encoded)
            holding = None
            if committer is not None and commit is not None:
                retries_before = committer.retries
                holding, ours = committer.commit(
                    self._output_records(outputs, commit),
                    self._subtask_commit(subtask, encoded, metrics, len(outputs), commit),
                    commit.floor,
                    lambda: self._emit(TaskEvent.SUBTASK_IN_TRANSACTION, subtask),
                    commit.holder)
                if not ours:
                    raise _SupersededError
                # After the commit (its record holds the figures before it).
                metrics = dataclasses.replace(
                    metrics, transaction_retries=committer.retries - retries_before)
        except _SupersededError:
            # Another attempt committed this subtask first: its results stand; this
            # backend is at no checkpoint.
            self._discard(acquired, subtask)
            assert holding is not None
            return self._handle_frame(subtask, holding)
        except BaseException:
            # A failed task's backend is at no checkpoint: never kept (a local store is
            # left without manifest, so the next task restores it).
            self._discard(acquired, subtask)
            if commit is not None:
                WorkerResources.drop_committer(config, commit.sink, subtask)
            raise
        if committer is not None:
            self._emit(TaskEvent.SUBTASK_COMMITTED, subtask)
        kept = keep(acquired, self.checkpoint_id, encoded)
        if kept is not None:
            WorkerResources.keep_backend(config, subtask, kept)
        if acquired.store is not None:
            # A job process outlives the worker; a thread only a worker Spark reuses.
            host_store.run_started(acquired.store, snapshots,
                                   lambda job: WorkerResources.materialize(config, job),
                                   config.materialization_nice is not None
                                   or _worker_outlives_task())
        return self._frame(subtask, outputs, encoded, metrics.to_json())

    def _materialize_in_background(self, hold: host_store.StoreHold, metrics: SubtaskMetrics,
                                   encoded: bytes) -> SubtaskMetrics:
        """Start a due materialization from a copy of the store (written after this task
        lets the store go); the metrics count it, and those this task applied."""
        started = host_store.materialize_in_background(hold, self.checkpoint_id, encoded,
                                                       materialization_of(self.config))
        return dataclasses.replace(
            metrics,
            materializations_started=metrics.materializations_started + int(started),
            materializations_completed=metrics.materializations_completed + hold.applied,
            materialized_bytes=metrics.materialized_bytes + hold.applied_bytes)

    @staticmethod
    def _discard(acquired: AcquiredBackend, subtask: int) -> None:
        try:
            discard(acquired)
        except Exception as exc:
            logger.warning("closing subtask %d's backend after a failure: %s", subtask, exc)

    def _commit_key(self, subtask: int) -> str:
        return subtask_commit_key(self.config.application, self.config.operator_id, subtask)

    def _same(self, found: SubtaskCommit) -> bool:
        assert self.commit is not None
        return found.is_for(self.config.application, self.config.operator_id,
                            self.checkpoint_id, self.batch_id, self.commit.query_id)

    def _subtask_commit(self, subtask: int, encoded: bytes, metrics: SubtaskMetrics,
                        rows_out: int, commit: TaskCommit) -> SubtaskCommit:
        c = self.config
        return SubtaskCommit(c.application, c.operator_id, self.checkpoint_id, subtask,
                             c.parallelism, self.batch_id, commit.query_id,
                             int(time.time() * 1000), rows_out, encoded,
                             dataclasses.replace(metrics, reused=True).to_json())

    def _output_records(self, outputs: list[dict[str, Any]], commit: TaskCommit
                        ) -> list[OutputRecord]:
        """The outputs as records of the sink, cast to the output schema first (as Spark
        casts what a task returns)."""
        if not outputs:
            return []
        import pyarrow as pa

        from ..sessions.spark_versions import arrow_schema_of

        frame = pd.DataFrame(outputs, columns=self.output_columns)
        table = pa.Table.from_pandas(frame, schema=arrow_schema_of(commit.struct),
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

    def run_function(self, acquired: AcquiredBackend, rows: pd.DataFrame | None,
                     subtask: int) -> tuple[list[dict[str, Any]], SubtaskMetrics,
                                            KeyedStateHandle]:
        """Call the user's function per key (vectorised: once) on the acquired backend,
        fire the due timers, expire TTL'd state, then snapshot: outputs, metrics, handle."""
        backend = acquired.backend
        time = self.time
        backend.set_processing_time(time.context.processing_time_ms)
        materialized_before = backend.materialization_stats
        # A due materialization runs to its end before the batch, so that this batch's
        # checkpoint refers to it: the backend may not outlive this task.
        backend.materialize_if_due()
        # No reset of the logged counts here: a cached backend's were taken at its last
        # batch's end, and what a restore or reattach logged (registrations) is persisted
        # by this batch's checkpoint.
        self.declarations.apply(backend)
        outputs: list[dict[str, Any]] = []
        keys = late = 0
        max_event_ms: int | None = None
        state = KeyState(backend, time.context, time.event_time)
        initial, rows = split_initial(rows, self.key_columns)
        if initial is not None and len(initial):
            self._apply_initial(backend, initial, state)
        rows_in = 0 if rows is None else len(rows)
        if rows is not None and len(rows):
            self._check_keys(rows)
            if time.event_time is not None:
                rows, late, max_event_ms = split_late_rows(rows, time, self.batch_id)
        if rows is not None and len(rows):
            data = rows.sort_values([KEY_COLUMN, *self.order_by], kind="stable")
            user_columns = [c for c in data.columns if c not in INPUT_COLUMNS]
            if self.vectorized:
                produced, keys = call_vectorized(
                    self.fn, backend, data[user_columns],  # type: ignore[arg-type]
                    data[KEY_COLUMN], data[KEY_GROUP_COLUMN], self.key_columns,
                    natural_key_value, self._output_column_set, state)
                outputs.extend(produced)
            else:
                keys = self._call_per_key(self.fn, backend, data, user_columns, outputs,
                                          state)
        fired = fire_timers(backend, state, time, outputs, self._output_column_set,
                            self.vectorized, self.batch_id)
        expired = backend.expire_due()
        handle = backend.snapshot(self.checkpoint_id).result()
        # Everything logged since the previous checkpoint of this backend (for a restored
        # one: since the restore, whose re-logged registrations this checkpoint persists).
        changes, change_bytes = backend.take_logged()
        materialized = backend.materialization_stats
        metrics = SubtaskMetrics(
            subtask=subtask, rows_in=rows_in, keys=keys,
            state_rows=backend.state_rows(), checkpoint_bytes=handle.state_size,
            changes=changes, change_bytes=change_bytes,
            materializations_started=materialized.started - materialized_before.started,
            materializations_completed=materialized.completed - materialized_before.completed,
            materialized_bytes=materialized.bytes_written - materialized_before.bytes_written,
            state_source=acquired.source,
            restore_s=acquired.seconds if acquired.source is StateSource.RESTORED else 0.0,
            attach_s=acquired.seconds, processing_time_ms=time.context.processing_time_ms,
            late_rows=late, max_event_time_ms=max_event_ms, timers_fired=fired,
            expiry_checks=expired, host=host_identity(self.config),
            registrations=sorted(json.dumps(meta.to_record(), sort_keys=True)
                                 for name, meta in backend.table.metas.items()
                                 if name != TIMERS_STATE))
        return outputs, metrics, handle

    def _apply_initial(self, backend: ChangelogKeyedStateBackend, initial: pd.DataFrame,
                       state: KeyState) -> None:
        """Call ``on_initial_state`` with the initial state's rows (per key, or once
        vectorised), before the batch's rows; it returns nothing."""
        fn = self.on_initial_state
        if fn is None:
            raise ChangelogError(
                f"batch {self.batch_id}: initial state rows reached a task of a batch that "
                "does not apply the initial state")
        self._check_keys(initial)
        data = initial.sort_values(KEY_COLUMN, kind="stable")
        user_columns = [c for c in data.columns if c not in INPUT_COLUMNS]
        if self.vectorized:
            produced, _ = call_vectorized(
                fn, backend, data[user_columns], data[KEY_COLUMN], data[KEY_GROUP_COLUMN],
                self.key_columns, natural_key_value, None, state)
            refuse_outputs(produced or None, "the initial state's rows")
        else:
            self._call_per_key(fn, backend, data, user_columns, None, state)

    def _call_per_key(self, fn: Callable[..., Any], backend: ChangelogKeyedStateBackend,
                      data: pd.DataFrame, user_columns: list[str],
                      outputs: list[dict[str, Any]] | None, state: KeyState) -> int:
        """Call ``fn`` once per key with the key's rows (``data`` sorted by key); returns
        the number of keys. Each key's rows are a slice of the rows (a copy: the function
        may change it), found from where the key bytes change, which costs far less per
        key than a pandas ``groupby``. ``outputs`` None: ``fn`` returns nothing (the
        initial state's function)."""
        encoded = data[KEY_COLUMN].to_numpy()
        starts = run_starts(encoded)
        ends = [*starts[1:].tolist(), len(encoded)]
        keys = keys_at(data, starts, self.key_columns, natural_key_value)
        key_groups = data[KEY_GROUP_COLUMN].to_numpy()[starts].tolist()
        rows = data[user_columns]
        set_current_key, rows_of = backend.set_current_key, KeyRows.copy_of_rows
        columns = self._output_column_set
        state.calling(True)
        try:
            for i, start in enumerate(starts.tolist()):
                key_bytes = encoded[start]
                set_current_key(key_bytes if type(key_bytes) is bytes else bytes(key_bytes),
                                key_groups[i])
                produced = fn(keys[i], rows_of(rows, start, ends[i]), state)
                if outputs is None:
                    refuse_outputs(produced, f"key {keys[i]!r}")
                elif produced is not None:
                    outputs.extend(output_records(produced, columns, keys[i]))
        finally:
            state.calling(False)
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


def _worker_outlives_task() -> bool:
    """Whether this process runs on after the current task: a Spark Python worker only
    when Spark reuses workers (``spark.python.worker.reuse``, the default; its daemon
    exits a worker after one task otherwise)."""
    import os

    from pyspark import TaskContext

    return TaskContext.get() is None or bool(os.environ.get("SPARK_REUSE_WORKER"))


__all__ = ["StatefulFunction", "SubtaskTask", "TaskCommit", "host_store_settings",
           "materialization_of", "placement_of"]
