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
``state_backend="rocksdb"`` reattached from the host's local state directory when the
subtask's store is exactly there, whichever worker left it: see
:mod:`spark_integration.local_state`; else restored from Kafka), calls the user's
function per key in a deterministic order,
persists the changelog, and returns its output rows plus its state handle. The
driver commits the checkpoint only when every subtask succeeded: with a
:class:`~spark_integration.kafka_sink.KafkaOutputSink`, in one Kafka transaction
with the batch's outputs; with a sink function, before calling it.

A batch that Spark runs again after a crash (before or after our commit) starts from
the checkpoint before it, so its state comes out the same; when the batch had
already been committed, the recomputed state is not committed twice. Its outputs
are then not written again by a ``KafkaOutputSink`` (they were committed with the
checkpoint) but are given again to a sink function (make it idempotent per batch
id, as with any ``foreachBatch`` sink).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from kafka_changelog import KeyGroupRange, key_group_range_for_operator
from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.client_settings import KafkaConnection
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.kafka.transactional_commit import TransactionalCommitter
from kafka_changelog.keys import NullKeyError
from kafka_changelog.state.backend_config import KINDS, MEMORY, ROCKSDB
from kafka_changelog.state.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.coordinator import CheckpointCoordinator
from kafka_changelog.state.descriptors import StateDescriptor
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.local_store import remove_operator_stores
from kafka_changelog.state.materializer import MaterializationConfig
from kafka_changelog.state.restore import restore_backend

from . import local_state
from .batch_identity import BatchPlan, plan_batch
from .kafka_sink import KafkaOutputSink
from .keys import key_columns_of, key_sql
from .local_state import CachedBackend
from .metrics import SubtaskMetrics, log_batch
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

#: The points of a micro-batch a :data:`BatchListener` hears about, in order.
BATCH_EVENTS = ("batch_start", "before_commit", "in_transaction", "after_commit")

#: ``listener(event, batch_id)``: called on the driver at each of :data:`BATCH_EVENTS`
#: (``in_transaction`` only with a ``KafkaOutputSink``: outputs and checkpoint records
#: are produced, the transaction not yet committed). For metrics, logging, and fault
#: injection in tests; an exception it raises fails the batch.
BatchListener = Callable[[str, int], None]


@dataclass(frozen=True)
class StreamingStateConfig:
    """Where and how a streaming operator keeps its state (picklable: tasks get a copy)."""

    #: Application name: the checkpoint store keeps checkpoints per application.
    application: str
    #: Operator id (one stateful function of the application).
    operator_id: str
    #: Kafka brokers for the changelog, snapshot and checkpoint topics.
    bootstrap_servers: str
    #: Key groups in all; fixed for the life of the application.
    max_parallelism: int = 128
    #: Tasks per micro-batch; may change between runs (state follows key groups).
    parallelism: int = 2
    changelog_topic: str = "kafka-changelog"
    snapshot_topic: str = "kafka-changelog-snapshots"
    checkpoint_topic: str = "kafka-changelog-checkpoints"
    #: Partitions of the changelog and snapshot topics when they are created.
    partitions: int = 16
    #: Seconds between materializations (None: never).
    materialization_interval_s: float | None = 600.0
    #: Checkpoints kept (at least 2).
    retain: int = 3
    #: Any librdkafka setting for every client (security included).
    client_config: dict[str, Any] = field(default_factory=dict)
    #: Each subtask's working copy: "memory" (kept by the Python worker that ran the
    #: subtask last; another worker restores from Kafka) or "rocksdb" (a store per
    #: subtask in ``local_state_dir`` that any Python worker on the host reattaches; needs
    #: ``rocksdict``). See docs/spark.md, "Local state directory".
    state_backend: str = MEMORY
    #: Where "rocksdb" keeps the host-local subtask stores (None:
    #: ``kafka-changelog-state`` under the system temp dir): an absolute path on a local
    #: disk of every executor host.
    local_state_dir: str | None = None

    def __post_init__(self) -> None:
        if self.state_backend not in KINDS:
            raise ValueError(f"state_backend must be one of {KINDS}, got "
                             f"{self.state_backend!r}")

    def local_state_root(self) -> Path:
        """The host-local state directory of ``state_backend="rocksdb"``."""
        return (Path(self.local_state_dir) if self.local_state_dir
                else Path(tempfile.gettempdir()) / "kafka-changelog-state")

    def connection(self) -> KafkaConnection:
        """How every client of the operator connects."""
        return KafkaConnection(bootstrap_servers=self.bootstrap_servers,
                               client_config=dict(self.client_config))

    def changelog(self) -> KafkaChangelogConfig:
        """The changelog storage's config."""
        return KafkaChangelogConfig.on(
            self.connection(), topic=self.changelog_topic, partitions=self.partitions,
            max_parallelism=self.max_parallelism)

    def snapshots(self) -> SnapshotStoreConfig:
        """The snapshot store's config."""
        return SnapshotStoreConfig.on(
            self.connection(), topic=self.snapshot_topic, partitions=self.partitions,
            max_parallelism=self.max_parallelism)

    def checkpoints(self) -> CheckpointStoreConfig:
        """The checkpoint store's config."""
        return CheckpointStoreConfig.on(self.connection(), topic=self.checkpoint_topic,
                                        retain=self.retain)


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


