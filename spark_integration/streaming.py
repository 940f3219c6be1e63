"""Exactly-once keyed state for Structured Streaming, through ``foreachBatch``.

Micro-batch ``b`` is checkpoint ``b + 1``. The driver adds each row's key group
(``pmod(hash(key), max_parallelism)``, Spark SQL's own hash) and subtask, and runs
one Spark task per subtask, in parallel (``partition_by_subtask`` then
``mapInPandas``). A task gets a keyed state backend for its key-group range at the
previous complete checkpoint (reused from the Python worker's cache when it is
exactly there, else restored from Kafka), calls the user's function per key in a
deterministic order, persists the changelog, and returns its output rows plus its
state handle. The driver commits the checkpoint only when every subtask succeeded:
with a :class:`~spark_integration.kafka_sink.KafkaOutputSink`, in one Kafka
transaction with the batch's outputs; with a sink function, before calling it.

A batch that Spark runs again after a crash (before or after our commit) starts from
the checkpoint before it, so its state comes out the same; when the batch had
already been committed, the recomputed state is not committed twice. Its outputs
are then not written again by a ``KafkaOutputSink`` (they were committed with the
checkpoint) but are given again to a sink function (make it idempotent per batch
id, as with any ``foreachBatch`` sink).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from kafka_changelog import KeyGroupRange, key_group_range_for_operator
from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.state.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.coordinator import CheckpointCoordinator
from kafka_changelog.state.descriptors import StateDescriptor
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.materializer import MaterializationConfig
from kafka_changelog.state.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.transactional_commit import TransactionalCommitter

from .kafka_sink import KafkaOutputSink
from .subtask_partitioning import partition_by_subtask

#: Set to ``<point>:<batch id>`` to kill the driver with SIGKILL there (crash tests).
CRASH_ENV = "KAFKA_CHANGELOG_CRASH_AT"
HANDLE_COLUMN = "__kc_handle"
SUBTASK_COLUMN = "__kc_subtask"
MARKER_COLUMN = "__kc_marker"
KEY_GROUP_COLUMN = "__kc_key_group"
PARTITION_COLUMN = "__kc_partition"
RESTORE_COLUMN = "__kc_restore_s"


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

    def changelog(self) -> KafkaChangelogConfig:
        return KafkaChangelogConfig(
            bootstrap_servers=self.bootstrap_servers, topic=self.changelog_topic,
            partitions=self.partitions, max_parallelism=self.max_parallelism,
            client_config=dict(self.client_config))

    def snapshots(self) -> SnapshotStoreConfig:
        return SnapshotStoreConfig(
            bootstrap_servers=self.bootstrap_servers, topic=self.snapshot_topic,
            partitions=self.partitions, max_parallelism=self.max_parallelism,
            client_config=dict(self.client_config))

    def checkpoints(self) -> CheckpointStoreConfig:
        return CheckpointStoreConfig(
            bootstrap_servers=self.bootstrap_servers, topic=self.checkpoint_topic,
            retain=self.retain, client_config=dict(self.client_config))


class KeyState:
    """What the user's function gets: state objects scoped to the current key."""

    def __init__(self, backend: ChangelogKeyedStateBackend) -> None:
        self._backend = backend

    def __call__(self, descriptor: StateDescriptor) -> Any:
        """The state object (ValueState, ListState, MapState, ...) for ``descriptor``."""
        return self._backend.state(descriptor)


#: ``fn(key, rows, state) -> output rows`` (a DataFrame or an iterable of dicts).
StatefulFunction = Callable[[bytes, pd.DataFrame, KeyState], Any]


