"""``df.write.format("kafka-changelog")``: rows of entries applied to a stopped application's
latest checkpoint (``mode("append")``) or replacing its keyed state (``mode("overwrite")``),
distributed over Spark tasks.

The driver plans the write when Spark asks for the writer (the latest checkpoint, or a new
application's layout; the operator; the states' registrations: recorded ones and declared
ones, evolved as a streaming query's declarations are; the input offsets given); each task
appends its rows' state ops to a log of its own
(:func:`~kafka_changelog.state.history.entry_changes.write_entry_changes`), or, replacing
the state, writes them as snapshot layers
(:func:`~kafka_changelog.state.history.state_layers.write_entry_layers`); the driver
commits one new checkpoint naming what every task wrote once all tasks succeeded
(:func:`~kafka_changelog.state.history.state_write.commit_state_write`). A failed or killed
write commits nothing: the application stays at its latest checkpoint. The streaming query
then resumes from the new checkpoint (the same input offsets unless ``startingOffsets``
gave others), with every row applied exactly once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from kafka_changelog.gc_types import LogFloor
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.access import connect_admin
from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.kafka.topics import application_topics
from kafka_changelog.state.checkpoints.source_offsets import source_offsets_property
from kafka_changelog.state.history.entry_changes import (
    StateWriteError,
    WrittenChanges,
    write_entry_changes,
)
from kafka_changelog.state.history.state_layers import LayerTarget, write_entry_layers
from kafka_changelog.state.history.state_write import (
    NewApplication,
    StateWritePlan,
    WriteMode,
    commit_state_write,
    plan_state_write,
)
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.schema.ttl import split_serializer_name

from ..checkpoint_properties import evolved_metas, state_properties
from .input_offsets import written_input_offsets
from .options import DEFAULT_MAX_PARALLELISM, WriterOptions, parse_writer_options
from .rows import REQUIRED_COLUMNS, entry_changes

logger = logging.getLogger(__name__)


@dataclass
class TaskWritten(WriterCommitMessage):
    """What one Spark task wrote (its partition id orders the logs)."""

    partition: int
    written: WrittenChanges


class StateWriter(DataSourceArrowWriter):
    """A state write (module docstring). Made on the driver; pickled to the tasks."""

    def __init__(self, options: WriterOptions, plan: StateWritePlan,
                 metas: dict[str, StateMeta], properties: dict[str, str],
                 mode: WriteMode, log_floors: tuple[LogFloor, ...] = (),
                 snapshot_partitions: int = 0) -> None:
        self.options = options
        self.plan = plan
        self.metas = metas
        self.properties = properties
        self.mode = mode
        #: A bootstrap's: the changelog's end offsets before the tasks wrote.
        self.log_floors = log_floors
        #: A replacing write's: the partitions of the snapshot topic (as it is).
        self.snapshot_partitions = snapshot_partitions

    @classmethod
    def planned(cls, raw_options: dict[str, str], column_names: list[str], overwrite: bool
                ) -> StateWriter:
        """Check the options and columns, and plan the write (driver)."""
        mode = WriteMode.REPLACE if overwrite else WriteMode.APPLY
        missing = [c for c in REQUIRED_COLUMNS if c not in column_names]
        if missing:
            raise StateWriteError(
                f"a state write needs the column(s) {missing}; the DataFrame has "
                f"{column_names}")
        options = parse_writer_options(raw_options)
        connection = options.connection
        with KafkaCheckpointStore(connection.checkpoint_config()) as store:
            own_changelog, own_snapshots = application_topics(connection.application)
            plan = plan_state_write(
                store, connection.application, connection.operator, mode, options.parallelism,
                _new_application(options), connection.snapshot_topic or own_snapshots,
                connection.changelog_topic or own_changelog)
        if options.max_parallelism not in (None, plan.max_parallelism):
            raise StateWriteError(
                f"application {plan.application!r} has max parallelism "
                f"{plan.max_parallelism} (checkpoint {plan.base.checkpoint_id}), not "
                f"{options.max_parallelism}: key groups are fixed for an application's life")
        metas = evolved_metas(connection.application, plan.operator, plan.base.properties,
                              options.requested)
        properties = state_properties(metas) if options.requested else {}
        if options.starting_offsets is not None:
            properties.update(source_offsets_property(
                written_input_offsets(options.starting_offsets, connection)))
        floors: tuple[LogFloor, ...] = ()
        if plan.new is not None:
            with KafkaChangelogStorage(_changelog_config(options, plan, options.partitions)
                                       ) as storage:  # creates the topic when missing
                floors = tuple(storage.uncommitted_floors())
        partitions = 0
        if plan.layers is not None:
            partitions = _snapshot_partitions(options, plan.layers.snapshot_topic)
            with KafkaSnapshotStore(_snapshot_config(options, plan.layers, partitions)):
                pass  # the topic created when missing, checked when there
        logger.info("state write to application %s operator %s (%s): rows to checkpoint %s "
                    "as checkpoint %d (states %s)", plan.application, plan.operator,
                    mode.value, "none (a new application)" if plan.new else
                    plan.base.checkpoint_id, plan.checkpoint_id, sorted(metas))
        return cls(options, plan, metas, properties, mode, floors, partitions)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskWritten:
        """Write this task's rows (task): as state ops appended to a log of its own, or,
        replacing the state, as snapshot layers of the new backends (with their expiry
        timers in a log of its own)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        plan = self.plan
        changes = entry_changes(iterator, self.metas, plan.max_parallelism)
        if plan.layers is not None:  # a new materialization: snapshot layers
            config = _snapshot_config(self.options, plan.layers, self.snapshot_partitions)
            with contextlib.ExitStack() as stack:
                snapshots = stack.enter_context(KafkaSnapshotStore(config))
                # TTL'd states' expiry timers go to a log of the task (state_layers).
                timers = (stack.enter_context(KafkaChangelogStorage(
                    _changelog_config(self.options, plan)))
                    if any(split_serializer_name(m.value_serializer)[1]
                           for m in self.metas.values()) else None)
                return TaskWritten(partition, write_entry_layers(
                    snapshots, plan.layers, partition, self.metas, changes, timers,
                    plan.checkpoint_id))
        # The application's topic as it is (the driver made a new application's).
        with KafkaChangelogStorage(_changelog_config(self.options, plan)) as storage:
            written = write_entry_changes(storage, plan.operator, plan.max_parallelism,
                                          plan.checkpoint_id, self.metas, changes)
        return TaskWritten(partition, written)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Commit the new checkpoint naming every task's log (driver)."""
        written = [(m.partition, m.written) for m in messages if isinstance(m, TaskWritten)]
        with KafkaCheckpointStore(self.options.connection.checkpoint_config()) as store:
            checkpoint = commit_state_write(store, self.plan, written, self.properties,
                                            mode=self.mode, log_floors=self.log_floors)
        logger.info("state write to application %s: checkpoint %d committed (%d rows from "
                    "%d tasks)", self.plan.application, checkpoint.checkpoint_id,
                    sum(w.rows for _, w in written), len(written))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: no checkpoint names the tasks' logs (driver)."""
        logger.warning("state write to application %s aborted: the application stays at "
                       "%s", self.plan.application, "no checkpoint" if self.plan.new else
                       f"checkpoint {self.plan.base.checkpoint_id}")


