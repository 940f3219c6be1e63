"""Host-local subtask state for streaming: a RocksDB store per subtask that any Python
worker on the host reattaches.

Spark gives a micro-batch's task for subtask ``i`` to whichever Python worker is free,
so a backend cached in one worker process is often not where the next batch runs. With
``state_backend="rocksdb"`` each subtask's working copy is a RocksDB store in the host's
local state directory (:class:`~kafka_changelog.state.local_store.SubtaskStore`: store,
manifest, lock). A task for subtask ``i`` starting from checkpoint ``c``:

- **reattached**: its own worker still holds the backend that wrote the store at ``c``:
  it reopens the store and goes on (nothing rebuilt);
- **reattached-local**: another worker (or a new one) left the store exactly at ``c``
  (the manifest names ``c`` and the very handle the driver assigned): a backend is
  built on the store as it is, continuing that backend's snapshot, changelog and
  materialization schedule. Milliseconds, no Kafka read;
- **rolled-back**: the store went past ``c`` (a batch whose checkpoint never completed:
  the function failed, the driver died before the commit) but the copy kept at ``c`` is
  there: the store becomes that copy (hard links) and is reattached as above;
- **restored**: anything else (no store, no copy at ``c``, a rescale): the store is
  emptied and restored from Kafka (snapshot chunks streamed into RocksDB, then the
  changelog tail);
- **fresh**: no checkpoint yet.

After the snapshot the task flushes the store, writes the manifest, keeps a copy of the
store at that checkpoint (the next task deletes every copy but its base's) and lets the
store go (closed and unlocked), so the next batch's task can take it wherever it runs.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka_changelog import KeyGroupRange, key_group_range_for_operator
from kafka_changelog.state import store_materialization as jobs
from kafka_changelog.state.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.local_store import StoreManifest, SubtaskStore
from kafka_changelog.state.materialization import materialized_at
from kafka_changelog.state.materializer import MaterializationConfig
from kafka_changelog.state.restore import restore_backend
from kafka_changelog.state.rocksdb_table import RocksDBStateTable
from kafka_changelog.state.snapshot_store import SnapshotStore
from kafka_changelog.storage import StateChangelogStorage

from .streaming_config import StreamingStateConfig

logger = logging.getLogger(__name__)

#: A reattached backend continues its predecessor's changelog handles, adding one per
#: process it moves to until the next materialization; past this many it materializes
#: at once, which bounds checkpoint records and restore reads.
MAX_BASE_HANDLES = 16
#: The backends' own materialization setting: none (the task schedules them).
_NO_TIMER = MaterializationConfig(interval_s=None)
#: Seconds a task waits for the store's lock (held by an attempt of the same task that
#: is still running) before failing.
LOCK_TIMEOUT_S = 120.0


@dataclass
class CachedBackend:
    """A backend a Python worker keeps between micro-batches."""

    backend: ChangelogKeyedStateBackend
    #: The checkpoint it is exactly at.
    checkpoint_id: int
    #: For a local store: the token of the manifest it wrote ("" in memory).
    owner: str = ""


@dataclass
class LocalAttachment:
    """A task's hold on its subtask's local store, from attach to release."""

    backend: ChangelogKeyedStateBackend
    store: SubtaskStore
    #: "reattached", "reattached-local", "rolled-back", "restored" or "fresh".
    source: str
    #: Seconds getting the backend (opening, reattaching or restoring).
    seconds: float
    #: The token the manifest will carry.
    owner: str
    #: When the next materialization is due (seconds since the epoch; None: never).
    due_at: float | None = None
    #: The background materialization not applied yet: (id, key groups it writes).
    pending: tuple[int, tuple[int, ...]] | None = None
    #: Background materializations that failed or were discarded since one was last
    #: applied.
    failures: int = 0
    #: Background materializations this task applied, and the bytes they wrote.
    applied: int = 0
    applied_bytes: int = 0
    #: The background materialization this task started (to run after the release).
    started: jobs.StartedJob | None = field(default=None, repr=False)


def expected_handle(config: StreamingStateConfig, subtask: int, key_groups: KeyGroupRange,
                    handles: list[KeyedStateHandle]) -> bytes | None:
    """The manifest handle of a store exactly at the base checkpoint: the subtask's
    ``SubtaskState`` bytes, when one old subtask had exactly this range (else None: a
    rescale, which always restores)."""
    if len(handles) != 1 or handles[0].key_group_range != key_groups:
        return None
    return SubtaskState(config.operator_id, subtask, config.parallelism, handles[0],
                        None).to_bytes()


def _at_base(manifest: StoreManifest | None, config: StreamingStateConfig, subtask: int,
             key_groups: KeyGroupRange, base: int | None, expected: bytes | None) -> bool:
    return (manifest is not None and base is not None and expected is not None
            and manifest.checkpoint_id == base and manifest.handle == expected
            and manifest.key_group_range == key_groups
            and manifest.max_parallelism == config.max_parallelism
            and (manifest.application, manifest.operator_id, manifest.subtask,
                 manifest.parallelism) == (config.application, config.operator_id, subtask,
                                           config.parallelism))


def attach(config: StreamingStateConfig, subtask: int, base: int | None,
           handles: list[KeyedStateHandle], cached: CachedBackend | None,
           storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
           materialization: MaterializationConfig) -> LocalAttachment:
    """Lock the subtask's store and get a backend on it at checkpoint ``base``
    (reattached when the store is exactly there, restored from Kafka otherwise).

    The store is marked as changing (no manifest) before this returns: a crash from
    here on leaves nothing that looks like a checkpoint. ``cached`` is the backend this
    worker kept for the subtask, if any (reused or closed).
    """
    attachment = _attach(config, subtask, base, handles, cached, storage, snapshots)
    try:
        _settle_jobs(attachment, snapshots)
        attachment.due_at = _due_at(attachment, materialization)
    except BaseException:
        abandon(attachment)
        raise
    return attachment


def _due_at(attachment: LocalAttachment, materialization: MaterializationConfig
            ) -> float | None:
    """When the attached backend's next materialization is due: the manifest's schedule
    when the store was reattached, else an interval after its snapshot was made (now
    plus the interval and a jitter when it has none)."""
    interval = materialization.interval_s
    if not interval:
        return None
    backend = attachment.backend
    if len(backend.base_changelog) >= MAX_BASE_HANDLES:
        return 0.0  # due now
    if attachment.due_at is not None:
        return attachment.due_at
    if backend.materialization_id:
        return materialized_at(backend.materialization_id) + interval
    return time.time() + interval + random.uniform(0, materialization.start_jitter_s)


def _settle_jobs(attachment: LocalAttachment, snapshots: SnapshotStore) -> None:
    """Apply the store's pending background materialization if it is done (and fits the
    backend), give its key groups back to the backend if it failed, and discard every
    other job that is not running."""
    backend, pending = attachment.backend, attachment.pending
    for state in jobs.list_jobs(attachment.store.directory):
        if pending is not None and state.materialization_id == pending[0]:
            if state.state == jobs.RUNNING:
                continue
            written = jobs.written_bytes(state)
            if (state.state == jobs.DONE and state.result is not None
                    and state.job is not None
                    and backend.apply_materialization(state.result, state.job.covered,
                                                      written)):
                attachment.applied += 1
                attachment.applied_bytes += written
                attachment.failures = 0
                _forget_changes(backend, state.job)
                jobs.discard(state, None)  # no tombstones: its chunks are in use now
                attachment.pending = pending = None
                continue
            logger.info("background materialization %d of %s not applied (%s): its key "
                        "groups stay to be written", state.materialization_id,
                        attachment.store.directory, state.state)
        if state.state != jobs.RUNNING:
            jobs.discard(state, snapshots)
    if pending is not None and not jobs.job_path(attachment.store.directory,
                                                 pending[0]).exists():
        backend.mark_changed(pending[1])  # failed, or gone: to be written again
        attachment.pending = None
        attachment.failures += 1


def _forget_changes(backend: ChangelogKeyedStateBackend, job: jobs.MaterializationJob) -> None:
    """The keys marked up to the applied job's epoch are in its snapshot now."""
    table = backend.table
    if job.epoch is not None and isinstance(table, RocksDBStateTable):
        table.clear_changes(job.epoch)