class _Process:
    """Kafka clients and cached backends of one Python process (driver or worker)."""

    resources: ClassVar[dict[tuple[str, ...], tuple[
        KafkaChangelogStorage, KafkaSnapshotStore, CheckpointCoordinator]]] = {}
    backends: ClassVar[dict[tuple[Any, ...], tuple[ChangelogKeyedStateBackend, int]]] = {}
    committers: ClassVar[dict[tuple[str, ...], TransactionalCommitter]] = {}

    @staticmethod
    def _resource_key(config: StreamingStateConfig) -> tuple[str, ...]:
        return (config.bootstrap_servers, config.application, config.changelog_topic,
                config.snapshot_topic, config.checkpoint_topic)

    @classmethod
    def coordinator(cls, config: StreamingStateConfig) -> CheckpointCoordinator:
        key = cls._resource_key(config)
        if key not in cls.resources:
            storage = KafkaChangelogStorage(config.changelog())
            snapshots = KafkaSnapshotStore(config.snapshots())
            checkpoints = KafkaCheckpointStore(config.checkpoints())
            cls.resources[key] = (storage, snapshots, CheckpointCoordinator(
                config.application, checkpoints, snapshots, storage, config.max_parallelism))
        return cls.resources[key][2]

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
        """Close this process's backends and Kafka clients of ``config``'s application."""
        for key in [k for k in cls.committers if k[:-1] == cls._resource_key(config)]:
            cls.committers.pop(key).close()
        for key in [k for k in cls.backends if k[:2] == (config.bootstrap_servers,
                                                         config.application)]:
            cls.backends.pop(key)[0].close()
        resources = cls.resources.pop(cls._resource_key(config), None)
        if resources is not None:
            storage, snapshots, coordinator = resources
            coordinator.checkpoints.close()
            snapshots.close()
            storage.close()


def crash_point(point: str, batch_id: int) -> None:
    """Kill this process with SIGKILL if ``KAFKA_CHANGELOG_CRASH_AT`` names this point."""
    if os.environ.get(CRASH_ENV) == f"{point}:{batch_id}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BatchReport:
    """What one micro-batch did."""

    batch_id: int
    checkpoint_id: int
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
    #: Seconds each subtask spent restoring its backend from Kafka (subtasks that reused
    #: the backend cached in their Python worker are not listed).
    restore_s: dict[int, float] = field(default_factory=dict)
    #: Materialization id of each subtask's snapshot in this checkpoint (0: none yet).
    materializations: dict[int, int] = field(default_factory=dict)