#: ``fn(key, rows, state) -> output rows`` (a DataFrame or an iterable of dicts). ``key``
#: is the key column's value (str, int, Decimal, date, Timestamp, bool or bytes), or a
#: tuple of the values of several key columns.
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
    committers: ClassVar[dict[tuple[str, ...], TransactionalCommitter]] = {}

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
    def committer(cls, config: StreamingStateConfig, sink: KafkaOutputSink
                  ) -> TransactionalCommitter:
        """The transactional committer of ``sink`` (its first use fences a crashed
        predecessor with the same transactional id and aborts what it left open)."""
        tid = sink.transactional_id_for(config.application, config.operator_id)
        key = (*cls._resource_key(config), tid)
        if key not in cls.committers:
            store = cls.coordinator(config).checkpoints
            assert isinstance(store, KafkaCheckpointStore)
            cls.committers[key] = TransactionalCommitter(store, tid, sink.producer_config)
        return cls.committers[key]

    @classmethod
    def release(cls, config: StreamingStateConfig) -> None:
        """Close this process's backends and Kafka clients of ``config``'s application, and
        delete the operator's local state stores on this host (those nobody holds)."""
        for key in [k for k in cls.committers if k[:-1] == cls._resource_key(config)]:
            cls.committers.pop(key).close()
        for key in [k for k in cls.backends if k[:2] == (config.bootstrap_servers,
                                                         config.application)]:
            cls.backends.pop(key).backend.close()
        if config.state_backend == ROCKSDB:
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