def _new_application(options: WriterOptions) -> NewApplication | None:
    """The layout of the application's first checkpoint, when the options give one
    (``operator`` and ``parallelism``); used only if it has no checkpoint."""
    connection = options.connection
    if connection.operator is None or options.parallelism is None:
        return None
    return NewApplication(
        connection.operator, options.parallelism,
        options.max_parallelism or DEFAULT_MAX_PARALLELISM,
        connection.changelog_topic or application_topics(connection.application)[0])


def _changelog_config(options: WriterOptions, plan: StateWritePlan, partitions: int = 1
                      ) -> KafkaChangelogConfig:
    """The changelog storage's config of the write: ``partitions`` for a topic created
    (only a new application's is: the driver makes it), else the topic as it is (its
    partitions map the key groups; the lowest size and replication check nothing)."""
    return KafkaChangelogConfig.on(
        options.connection.connection(), topic=plan.changelog_topic,
        max_parallelism=plan.max_parallelism, partitions=partitions,
        **({} if plan.new is not None else {"replication_factor": 1}))


def _snapshot_partitions(options: WriterOptions, topic: str) -> int:
    """The partitions of snapshot topic ``topic``: as it is, or ``partitions`` when the
    write creates it."""
    connection = options.connection
    admin, metadata = connect_admin(connection.connection().admin(),
                                    connection.request_timeout_s, f"snapshot topic {topic}")
    del admin
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return options.partitions
    return len(found.partitions)


def _snapshot_config(options: WriterOptions, target: LayerTarget, partitions: int
                     ) -> SnapshotStoreConfig:
    return SnapshotStoreConfig.on(options.connection.connection(), topic=target.snapshot_topic,
                                  partitions=partitions, max_parallelism=target.max_parallelism)


def state_writer(options: dict[str, Any], column_names: list[str], overwrite: bool
                 ) -> StateWriter:
    """The writer of ``df.write.format("kafka-changelog")`` (see the module docstring)."""
    return StateWriter.planned({str(k): str(v) for k, v in options.items()}, column_names,
                               overwrite)


__all__ = ["StateWriter", "TaskWritten", "state_writer"]
