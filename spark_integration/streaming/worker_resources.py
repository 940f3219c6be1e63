"""What one Python process (the driver, or a Spark Python worker) keeps across batches:
Kafka clients, cached backends, task committers and background materializations.

The driver holds a coordinator (the checkpoint store, commits, GC); a worker holds
only what its tasks write to: the changelog storage and the snapshot store. Workers
never open the checkpoint store: the driver hands each task its state handles.
Everything is keyed by the application's Kafka resources, so several applications (or
operators) share a process without sharing state.
"""

from __future__ import annotations

import concurrent.futures
import logging
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore
from kafka_changelog.kafka.job_process import spawn_job
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore
from kafka_changelog.kafka.task_commit import SubtaskCommitter
from kafka_changelog.kafka.topic_owners import claim_topics
from kafka_changelog.state.backend.config import BackendKind
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.host.local_store import remove_operator_stores
from kafka_changelog.state.host.store_materialization import StartedJob, run_job
from kafka_changelog.state.host.subtask_backend import CachedBackend

from .config import StreamingStateConfig
from .kafka_sink import KafkaOutputSink

logger = logging.getLogger(__name__)

#: Seconds ``release`` waits for a running sweep of the snapshot topic (a sweep still
#: reading then deletes nothing).
SWEEP_WAIT_S = 60.0

#: Seconds ``release`` waits for the driver's garbage collection of subsumed checkpoints
#: (it runs after each commit, off the batch's path; one cut short is finished by the
#: application's next commit).
COLLECTION_WAIT_S = 60.0

#: Seconds :meth:`WorkerResources.release` waits for this process's background
#: materializations to be written before it stops them.
JOB_PROCESS_WAIT_S = 60.0

#: Seconds a stopped materialization gets to tombstone the chunks it wrote; a process
#: still running then is killed (its chunks are left to the driver's snapshot sweep).
STOP_GRACE_S = 15.0


def resource_key(config: StreamingStateConfig) -> tuple[str, ...]:
    """Under which key a process keeps the Kafka clients of ``config``'s application."""
    return (config.bootstrap_servers, config.application, config.changelog_topic,
            config.snapshot_topic, config.checkpoint_topic)


def backend_key(config: StreamingStateConfig, subtask: int) -> tuple[Any, ...]:
    """Under which key a process caches ``subtask``'s backend (any setting that changes
    where its state lives is part of it)."""
    return (config.bootstrap_servers, config.application, config.operator_id,
            config.parallelism, subtask, config.state_backend, config.local_state_dir,
            config.rocksdb_options)


def subtask_transactional_id(config: StreamingStateConfig, sink: KafkaOutputSink,
                             subtask: int) -> str:
    """The transactional id subtask ``subtask`` commits its outputs with."""
    return f"{sink.transactional_id_for(config.application, config.operator_id)}-{subtask}"