@dataclass
class BatchReport:
    """What one micro-batch did."""

    batch_id: int
    #: The checkpoint the batch committed (for a re-run: committed before).
    checkpoint_id: int
    #: The checkpoint its state started from (None: empty state).
    restored_from: int | None
    committed: bool
    rows_out: int
    seconds: float
    #: Seconds in the subtask tasks (Spark job), the commit, and the sink.
    task_s: float = 0.0
    commit_s: float = 0.0
    sink_s: float = 0.0
    #: The Spark partition that ran each subtask (one each: subtasks run in parallel).
    subtask_partitions: dict[int, int] = field(default_factory=dict)
    #: Seconds each subtask spent restoring its backend from Kafka (subtasks that reattached
    #: a backend or a local store, or started empty, are not listed).
    restore_s: dict[int, float] = field(default_factory=dict)
    #: Materialization id of each subtask's snapshot in this checkpoint (0: none yet).
    materializations: dict[int, int] = field(default_factory=dict)
    #: "first", "new", "rerun" or "new-query" (see ``spark_integration.batch_identity``).
    kind: str = "new"
    #: The Spark query that ran the batch ("" outside a streaming query).
    query_id: str = ""
    #: What each subtask held and did (state rows and bytes, changes persisted,
    #: materializations, reattached or restored).
    subtask_metrics: dict[int, SubtaskMetrics] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-able), e.g. for a metrics system."""
        return dataclasses.asdict(self)


class StatefulProcessor:
    """The ``foreachBatch`` function of a stateful query.

    ``fn(key, rows, state)`` is called once per key present in a micro-batch, with the
    key's rows (ordered by ``order_by``) and ``state(descriptor)`` to reach its state;
    it returns the output rows (schema ``output_schema``, a DDL string). The key is
    ``key_column``'s value, or a tuple when ``key_column`` names several columns; a
    row with a null key column fails the batch with
    :class:`~kafka_changelog.keys.NullKeyError` (filter or fill nulls first).

    ``sink`` is either a :class:`KafkaOutputSink` (outputs committed in the
    checkpoint's Kafka transaction: exactly once) or a function ``sink(df, batch_id)``
    called with every batch's outputs after the checkpoint committed (at least once:
    a batch Spark runs again after a crash gives its outputs again; make it
    idempotent per batch id). ``listener`` hears the batch's progress
    (:data:`BatchListener`).

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
        self.reports: list[BatchReport] = []

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
        committer = (_Process.committer(config, sink) if isinstance(sink, KafkaOutputSink)
                     else None)
        query_id = _query_id(batch_df)
        plan = plan_batch(coordinator.checkpoints, config.application, query_id, batch_id)
        if plan.base is None:
            # Before the first checkpoint: keep other applications' GC off what the tasks
            # are about to write (see CheckpointCoordinator.guard_first_writes).
            coordinator.guard_first_writes()
        if plan.kind == "new-query":
            logger.warning(
                "application %s: batch %d of Spark query %s follows checkpoint %d of another "
                "query (a new checkpointLocation?): the state carries over from it",
                config.application, batch_id, query_id or "(none)", plan.base)
        p, max_p = config.parallelism, config.max_parallelism
        columns, types = key_columns_of(batch_df.schema, self.key_columns)
        keyed = (
            batch_df
            .withColumn(KEY_COLUMN, F.expr(key_sql(columns, types)))
            .withColumn(KEY_GROUP_COLUMN, F.expr(f"pmod(hash({KEY_COLUMN}), {max_p})"))
            .withColumn(SUBTASK_COLUMN,
                        F.floor(F.col(KEY_GROUP_COLUMN) * p / max_p).cast("int"))
        )
        task = _SubtaskTask(config, self.fn, columns, self.order_by, plan.base,
                            _assigned_handles(coordinator, config, plan.base),
                            plan.checkpoint_id, self.output_schema, batch_id,
                            vectorized=self.vectorized)

        def run_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            return task.run_partition(batches)

        result = partition_by_subtask(
            # A null key hashes like any value (Spark's hash(null) is its seed); the task
            # that gets it refuses it, naming the column.
            keyed, SUBTASK_COLUMN, p,
        ).mapInPandas(run_partition, f"{self.output_schema}, {SUBTASK_COLUMN} int, "
                                     f"{PARTITION_COLUMN} int, {METRICS_COLUMN} string, "
                                     f"{HANDLE_COLUMN} binary")
        tasks_started = time.monotonic()
        collected = result.toPandas()
        task_s = time.monotonic() - tasks_started
        handles = collected[collected[HANDLE_COLUMN].notnull()]
        if sorted(handles[SUBTASK_COLUMN]) != list(range(p)):
            raise ChangelogError(
                f"batch {batch_id}: expected state handles of subtasks 0..{p - 1}, got "
                f"{sorted(handles[SUBTASK_COLUMN])}")
        subtasks = [SubtaskState.from_bytes(bytes(h)) for h in handles[HANDLE_COLUMN]]
        partitions = {int(s): int(q) for s, q in
                      zip(handles[SUBTASK_COLUMN], handles[PARTITION_COLUMN], strict=True)}
        metrics = {m.subtask: m for m in map(SubtaskMetrics.from_json, handles[METRICS_COLUMN])}
        restores = {s: m.restore_s for s, m in metrics.items() if m.state_source == "restored"}
        materializations = {
            s.subtask_index: (s.keyed.materialization_id
                              if s.keyed is not None and s.keyed.snapshot is not None else 0)
            for s in subtasks}
        outputs = _typed_like(collected[collected[HANDLE_COLUMN].isnull()].drop(
            columns=[SUBTASK_COLUMN, PARTITION_COLUMN, METRICS_COLUMN, HANDLE_COLUMN]
        ).reset_index(drop=True), result.schema)
        self._emit("before_commit", batch_id)
        commit_started = time.monotonic()
        if plan.commit:
            self._commit(coordinator, committer, plan, subtasks, outputs, query_id, batch_id)
        commit_s = time.monotonic() - commit_started
        self._emit("after_commit", batch_id)
        sink_started = time.monotonic()
        if sink is not None and not isinstance(sink, KafkaOutputSink):
            frame = batch_df.sparkSession.createDataFrame(outputs, self.output_schema)
            sink(frame, batch_id)
        report = BatchReport(
            batch_id, plan.checkpoint_id, plan.base, plan.commit, len(outputs),
            time.monotonic() - started, task_s, commit_s, time.monotonic() - sink_started,
            partitions, restores, materializations, plan.kind, query_id, metrics)
        self.reports.append(report)
        log_batch(report)

    def _commit(self, coordinator: CheckpointCoordinator,
                committer: TransactionalCommitter | None, plan: BatchPlan,
                subtasks: list[SubtaskState], outputs: pd.DataFrame, query_id: str,
                batch_id: int) -> None:
        persist = None
        if committer is not None and isinstance(self.sink, KafkaOutputSink):
            persist = committer.persister(
                self.sink.records(outputs, batch_id, plan.checkpoint_id),
                lambda: self._emit("in_transaction", batch_id))
        coordinator.complete(plan.checkpoint_id, subtasks, persist=persist,
                             properties=plan.properties(query_id, batch_id))


