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
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kafka_changelog import KeyGroupRange, key_group_range_for_operator
from kafka_changelog.state.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.local_store import StoreManifest, SubtaskStore
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
    started = time.monotonic()
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
                return LocalAttachment(cached.backend, store, "reattached",
                                       time.monotonic() - started, cached.owner)
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
            return LocalAttachment(backend, store, source, time.monotonic() - started, owner)
        store.reset()
        table = RocksDBStateTable(store.db_path)
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


def _reattach(config: StreamingStateConfig, key_groups: KeyGroupRange,
              manifest: StoreManifest, handle: KeyedStateHandle, store: SubtaskStore,
              storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
              materialization: MaterializationConfig) -> ChangelogKeyedStateBackend:
    """A backend on the store as it is, continuing the manifest's backend: same backend
    id, its snapshot and changelog as base, its key groups still to materialize and its
    materialization schedule."""
    table = RocksDBStateTable(store.db_path)
    try:
        backend = ChangelogKeyedStateBackend(
            storage, snapshots, config.operator_id, key_groups, config.max_parallelism,
            materialization, manifest.backend_id, table=table)
    except BaseException:
        table.close()
        raise
    backend.adopt_base(handle, set(manifest.changed_key_groups))
    if len(handle.changelog) >= MAX_BASE_HANDLES:
        backend.schedule_materialization(0.0)  # due now
    elif manifest.materialization_due_at is not None:
        backend.schedule_materialization(manifest.materialization_due_at)
    logger.debug("subtask store %s reattached at checkpoint %d (%d entries)",
                 store.directory, manifest.checkpoint_id, table.entry_count())
    return backend


def release(attachment: LocalAttachment, config: StreamingStateConfig, subtask: int,
            checkpoint_id: int, encoded_handle: bytes) -> CachedBackend:
    """After the snapshot of ``checkpoint_id``: flush the store, write its manifest, close
    and unlock it. Returns what the worker keeps. A local disk that fails here only costs
    the next task a restore (logged): the checkpoint is in Kafka."""
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
            backend.materialization_due_at, attachment.owner)
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
    return CachedBackend(backend, checkpoint_id, attachment.owner)


def abandon(attachment: LocalAttachment) -> None:
    """The task failed: close its backend and let the store go (it has no manifest, so
    the next task restores)."""
    try:
        attachment.backend.close()
    finally:
        attachment.store.unlock()


__all__ = ["LOCK_TIMEOUT_S", "MAX_BASE_HANDLES", "CachedBackend", "LocalAttachment", "abandon",
           "attach", "expected_handle", "release"]