class StatefulProcessor:
    """The ``foreachBatch`` function of a stateful query.

    ``fn(key, rows, state)`` is called once per key present in a micro-batch, with the
    key's rows (ordered by ``order_by``) and ``state(descriptor)`` to reach its state;
    it returns the output rows (schema ``output_schema``, a DDL string).

    ``sink`` is either a :class:`KafkaOutputSink` (outputs committed in the
    checkpoint's Kafka transaction: exactly once) or a function ``sink(df, batch_id)``
    called with every batch's outputs after the checkpoint committed (at least once:
    a batch Spark runs again after a crash gives its outputs again; make it
    idempotent per batch id).
    """

    def __init__(
        self,
        config: StreamingStateConfig,
        fn: StatefulFunction,
        key_column: str,
        output_schema: str,
        sink: Callable[[Any, int], None] | KafkaOutputSink | None = None,
        order_by: Iterable[str] = (),
    ) -> None:
        self.config = config
        self.fn = fn
        self.key_column = key_column
        self.output_schema = output_schema
        self.sink = sink
        self.order_by = tuple(order_by)
        self.reports: list[BatchReport] = []

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
        checkpoint_id = batch_id + 1
        coordinator = _Process.coordinator(config)
        sink = self.sink
        committer = (_Process.committer(config, sink) if isinstance(sink, KafkaOutputSink)
                     else None)
        crash_point("batch_start", batch_id)
        latest = coordinator.checkpoint()
        commit = latest is None or latest.checkpoint_id < checkpoint_id
        if commit:
            base = latest.checkpoint_id if latest is not None else None
        else:
            # Spark runs again a batch we committed: recompute from the one before it.
            older = [i for i in coordinator.checkpoints.checkpoint_ids(config.application)
                     if i < checkpoint_id]
            base = older[-1] if older else None
        p, max_p = config.parallelism, config.max_parallelism
        keyed = (
            batch_df
            .withColumn(KEY_GROUP_COLUMN, F.expr(f"pmod(hash(`{self.key_column}`), {max_p})"))
            .withColumn(SUBTASK_COLUMN,
                        F.floor(F.col(KEY_GROUP_COLUMN) * p / max_p).cast("int"))
            .withColumn(MARKER_COLUMN, F.lit(False))
        )
        # One marker row per subtask: every subtask runs and checkpoints, data or not.
        markers = batch_df.sparkSession.range(p).select(
            F.col("id").cast("int").alias(SUBTASK_COLUMN), F.lit(True).alias(MARKER_COLUMN))
        task = _SubtaskTask(config, self.fn, self.key_column, self.order_by, base,
                            checkpoint_id, self.output_schema)

        def run_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            return task.run_partition(batches)

        result = partition_by_subtask(
            keyed.unionByName(markers, allowMissingColumns=True), SUBTASK_COLUMN, p,
        ).mapInPandas(run_partition, f"{self.output_schema}, {SUBTASK_COLUMN} int, "
                                     f"{PARTITION_COLUMN} int, {RESTORE_COLUMN} double, "
                                     f"{HANDLE_COLUMN} binary")
        tasks_started = time.monotonic()
        collected = result.toPandas()
        task_s = time.monotonic() - tasks_started
        handles = collected[collected[HANDLE_COLUMN].notnull()]
        if sorted(handles[SUBTASK_COLUMN]) != list(range(p)):
            raise ChangelogError(
                f"batch {batch_id}: expected state handles of subtasks 0..{p - 1}, got "
                f"{sorted(handles[SUBTASK_COLUMN])}")
        subtasks = [
            CompletedCheckpoint.from_bytes(bytes(h)).subtasks[0] for h in handles[HANDLE_COLUMN]
        ]
        partitions = {int(s): int(q) for s, q in
                      zip(handles[SUBTASK_COLUMN], handles[PARTITION_COLUMN], strict=True)}
        restores = {int(s): float(r) for s, r in
                    zip(handles[SUBTASK_COLUMN], handles[RESTORE_COLUMN], strict=True) if r >= 0}
        materializations = {
            s.subtask_index: (s.keyed.materialization_id
                              if s.keyed is not None and s.keyed.snapshot is not None else 0)
            for s in subtasks}
        outputs = _typed_like(collected[collected[HANDLE_COLUMN].isnull()].drop(
            columns=[SUBTASK_COLUMN, PARTITION_COLUMN, RESTORE_COLUMN, HANDLE_COLUMN]
        ).reset_index(drop=True), result.schema)
        crash_point("before_commit", batch_id)
        commit_started = time.monotonic()
        if commit:
            persist = None
            if committer is not None and isinstance(sink, KafkaOutputSink):
                persist = committer.persister(
                    sink.records(outputs, batch_id),
                    lambda: crash_point("in_transaction", batch_id))
            coordinator.complete(checkpoint_id, subtasks, persist=persist)
        commit_s = time.monotonic() - commit_started
        crash_point("after_commit", batch_id)
        sink_started = time.monotonic()
        if sink is not None and not isinstance(sink, KafkaOutputSink):
            frame = batch_df.sparkSession.createDataFrame(outputs, self.output_schema)
            sink(frame, batch_id)
        self.reports.append(BatchReport(
            batch_id, checkpoint_id, base, commit, len(outputs), time.monotonic() - started,
            task_s, commit_s, time.monotonic() - sink_started, partitions, restores,
            materializations))