def _attach(config: StreamingStateConfig, subtask: int, base: int | None,
            handles: list[KeyedStateHandle], cached: CachedBackend | None,
            storage: StateChangelogStorage[Any], snapshots: SnapshotStore) -> LocalAttachment:
    started = time.monotonic()
    # Materialization is the task's to start (in the background, see
    # materialize_in_background): the backend keeps no timer of its own.
    materialization = _NO_TIMER
    key_groups = key_group_range_for_operator(config.max_parallelism, config.parallelism,
                                              subtask)
    store = SubtaskStore(config.local_state_root(), config.application, config.operator_id,
                         subtask, config.parallelism)
    store.lock(LOCK_TIMEOUT_S)
    try:
        store.remove_stale()
        # Only the base can be started from again: a copy of any other checkpoint is
        # superseded (older) or of a batch that is being re-run (newer).
        store.prune_retained(base)
        manifest = store.read_manifest()
        expected = expected_handle(config, subtask, key_groups, handles)
        at_base = _at_base(manifest, config, subtask, key_groups, base, expected)
        if cached is not None:
            if (at_base and manifest is not None and manifest.owner == cached.owner
                    and cached.checkpoint_id == base):
                table = cached.backend.table
                assert isinstance(table, RocksDBStateTable)
                store.mark_changing()
                table.reopen()
                cached.backend.notify_checkpoint_complete(cached.checkpoint_id)
                return _from_manifest(LocalAttachment(
                    cached.backend, store, "reattached", time.monotonic() - started,
                    cached.owner), manifest)
            cached.backend.close()  # its store is closed already and not its to delete
        owner = uuid.uuid4().hex
        source = "reattached-local"
        if not at_base and base is not None:
            copy = store.read_retained_manifest(base)
            if _at_base(copy, config, subtask, key_groups, base, expected):
                store.roll_back(base)
                manifest, at_base, source = copy, True, "rolled-back"
        if at_base:
            assert manifest is not None
            store.mark_changing()
            backend = _reattach(config, key_groups, manifest, handles[0], store, storage,
                                snapshots, materialization)
            return _from_manifest(LocalAttachment(
                backend, store, source, time.monotonic() - started, owner), manifest)
        store.reset()
        table = RocksDBStateTable(store.db_path, track_changes=True, options=config.rocksdb_options)
        if handles:
            backend = restore_backend(storage, snapshots, config.operator_id, key_groups,
                                      config.max_parallelism, handles,
                                      materialization=materialization, table=table)
            source = "restored"
        else:
            backend = ChangelogKeyedStateBackend(storage, snapshots, config.operator_id,
                                                 key_groups, config.max_parallelism,
                                                 materialization, table=table)
            source = "fresh"
        return LocalAttachment(backend, store, source, time.monotonic() - started, owner)
    except BaseException:
        store.unlock()
        raise