class WorkerResources:
    """The Kafka clients and cached backends of this process (class-level: one set per
    process, shared by every processor and task in it)."""

    storages: ClassVar[dict[tuple[str, ...], tuple[KafkaChangelogStorage,
                                                   KafkaSnapshotStore]]] = {}
    coordinators: ClassVar[dict[tuple[str, ...], CheckpointCoordinator]] = {}
    backends: ClassVar[dict[tuple[Any, ...], CachedBackend]] = {}
    committers: ClassVar[dict[tuple[str, ...], SubtaskCommitter]] = {}
    materializer: ClassVar[ThreadPoolExecutor | None] = None
    #: The materializations written on :attr:`materializer`, and what stops them.
    materializations: ClassVar[list[Future[Any]]] = []
    stop_materializations: ClassVar[threading.Event] = threading.Event()
    job_processes: ClassVar[list[subprocess.Popen[bytes]]] = []

    @classmethod
    def stores(cls, config: StreamingStateConfig
               ) -> tuple[KafkaChangelogStorage, KafkaSnapshotStore]:
        """The changelog storage and snapshot store of ``config`` in this process."""
        key = resource_key(config)
        if key not in cls.storages:
            cls.storages[key] = (KafkaChangelogStorage(config.changelog()),
                                 KafkaSnapshotStore(config.snapshots()))
        return cls.storages[key]

    @classmethod
    def coordinator(cls, config: StreamingStateConfig) -> CheckpointCoordinator:
        """The driver's coordinator of ``config``'s application."""
        key = resource_key(config)
        if key not in cls.coordinators:
            claim_topics(config.connection(), config.checkpoint_topic,
                         {"changelog": config.changelog_topic, "snapshot": config.snapshot_topic})
            storage, snapshots = cls.stores(config)
            cls.coordinators[key] = CheckpointCoordinator(
                config.application, KafkaCheckpointStore(config.checkpoints()), snapshots,
                storage, config.max_parallelism,
                sweep_interval_s=config.snapshot_sweep_interval_s,
                sweep_grace_s=config.snapshot_sweep_grace_s,
                # Off the batch's path: the next batch need not wait for it (~0.1 s).
                collect_in_background=True)
        return cls.coordinators[key]

    @classmethod
    def take_backend(cls, config: StreamingStateConfig, subtask: int) -> CachedBackend | None:
        """The backend this process kept for ``subtask`` (removed from the cache: the
        task that takes it owns it)."""
        return cls.backends.pop(backend_key(config, subtask), None)

    @classmethod
    def keep_backend(cls, config: StreamingStateConfig, subtask: int,
                     cached: CachedBackend) -> None:
        """Keep ``subtask``'s backend for its next task in this process."""
        cls.backends[backend_key(config, subtask)] = cached

    @classmethod
    def task_committer(cls, config: StreamingStateConfig, sink: KafkaOutputSink,
                       subtask: int) -> SubtaskCommitter:
        """The transactional committer of ``subtask``'s outputs in this process."""
        tid = subtask_transactional_id(config, sink, subtask)
        key = (*resource_key(config), tid)
        if key not in cls.committers:
            cls.committers[key] = SubtaskCommitter(config.checkpoints(), tid,
                                                   sink.producer_config)
        return cls.committers[key]

    @classmethod
    def drop_committer(cls, config: StreamingStateConfig, sink: KafkaOutputSink,
                       subtask: int) -> None:
        """Close ``subtask``'s committer in this process (a failed task: start afresh)."""
        key = (*resource_key(config), subtask_transactional_id(config, sink, subtask))
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
        cls.materializations = [f for f in cls.materializations if not f.done()]
        cls.materializations.append(
            cls.materializer.submit(run_job, started, snapshots, cls.stop_materializations))

    @classmethod
    def stop_background(cls) -> None:
        """Let this process's background materializations finish for up to
        :data:`JOB_PROCESS_WAIT_S`, then stop them: each tombstones the chunks it wrote
        within :data:`STOP_GRACE_S` (a process still running then is killed). Returns with
        none running, the materialization thread ended (unless a job's write outlasts
        the grace: that thread then ends with its current key group, logged)."""
        pending = [f for f in cls.materializations if not f.done()]
        processes = [p for p in cls.job_processes if p.poll() is None]
        if pending or processes:
            logger.info("waiting up to %.0f s for %d background materializations",
                        JOB_PROCESS_WAIT_S, len(pending) + len(processes))
        deadline = time.monotonic() + JOB_PROCESS_WAIT_S
        waited = concurrent.futures.wait(pending, JOB_PROCESS_WAIT_S)
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("materialization process %d still running after %.0f s: "
                               "stopped (its key groups are written by a later one)",
                               process.pid, JOB_PROCESS_WAIT_S)
                process.terminate()  # stops before its next key group, tombstones
                try:
                    process.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        cls.job_processes = []
        cls.stop_materializations.set()
        concurrent.futures.wait(waited.not_done, STOP_GRACE_S)
        if cls.materializer is not None:
            cls.materializer.shutdown(wait=not any(not f.done() for f in pending),
                                      cancel_futures=True)
            cls.materializer = None
        cls.materializations = []
        cls.stop_materializations = threading.Event()

    @classmethod
    def release(cls, config: StreamingStateConfig) -> None:
        """Close this process's backends and Kafka clients of ``config``'s application, and
        delete the operator's local state stores on this host (those nobody holds), once
        this process's background materializations are written or stopped
        (:meth:`stop_background`).

        On return, nothing of the application runs in this process: its producers,
        consumers and admin clients are closed
        (:func:`~kafka_changelog.kafka.live_clients.live_clients` lists none of them),
        its driver lease released and its heartbeat thread ended, its garbage collection
        ended (see :data:`COLLECTION_WAIT_S`), its snapshot sweep ended or told to delete
        nothing (see :data:`SWEEP_WAIT_S`). Bounded: about :data:`JOB_PROCESS_WAIT_S` +
        :data:`STOP_GRACE_S` + :data:`COLLECTION_WAIT_S` + :data:`SWEEP_WAIT_S` plus one
        Kafka transaction (the lease's release, within the config's ``retry_bound_s``)
        and 30 s per producer flush at most."""
        cls.stop_background()
        resources = resource_key(config)
        for key in [k for k in cls.committers if k[:-1] == resources]:
            cls.committers.pop(key).close()
        for key in [k for k in cls.backends if k[:2] == (config.bootstrap_servers,
                                                         config.application)]:
            cls.backends.pop(key).backend.close()
        if config.state_backend == BackendKind.ROCKSDB:
            remove_operator_stores(config.local_state_root(), config.application,
                                   config.operator_id)
        coordinator = cls.coordinators.pop(resources, None)
        if coordinator is not None:
            # Its clients are closed next: let a running collection and sweep finish (a
            # collection cut short is finished by the next commit; a sweep cut short only
            # leaves chunks for the next one).
            if not coordinator.wait_for_collection(COLLECTION_WAIT_S):
                logger.warning("application %s: the garbage collection of subsumed "
                               "checkpoints still runs after %.0f s; the next commit "
                               "finishes it", config.application, COLLECTION_WAIT_S)
            if not coordinator.stop_sweeps(SWEEP_WAIT_S):
                logger.warning("application %s: the snapshot sweep still reads after %.0f "
                               "s; it deletes nothing now", config.application, SWEEP_WAIT_S)
            coordinator.checkpoints.close()
        stores = cls.storages.pop(resources, None)
        if stores is not None:
            storage, snapshots = stores
            snapshots.close()
            storage.close()


__all__ = ["COLLECTION_WAIT_S", "JOB_PROCESS_WAIT_S", "STOP_GRACE_S", "SWEEP_WAIT_S",
           "WorkerResources", "backend_key", "resource_key", "subtask_transactional_id"]