class _SubtaskTask:
    """What a Spark task runs for its subtask's rows (pickled to workers)."""

    def __init__(self, config: StreamingStateConfig, fn: StatefulFunction, key_column: str,
                 order_by: tuple[str, ...], base: int | None, checkpoint_id: int,
                 output_schema: str) -> None:
        self.config = config
        self.fn = fn
        self.key_column = key_column
        self.order_by = order_by
        self.base = base
        self.checkpoint_id = checkpoint_id
        self.output_columns = [c.strip().split()[0].strip("`")
                               for c in output_schema.split(",") if c.strip()]

    def run_partition(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """Run the subtask(s) of one Spark partition (one, see ``partition_by_subtask``)."""
        from pyspark import TaskContext

        frames = list(batches)
        if not frames:
            return
        rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else -1
        for _subtask, subtask_rows in rows.groupby(SUBTASK_COLUMN, sort=True):
            frame = self(subtask_rows)
            frame[PARTITION_COLUMN] = partition
            yield frame[[*self.output_columns, SUBTASK_COLUMN, PARTITION_COLUMN,
                         RESTORE_COLUMN, HANDLE_COLUMN]]

    def __call__(self, rows: pd.DataFrame) -> pd.DataFrame:
        """One subtask's rows (its marker row included) -> its outputs and state handle."""
        subtask = int(rows[SUBTASK_COLUMN].iloc[0])
        backend, restore_s = self._backend(subtask)
        data = rows[rows[MARKER_COLUMN] == False]  # noqa: E712  (pandas needs ==)
        outputs: list[dict[str, Any]] = []
        state = KeyState(backend)
        if len(data):
            data = data.sort_values([self.key_column, *self.order_by], kind="stable")
            for key, group in data.groupby(self.key_column, sort=True):
                key_bytes = key.encode() if isinstance(key, str) else bytes(key)
                backend.set_current_key(key_bytes)
                produced = self.fn(key_bytes, group.drop(
                    columns=[SUBTASK_COLUMN, MARKER_COLUMN, KEY_GROUP_COLUMN]), state)
                outputs.extend(_as_records(produced))
        handle = backend.snapshot(self.checkpoint_id).result()
        _Process.backends[self._cache_key(subtask)] = (backend, self.checkpoint_id)
        encoded = CompletedCheckpoint(
            self.config.application, self.checkpoint_id, 0, self.config.max_parallelism,
            (SubtaskState(self.config.operator_id, subtask, self.config.parallelism, handle,
                          None),)).to_bytes()
        marker: dict[str, Any] = dict.fromkeys(self.output_columns)
        marker.update({HANDLE_COLUMN: encoded})
        records = [{**row, HANDLE_COLUMN: None} for row in outputs] + [marker]
        frame = pd.DataFrame(records, columns=[*self.output_columns, HANDLE_COLUMN])
        frame[SUBTASK_COLUMN] = subtask
        # On the handle row only: seconds restoring, or -1 when the cached backend served.
        frame[RESTORE_COLUMN] = [None] * len(outputs) + [restore_s]
        return frame[[*self.output_columns, SUBTASK_COLUMN, RESTORE_COLUMN, HANDLE_COLUMN]]

    def _cache_key(self, subtask: int) -> tuple[Any, ...]:
        c = self.config
        return (c.bootstrap_servers, c.application, c.operator_id, c.parallelism, subtask)

    def _backend(self, subtask: int) -> tuple[ChangelogKeyedStateBackend, float]:
        """The subtask's backend at ``base`` and the seconds restoring it (-1: cached)."""
        config = self.config
        key_groups: KeyGroupRange = key_group_range_for_operator(
            config.max_parallelism, config.parallelism, subtask)
        cached = _Process.backends.pop(self._cache_key(subtask), None)
        if cached is not None:
            backend, at = cached
            if at == self.base and self.base is not None:
                backend.notify_checkpoint_complete(at)
                return backend, -1.0
            backend.close()
        started = time.monotonic()
        coordinator = _Process.coordinator(config)
        checkpoint = (coordinator.checkpoints.get(config.application, self.base)
                      if self.base is not None else None)
        backend = coordinator.restore_keyed(
            config.operator_id, key_groups, checkpoint, config.changelog(),
            MaterializationConfig(interval_s=config.materialization_interval_s,
                                  start_jitter_s=min(60.0, (config.materialization_interval_s
                                                            or 0) / 10)))
        return backend, time.monotonic() - started


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


def _as_records(produced: Any) -> Iterator[dict[str, Any]]:
    if produced is None:
        return iter(())
    if isinstance(produced, pd.DataFrame):
        return iter(produced.to_dict("records"))
    return iter(produced)


def stateful_foreach_batch(
    config: StreamingStateConfig,
    fn: StatefulFunction,
    key_column: str,
    output_schema: str,
    sink: Callable[[Any, int], None] | KafkaOutputSink | None = None,
    order_by: Iterable[str] = (),
) -> StatefulProcessor:
    """A function for ``df.writeStream.foreachBatch(...)`` that keeps ``fn``'s state."""
    from .session import ensure_worker_python

    ensure_worker_python()
    return StatefulProcessor(config, fn, key_column, output_schema, sink, order_by)
