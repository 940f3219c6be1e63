"""Where and how a streaming operator keeps its state: :class:`StreamingStateConfig`.

Its own module so that the streaming package's driver, task and tester share it without
importing one another.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_changelog.kafka import KafkaChangelogConfig
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig
from kafka_changelog.kafka.client_settings import KafkaConnection
from kafka_changelog.kafka.snapshot_store import SnapshotStoreConfig
from kafka_changelog.kafka.topics import application_topics
from kafka_changelog.state.backend.config import BackendKind
from kafka_changelog.state.checkpoints.driver_claim import DEFAULT_DRIVER_LEASE_S
from kafka_changelog.state.host.local_cleanup import DEFAULT_IDLE_STORE_RETENTION_S
from kafka_changelog.state.rocksdb.options import RocksDBOptions
from kafka_changelog.state.snapshots.chunk_sweep import (
    DEFAULT_SWEEP_GRACE_S,
    DEFAULT_SWEEP_INTERVAL_S,
)

from ..sessions.kafka_options import java_kafka_options, reader_options


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
    #: The changelog and snapshot topics ("": the application's own,
    #: :func:`application_topics`; name shared ones to share them, with the checkpoint topic).
    changelog_topic: str = ""
    snapshot_topic: str = ""
    #: Shared by default: applications sharing changelog or snapshot topics must share it.
    checkpoint_topic: str = "kafka-changelog-checkpoints"
    #: Partitions of the changelog and snapshot topics when they are created.
    partitions: int = 16
    #: Seconds between materializations (None: never).
    materialization_interval_s: float | None = 600.0
    #: With ``state_backend="rocksdb"``, a materialization is written from a copy of the
    #: subtask's store in a process of its own, this much below the tasks' priority
    #: (``nice``; 0: the same priority), so that it takes the cores the tasks leave and
    #: never shares a Python worker's interpreter with them. None: on a thread of the
    #: Python worker that ran the task (slows the worker's next tasks while it runs).
    materialization_nice: int | None = 10
    #: Checkpoints kept (at least 2).
    retain: int = 3
    #: Checkpoints beyond ``retain`` are kept as well while younger than this (seconds;
    #: None: by count only): what ``kafka-changelog rewind`` can go back to. Garbage
    #: collection drops a checkpoint once it is beyond the count *and* older than this.
    retain_for_s: float | None = None
    #: How often (seconds) the driver sweeps the snapshot topic for chunks no checkpoint
    #: can name any more (a materialization killed mid-write, or one whose store was
    #: deleted before a task applied it), in a background thread after a checkpoint
    #: commit, and once after each start; the sweep reads the whole snapshot topic.
    #: None: never. See docs/operations.md.
    snapshot_sweep_interval_s: float | None = DEFAULT_SWEEP_INTERVAL_S
    #: Chunks of a backend that no checkpoint names are swept once their materialization
    #: started this long ago (seconds): more than a checkpoint interval.
    snapshot_sweep_grace_s: float = DEFAULT_SWEEP_GRACE_S
    #: Any librdkafka setting for every client (security included).
    client_config: dict[str, Any] = field(default_factory=dict)
    #: Each subtask's working copy: "rocksdb" (the default: a store per subtask in
    #: ``local_state_dir`` that any Python worker on the host reattaches; state may exceed
    #: the worker's memory; needs ``rocksdict``, in the ``spark`` extra) or "memory" (kept
    #: by the Python worker that ran the subtask last; a task in another worker restores
    #: from Kafka). See docs/operations.md, "State backends". A :class:`BackendKind` or its
    #: value; a :class:`BackendKind` after construction.
    state_backend: BackendKind | str = BackendKind.ROCKSDB
    #: Where "rocksdb" keeps the host-local subtask stores (None: the user's own
    #: ``kafka-changelog-state-<uid>`` under the system temp dir): an absolute path on a
    #: local disk of every executor host.
    local_state_dir: str | None = None
    #: A host-local store that no task has used for this long (seconds) is deleted by the
    #: next task of any application on that host that keeps its stores in the same
    #: directory (stores of stopped applications; of subtasks that never came back).
    #: None: never. Stores of subtasks that moved to another host are deleted sooner: once
    #: a task of their operator on this host starts from a newer checkpoint.
    local_state_retention_s: float | None = DEFAULT_IDLE_STORE_RETENTION_S
    #: How long (seconds) the driver's hold on the application lasts without a heartbeat
    #: (heartbeats go every quarter of it): another driver of another Spark query waits
    #: this long for a holder that died on another host before it takes over (at once
    #: when the holder ran on its host, released the application, or runs the same query).
    driver_lease_s: float = DEFAULT_DRIVER_LEASE_S
    #: RocksDB's settings for the "rocksdb" subtask stores (block cache, write buffers,
    #: compression...; default: :class:`RocksDBOptions`'s defaults, a 64 MiB block cache
    #: shared by the stores of a Python worker and 32 MiB write buffers).
    rocksdb_options: RocksDBOptions = field(default_factory=RocksDBOptions)
    #: Input the state already holds (see docs/exactly-once.md, "Input offsets: the state's
    #: checkpoint is the truth"): a batch whose Kafka input starts before the offsets the
    #: state's checkpoint recorded, or that reads files the state holds, is refused
    #: (``InputOffsetsError``); with this, those rows are dropped instead (Kafka rows need
    #: the source's ``topic``, ``partition`` and ``offset`` columns), so that a query with
    #: a fresh checkpointLocation continues the state exactly by itself.
    skip_applied_input: bool = False
    #: A batch whose Kafka input starts after the offsets the state recorded would skip
    #: input the state never saw: refused unless this is set (Spark's
    #: ``failOnDataLoss=false``).
    allow_input_gaps: bool = False
    #: A new query (another checkpointLocation) re-reading a source whose progress cannot
    #: be compared (a rate source, a table format's...) that the state's last query read
    #: too is refused unless this is set (its input would be applied again).
    allow_uncompared_sources: bool = False
    #: Seconds a transactional Kafka call answered with a retriable error (a timeout of a
    #: broker slow under load: ``init_transactions``, ``commit_transaction``) is made
    #: again before the batch fails with an error naming the call and the wait (see
    #: ``KafkaConnection.retry_bound_s``).
    retry_bound_s: float = 120.0

    def __post_init__(self) -> None:
        own_changelog, own_snapshots = application_topics(self.application)
        if not self.changelog_topic:
            object.__setattr__(self, "changelog_topic", own_changelog)
        if not self.snapshot_topic:
            object.__setattr__(self, "snapshot_topic", own_snapshots)
        object.__setattr__(self, "state_backend",
                           BackendKind.of(self.state_backend, "state_backend"))
        if not isinstance(self.rocksdb_options, RocksDBOptions):
            raise TypeError(f"rocksdb_options must be RocksDBOptions, got "
                            f"{type(self.rocksdb_options).__name__}")
        if self.local_state_retention_s is not None and not self.local_state_retention_s > 0:
            raise ValueError(f"local_state_retention_s must be None or positive, got "
                             f"{self.local_state_retention_s!r}")
        if self.snapshot_sweep_interval_s is not None and not self.snapshot_sweep_interval_s > 0:
            raise ValueError(f"snapshot_sweep_interval_s must be None or positive, got "
                             f"{self.snapshot_sweep_interval_s!r}")
        if not self.snapshot_sweep_grace_s > 0:
            raise ValueError(f"snapshot_sweep_grace_s must be positive, got "
                             f"{self.snapshot_sweep_grace_s!r}")
        if self.retain_for_s is not None and not self.retain_for_s > 0:
            raise ValueError(f"retain_for_s must be None or positive, got "
                             f"{self.retain_for_s!r}")
        if not self.driver_lease_s > 0:
            raise ValueError(f"driver_lease_s must be positive, got {self.driver_lease_s!r}")
        if self.materialization_nice is not None and not 0 <= self.materialization_nice <= 19:
            raise ValueError(f"materialization_nice must be None or 0..19, got "
                             f"{self.materialization_nice!r}")

    def local_state_root(self) -> Path:
        """The host-local state directory of ``state_backend="rocksdb"`` (its stores are
        under ``<root>/<application>/<operator>``). The default is the user's own
        (``kafka-changelog-state-<uid>`` in the temp dir, created readable by that user
        only), so that two users' applications on one host never share a directory."""
        if self.local_state_dir:
            return Path(self.local_state_dir)
        root = Path(tempfile.gettempdir()) / f"kafka-changelog-state-{os.getuid()}"
        root.mkdir(mode=0o700, exist_ok=True)
        return root

    def spark_kafka_options(self, java_overrides: dict[str, str] | None = None
                            ) -> dict[str, str]:
        """The options of Spark's Kafka connector (``format("kafka")``, reading the input
        or writing with Spark) for the same brokers with the same security as the
        state's clients: ``client_config``'s SASL and TLS settings as Java client
        settings (see :mod:`spark_integration.sessions.kafka_options`); ``java_overrides`` win."""
        return java_kafka_options(self.bootstrap_servers, self.client_config, java_overrides)

    def reader_options(self) -> dict[str, str]:
        """The options of ``format("kafka-changelog")`` for this application: the brokers,
        ``client_config`` and the application."""
        return {**reader_options(self.bootstrap_servers, self.client_config),
                "application": self.application, "checkpoint.topic": self.checkpoint_topic}

    def writer_options(self) -> dict[str, str]:
        """The options of ``df.write.format("kafka-changelog")`` for this application:
        :meth:`reader_options`, its operator, its topics (a write puts its logs and
        snapshot layers there), its max parallelism and the partitions of topics a write
        creates. A bootstrap (an application without checkpoint) adds ``parallelism``."""
        return {**self.reader_options(), "operator": self.operator_id,
                "changelog.topic": self.changelog_topic, "snapshot.topic": self.snapshot_topic,
                "maxParallelism": str(self.max_parallelism),
                "partitions": str(self.partitions)}

    def connection(self) -> KafkaConnection:
        """How every client of the operator connects."""
        return KafkaConnection(bootstrap_servers=self.bootstrap_servers,
                               client_config=dict(self.client_config),
                               retry_bound_s=self.retry_bound_s)

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
                                        retain=self.retain, retain_for_s=self.retain_for_s)