def _query_id(batch_df: Any) -> str:
    """The id of the streaming query running this ``foreachBatch`` call ("" if none).

    Spark sets it as a local property of the query's thread, which is the thread
    calling the function (py4j pins Python threads to JVM threads).
    """
    context = batch_df.sparkSession.sparkContext
    return context.getLocalProperty("sql.streaming.queryId") or ""


class _SubtaskTask:
    """What a Spark task runs for its subtask's rows (pickled to workers)."""

    def __init__(self, config: StreamingStateConfig,
                 fn: StatefulFunction | VectorizedFunction,
                 key_columns: list[str], order_by: tuple[str, ...], base: int | None,
                 handles: dict[int, list[KeyedStateHandle]], checkpoint_id: int,
                 output_schema: str, batch_id: int, vectorized: bool = False) -> None:
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
        self.output_columns = [c.strip().split()[0].strip("`")
                               for c in output_schema.split(",") if c.strip()]

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
        yield frame[[*self.output_columns, SUBTASK_COLUMN, PARTITION_COLUMN,
                     METRICS_COLUMN, HANDLE_COLUMN]]

    def __call__(self, rows: pd.DataFrame | None, subtask: int) -> pd.DataFrame:
        """One subtask's rows (None or empty: no input) -> its outputs and state handle."""
        attached: local_state.LocalAttachment | None = None
        if self.config.state_backend == ROCKSDB:
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
        except BaseException:
            # A failed task's backend is at no checkpoint: never kept (a local store is
            # left without manifest, so the next task restores it).
            try:
                if attached is not None:
                    local_state.abandon(attached)
                else:
                    backend.close()
            except Exception as exc:
                logger.warning("closing subtask %d's backend after a failure: %s", subtask, exc)
            raise
        encoded = SubtaskState(self.config.operator_id, subtask, self.config.parallelism,
                               handle, None).to_bytes()
        _Process.backends[self._cache_key(subtask)] = (
            local_state.release(attached, self.config, subtask, self.checkpoint_id, encoded)
            if attached is not None else CachedBackend(backend, self.checkpoint_id))
        marker: dict[str, Any] = dict.fromkeys(self.output_columns)
        marker.update({HANDLE_COLUMN: encoded})
        records = [{**row, HANDLE_COLUMN: None} for row in outputs] + [marker]
        frame = pd.DataFrame(records, columns=[*self.output_columns, HANDLE_COLUMN])
        frame[SUBTASK_COLUMN] = subtask
        frame[METRICS_COLUMN] = [None] * len(outputs) + [metrics.to_json()]  # handle row only
        return frame[[*self.output_columns, SUBTASK_COLUMN, METRICS_COLUMN, HANDLE_COLUMN]]

    def _run(self, backend: ChangelogKeyedStateBackend, rows: pd.DataFrame | None,
             subtask: int, source: str, attach_s: float
             ) -> tuple[list[dict[str, Any]], SubtaskMetrics, KeyedStateHandle]:
        """Call the user's function per key (vectorised: once), then snapshot: outputs,
        metrics, handle."""
        materialized_before = backend.materialization_stats
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
                    data[KEY_COLUMN], data[KEY_GROUP_COLUMN], self.key_columns, _natural)
                outputs.extend(produced)
            else:
                single = len(self.key_columns) == 1
                for key_bytes, group in data.groupby(KEY_COLUMN, sort=True):
                    first = group.iloc[0]
                    backend.set_current_key(bytes(key_bytes), int(first[KEY_GROUP_COLUMN]))
                    values = tuple(_natural(first[c]) for c in self.key_columns)
                    produced = self.fn(values[0] if single else values,  # type: ignore[call-arg]
                                       group[user_columns], state)
                    outputs.extend(_as_records(produced))
                    keys += 1
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