def _from_manifest(attachment: LocalAttachment, manifest: StoreManifest) -> LocalAttachment:
    attachment.due_at = manifest.materialization_due_at
    attachment.pending = manifest.pending
    attachment.failures = manifest.materialization_failures
    return attachment


def _reattach(config: StreamingStateConfig, key_groups: KeyGroupRange,
              manifest: StoreManifest, handle: KeyedStateHandle, store: SubtaskStore,
              storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
              materialization: MaterializationConfig) -> ChangelogKeyedStateBackend:
    """A backend on the store as it is, continuing the manifest's backend: same backend
    id, its snapshot and changelog as base, its key groups still to materialize and its
    materialization schedule."""
    table = RocksDBStateTable(store.db_path, track_changes=True, options=config.rocksdb_options)
    try:
        backend = ChangelogKeyedStateBackend(
            storage, snapshots, config.operator_id, key_groups, config.max_parallelism,
            materialization, manifest.backend_id, table=table)
    except BaseException:
        table.close()
        raise
    backend.adopt_base(handle, set(manifest.changed_key_groups))
    logger.debug("subtask store %s reattached at checkpoint %d (%d entries)",
                 store.directory, manifest.checkpoint_id, table.entry_count())
    return backend


def materialize_in_background(attachment: LocalAttachment, checkpoint_id: int,
                              encoded_handle: bytes,
                              materialization: MaterializationConfig) -> bool:
    """After the snapshot of ``checkpoint_id`` (``encoded_handle``: the subtask's state in
    it): when a materialization is due and none is pending, keep a copy of the store and
    the job of writing its changed key groups (run it with
    :func:`~kafka_changelog.state.store_materialization.run_job` after :func:`release`).
    Returns whether one was started. The task does not wait for it: a later task applies
    it (see :func:`attach`)."""
    due, interval = attachment.due_at, materialization.interval_s
    if due is None or not interval or time.time() < due or attachment.pending is not None:
        return False
    backend = attachment.backend
    taken = backend.take_changed_for_materialization()
    attachment.due_at = time.time() + interval
    if taken is None:
        return False
    materialization_id, changed = taken
    table = backend.table
    assert isinstance(table, RocksDBStateTable)
    try:
        # Keys changed from now on are the next materialization's, not this one's.
        epoch = table.start_change_epoch()
        job = jobs.MaterializationJob(materialization_id, backend.backend_id,
                                      backend.key_group_range, tuple(sorted(changed)),
                                      checkpoint_id, encoded_handle, epoch)
        table.flush()
        attachment.started = jobs.create_job(attachment.store.directory, job, table.copy_to)
    except Exception as exc:  # rocksdict raises plain Exceptions for I/O errors
        logger.warning("no background materialization of %s at checkpoint %d (its key "
                       "groups stay to be written): %s", attachment.store.directory,
                       checkpoint_id, exc)
        backend.mark_changed(changed)
        return False
    attachment.pending = (materialization_id, job.changed)
    return True


def release(attachment: LocalAttachment, config: StreamingStateConfig, subtask: int,
            checkpoint_id: int, encoded_handle: bytes) -> CachedBackend | None:
    """After the snapshot of ``checkpoint_id``: flush the store, write its manifest, close
    and unlock it. Returns what the worker keeps (None after starting a background
    materialization: its backend's own log spans the copy's checkpoint, so the next task
    builds a new one on the store). A local disk that fails here only costs the next task
    a restore (logged): the checkpoint is in Kafka."""
    backend, store = attachment.backend, attachment.store
    table = backend.table
    assert isinstance(table, RocksDBStateTable)
    try:
        table.flush()
        manifest = StoreManifest(
            config.application, config.operator_id, subtask, config.parallelism,
            backend.key_group_range, config.max_parallelism, checkpoint_id,
            backend.backend_id, encoded_handle,
            tuple(sorted(backend.unmaterialized_key_groups())),
            attachment.due_at, attachment.owner, attachment.pending, attachment.failures)
        store.write_manifest(manifest)
    except Exception as exc:  # rocksdict raises plain Exceptions for I/O errors
        logger.warning("local state store %s not kept at checkpoint %d (the next task "
                       "restores from Kafka): %s", store.directory, checkpoint_id, exc)
    else:
        try:
            store.retain_copy(manifest, table.copy_to)
        except Exception as exc:
            logger.warning("no copy of local state store %s at checkpoint %d (a re-run of "
                           "the next batch would restore from Kafka): %s", store.directory,
                           checkpoint_id, exc)
    finally:
        table.close()
        store.unlock()
    if attachment.started is not None:
        backend.close()
        return None
    return CachedBackend(backend, checkpoint_id, attachment.owner)


#: Background materializations failed in a row after which the task writes the next one
#: itself and waits for it (a Python worker killed while idle, or one that exits after
#: each task, would otherwise never finish one, and the changelog would grow forever).
MAX_BACKGROUND_FAILURES = 2


def run_started(attachment: LocalAttachment, snapshots: SnapshotStore,
                background: Callable[[jobs.StartedJob], None], worker_outlives_task: bool
                ) -> None:
    """After :func:`release`: write the materialization the task started, with
    ``background`` (a thread of the process) when the process outlives the task and
    earlier ones did not fail too often, else here, waiting for it."""
    started = attachment.started
    if started is None:
        return
    if worker_outlives_task and attachment.failures < MAX_BACKGROUND_FAILURES:
        background(started)
    else:
        jobs.run_job(started, snapshots)


def abandon(attachment: LocalAttachment) -> None:
    """The task failed: drop the materialization it started (its checkpoint never
    completes), close its backend and let the store go (it has no manifest: the next
    task rolls it back or restores)."""
    try:
        if attachment.started is not None:
            jobs.cancel(attachment.started)
            attachment.started = None
        attachment.backend.close()
    finally:
        attachment.store.unlock()


__all__ = ["LOCK_TIMEOUT_S", "MAX_BACKGROUND_FAILURES", "MAX_BASE_HANDLES", "CachedBackend",
           "LocalAttachment", "abandon", "attach", "expected_handle",
           "materialize_in_background", "release", "run_started"]