def _assigned_handles(coordinator: CheckpointCoordinator, config: StreamingStateConfig,
                      base: int | None) -> dict[int, list[KeyedStateHandle]]:
    """Per subtask of ``config.parallelism``, the keyed state handles of checkpoint ``base``
    that overlap its key groups (read once, on the driver)."""
    if base is None:
        return {}
    checkpoint = coordinator.checkpoints.get(config.application, base)
    old = [s.keyed for s in checkpoint.subtasks_of(config.operator_id) if s.keyed is not None]
    assigned = {}
    for subtask in range(config.parallelism):
        key_groups = key_group_range_for_operator(config.max_parallelism, config.parallelism,
                                                  subtask)
        assigned[subtask] = [h for h in old
                             if not h.key_group_range.intersection(key_groups).is_empty]
    return assigned


def _typed_like(outputs: pd.DataFrame, schema: Any) -> pd.DataFrame:
    """``outputs`` with integer and boolean columns as such again: the handle rows'
    nulls made ``toPandas`` widen them to float/object."""
    from pyspark.sql import types as T

    for spark_field in schema.fields:
        if spark_field.name not in outputs.columns:
            continue
        if isinstance(spark_field.dataType, T.IntegralType):
            outputs[spark_field.name] = outputs[spark_field.name].astype("Int64")
        elif isinstance(spark_field.dataType, T.BooleanType):
            outputs[spark_field.name] = outputs[spark_field.name].astype("boolean")
    return outputs


def _natural(value: Any) -> Any:
    """A key column value as Python gives it: numpy scalars become ints and bools,
    strings a :class:`StringKey`."""
    if isinstance(value, str):
        return StringKey(value)
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, (bytes, pd.Timestamp)):
        return item()
    return value


def _as_records(produced: Any) -> Iterator[dict[str, Any]]:
    if produced is None:
        return iter(())
    if isinstance(produced, pd.DataFrame):
        return iter(produced.to_dict("records"))
    return iter(produced)


def stateful_foreach_batch(
    config: StreamingStateConfig,
    fn: StatefulFunction | VectorizedFunction,
    key_column: str | Sequence[str],
    output_schema: str,
    sink: Callable[[Any, int], None] | KafkaOutputSink | None = None,
    order_by: Iterable[str] = (),
    listener: BatchListener | None = None,
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
                             vectorized)
