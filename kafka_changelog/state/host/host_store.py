"""Host-local subtask state: a RocksDB store per subtask that any process on the host
reattaches, so that a task costs what its batch holds, not what its state holds.

A stream processor gives a batch's task for subtask ``i`` to whichever worker process is
free, so a backend kept in one process is often not where the next task runs. Each
subtask's working copy is therefore a RocksDB store in the host's local state directory
(:class:`~kafka_changelog.state.host.local_store.SubtaskStore`: store, manifest, lock). A task
for subtask ``i`` starting from checkpoint ``c`` gets its backend as one of
:class:`~kafka_changelog.state.host.subtask_backend.StateSource`:

- ``REATTACHED``: its own process still holds the backend that wrote the store at ``c``;
- ``REATTACHED_LOCAL``: another process left the store exactly at ``c`` (the manifest
  names ``c`` and the very handle the task starts from): a backend is built on the store
  as it is, continuing that backend's snapshot, changelog and materialization schedule;
- ``ROLLED_BACK``: the store went past ``c`` but its copy kept at ``c`` is there;
- ``CAUGHT_UP``: the store is at an older checkpoint of the subtask (the subtask ran on
  another host since) and ``c`` continues it (same snapshot; the store's changelog a
  prefix of ``c``'s): only the newer changelog is read from Kafka and replayed;
- ``RESTORED``: anything else (no store, a materialization or a rescale since the
  store's checkpoint): emptied and restored from Kafka;
- ``FRESH``: no checkpoint yet.

Invariants: the store is locked from :func:`attach` to :func:`release` or
:func:`abandon`; it carries no manifest while a task may change it (a crash leaves
nothing that looks like a checkpoint); a manifest is written only after the store was
flushed at the checkpoint it names. After the snapshot the task keeps a copy of the
store at that checkpoint (the next task deletes every copy but its base's) and lets the
store go, so the next batch's task can take it wherever it runs on the host.

Materializations are the task's to start, from a copy of the store, written after the
task let the store go (:func:`materialize_in_background`, :func:`run_started`); a
later task applies the result (:func:`attach`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...handle import ChangelogHandle
from ...storage import StateChangelogStorage
from ..backend.keyed_backend import ChangelogKeyedStateBackend
from ..backend.restore import load_layers, replay_pieces, restore_backend
from ..checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from ..rocksdb.options import RocksDBOptions
from ..schema.key_group_codec import assemble_key_group
from ..snapshots.chunk_sweep import DEFAULT_SWEEP_GRACE_S
from ..snapshots.materialization import materialized_at
from ..snapshots.materializer import MaterializationConfig
from ..snapshots.snapshot_store import SnapshotStore
from ..tables.protocol import HostStoreTable
from . import store_materialization as jobs
from .local_cleanup import DEFAULT_IDLE_STORE_RETENTION_S, sweep_idle
from .local_store import StoreManifest, SubtaskStore
from .subtask_backend import CachedBackend, StateSource, SubtaskPlacement

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
#: Background materializations failed in a row after which the task writes the next one
#: itself and waits for it (a worker killed while idle, or one that exits after each
#: task, would otherwise never finish one, and the changelog would grow forever).
MAX_BACKGROUND_FAILURES = 2


@dataclass(frozen=True)
class HostStoreSettings:
    """Where the host's subtask stores are and how their tables open (picklable)."""

    #: The host-local state directory (an absolute path on a local disk).
    root: Path
    #: How the stores' RocksDB is tuned.
    rocksdb_options: RocksDBOptions = field(default_factory=RocksDBOptions)
    #: A store (of any application under ``root``) that no task locked for this long is
    #: deleted by the next task attaching on the host (None: never; see local_cleanup).
    idle_store_retention_s: float | None = DEFAULT_IDLE_STORE_RETENTION_S
    #: A background materialization that started longer ago than this (seconds) is not
    #: applied (its key groups are written again): the snapshot sweep may have removed
    #: its chunks (half the sweep's grace; see :mod:`~kafka_changelog.state.snapshots.chunk_sweep`).
    max_job_age_s: float = DEFAULT_SWEEP_GRACE_S / 2

    def open_table(self, path: Path) -> HostStoreTable:
        """The store's table at ``path`` (created empty when missing), marking changes."""
        from ..rocksdb.table import RocksDBStateTable  # rocksdict only when asked for

        return RocksDBStateTable(path, track_changes=True, options=self.rocksdb_options)


@dataclass(frozen=True)
class CatchUp:
    """How a store at an older checkpoint of the subtask becomes the base: when
    ``rebased``, the store is made the base's snapshot first (the key groups of
    ``reload`` replaced by it, emptied where it has none; those of ``deltas`` given the
    snapshot's newer delta layers, key group -> layers the store holds already); then
    ``changelog`` is replayed. Not ``rebased``: the store continues the base as it is
    (its changelog a prefix of the base's) and ``changelog`` is the tail after it."""

    rebased: bool
    reload: frozenset[int]
    changelog: tuple[ChangelogHandle, ...]
    deltas: Mapping[int, int] = field(default_factory=dict)


@dataclass
class StoreHold:
    """A task's hold on its subtask's host-local store, from attach to release."""

    backend: ChangelogKeyedStateBackend
    #: The backend's table (the store's RocksDB).
    table: HostStoreTable
    store: SubtaskStore
    placement: SubtaskPlacement
    source: StateSource
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
    #: How the store was caught up (``CAUGHT_UP`` only).
    catch_up: CatchUp | None = None


def expected_handle(placement: SubtaskPlacement,
                    handles: Sequence[KeyedStateHandle]) -> bytes | None:
    """The manifest handle of a store exactly at the base checkpoint: the subtask's
    ``SubtaskState`` bytes, when one old subtask had exactly this range (else None: a
    rescale, which always restores)."""
    if len(handles) != 1 or handles[0].key_group_range != placement.key_groups:
        return None
    return SubtaskState(placement.operator_id, placement.subtask, placement.parallelism,
                        handles[0], None).to_bytes()


def _at_base(manifest: StoreManifest | None, placement: SubtaskPlacement, base: int | None,
             expected: bytes | None) -> bool:
    return (manifest is not None and base is not None and expected is not None
            and manifest.checkpoint_id == base and manifest.handle == expected
            and _same_subtask(manifest, placement))


def attach(settings: HostStoreSettings, placement: SubtaskPlacement, base: int | None,
           handles: Sequence[KeyedStateHandle], cached: CachedBackend | None,
           storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
           materialization: MaterializationConfig) -> StoreHold:
    """Lock the subtask's store and get a backend on it at checkpoint ``base``
    (reattached when the store is exactly there, restored from Kafka otherwise).

    The store is marked as changing (no manifest) before this returns: a crash from
    here on leaves nothing that looks like a checkpoint. ``cached`` is the backend this
    process kept for the subtask, if any (reused or closed). ``storage`` is the
    changelog storage the backend writes to.
    """
    hold = _attach(settings, placement, base, handles, cached, storage, snapshots)
    try:
        _settle_jobs(hold, snapshots, settings.max_job_age_s)
        hold.due_at = _due_at(hold, materialization)
    except BaseException:
        abandon(hold)
        raise
    return hold


def _due_at(hold: StoreHold, materialization: MaterializationConfig) -> float | None:
    """When the backend's next materialization is due: the manifest's schedule when the
    store was reattached, else an interval after its snapshot was made (now plus the
    interval and a jitter when it has none)."""
    interval = materialization.interval_s
    if not interval:
        return None
    backend = hold.backend
    if len(backend.base_changelog) >= MAX_BASE_HANDLES:
        return 0.0  # due now
    if hold.due_at is not None:
        return hold.due_at
    if backend.materialization_id:
        return materialized_at(backend.materialization_id) + interval
    return time.time() + interval + random.uniform(0, materialization.start_jitter_s)


def _settle_jobs(hold: StoreHold, snapshots: SnapshotStore, max_age_s: float) -> None:
    """Apply the store's pending background materialization if it is done, fits the
    backend and started at most ``max_age_s`` ago, give its key groups back to the backend
    if it failed (or is too old), and discard every other job that is not running."""
    backend, pending = hold.backend, hold.pending
    for job_state in jobs.list_jobs(hold.store.directory):
        running = job_state.status is jobs.JobStatus.RUNNING
        if pending is not None and job_state.materialization_id == pending[0]:
            if running:
                continue
            written = jobs.written_bytes(job_state)
            if (job_state.status is jobs.JobStatus.DONE and job_state.result is not None
                    and job_state.job is not None
                    and time.time() - materialized_at(pending[0]) <= max_age_s
                    and backend.apply_materialization(job_state.result,
                                                      job_state.job.covered, written)):
                hold.applied += 1
                hold.applied_bytes += written
                hold.failures = 0
                if job_state.job.epoch is not None:
                    # The keys marked up to the job's epoch are in its snapshot now.
                    hold.table.clear_changes(job_state.job.epoch)
                jobs.discard(job_state, None)  # no tombstones: its chunks are in use now
                hold.pending = pending = None
                continue
            logger.info("background materialization %d of %s not applied (%s): its key "
                        "groups stay to be written", job_state.materialization_id,
                        hold.store.directory, job_state.status.value)
        if not running:
            jobs.discard(job_state, snapshots)
    if pending is not None and not jobs.job_path(hold.store.directory, pending[0]).exists():
        backend.mark_changed(pending[1])  # failed, or gone: to be written again
        hold.pending = None
        hold.failures += 1


def _attach(settings: HostStoreSettings, placement: SubtaskPlacement, base: int | None,
            handles: Sequence[KeyedStateHandle], cached: CachedBackend | None,
            storage: StateChangelogStorage[Any], snapshots: SnapshotStore) -> StoreHold:
    started = time.monotonic()
    store = SubtaskStore(settings.root, placement.application, placement.operator_id,
                         placement.subtask, placement.parallelism)
    store.lock(LOCK_TIMEOUT_S)
    try:
        store.remove_stale()
        sweep_idle(settings.root, settings.idle_store_retention_s)
        manifest = store.read_manifest()
        expected = expected_handle(placement, handles)
        if manifest is None and base is not None and expected is not None:
            manifest = _kept_copy_to_catch_up_from(store, placement, base, handles[0])
        # Only the base can be started from again: a copy of any other checkpoint is
        # superseded (older) or of a batch that is being re-run (newer).
        store.prune_retained(base)
        at_base = _at_base(manifest, placement, base, expected)
        if cached is not None:
            if (at_base and manifest is not None and cached.table is not None
                    and manifest.owner == cached.owner and cached.checkpoint_id == base):
                store.mark_changing()
                cached.table.reopen()
                cached.backend.notify_checkpoint_complete(cached.checkpoint_id)
                return _from_manifest(StoreHold(
                    cached.backend, cached.table, store, placement, StateSource.REATTACHED,
                    time.monotonic() - started, cached.owner), manifest)
            cached.backend.close()  # its store is closed already and not its to delete
        owner = uuid.uuid4().hex
        source = StateSource.REATTACHED_LOCAL
        if not at_base and base is not None:
            copy = store.read_retained_manifest(base)
            if _at_base(copy, placement, base, expected):
                store.roll_back(base)
                manifest, at_base, source = copy, True, StateSource.ROLLED_BACK
        if at_base:
            assert manifest is not None
            store.mark_changing()
            backend, table = _reattach(settings, placement, manifest, handles[0], store,
                                       storage, snapshots)
            return _from_manifest(StoreHold(backend, table, store, placement, source,
                                            time.monotonic() - started, owner), manifest)
        if base is not None and expected is not None and manifest is not None:
            catch_up = _catch_up(manifest, placement, handles[0])
            if catch_up is not None:
                store.mark_changing()
                backend, table = _reattach(settings, placement, manifest, handles[0], store,
                                           storage, snapshots, catch_up)
                hold = StoreHold(backend, table, store, placement, StateSource.CAUGHT_UP,
                                 time.monotonic() - started, owner, catch_up=catch_up)
                # A rebased store's pending job and schedule were of its older snapshot.
                return hold if catch_up.rebased else _from_manifest(hold, manifest)
        store.reset()
        table = settings.open_table(store.db_path)
        # Materialization is the task's to start (materialize_in_background): the
        # backend keeps no timer of its own.
        if handles:
            backend = restore_backend(storage, snapshots, placement.operator_id,
                                      placement.key_groups, placement.max_parallelism,
                                      handles, materialization=_NO_TIMER, table=table)
            source = StateSource.RESTORED
        else:
            backend = ChangelogKeyedStateBackend(storage, snapshots, placement.operator_id,
                                                 placement.key_groups,
                                                 placement.max_parallelism, _NO_TIMER,
                                                 table=table)
            source = StateSource.FRESH
        return StoreHold(backend, table, store, placement, source, time.monotonic() - started,
                         owner)
    except BaseException:
        store.unlock()
        raise


def _kept_copy_to_catch_up_from(store: SubtaskStore, placement: SubtaskPlacement, base: int,
                                handle: KeyedStateHandle) -> StoreManifest | None:
    """A store without a manifest (a task died holding it: its host was lost mid-batch)
    is at no checkpoint, but the copy its last task kept is: when that copy is of an
    older checkpoint than ``base`` and can be caught up from, it becomes the live store
    (its manifest returned, not written: the store is about to change)."""
    kept = store.retained_checkpoints()
    if not kept or kept[-1] >= base:
        return None  # none, or the base's (rolled back to as it is) or a re-run's
    copy = store.read_retained_manifest(kept[-1])
    if copy is None or _catch_up(copy, placement, handle) is None:
        return None
    store.roll_back(kept[-1])
    return copy


def _from_manifest(hold: StoreHold, manifest: StoreManifest) -> StoreHold:
    hold.due_at = manifest.materialization_due_at
    hold.pending = manifest.pending
    hold.failures = manifest.materialization_failures
    return hold


def _same_subtask(manifest: StoreManifest, placement: SubtaskPlacement) -> bool:
    return (manifest.key_group_range == placement.key_groups
            and manifest.max_parallelism == placement.max_parallelism
            and (manifest.application, manifest.operator_id, manifest.subtask,
                 manifest.parallelism) == (placement.application, placement.operator_id,
                                           placement.subtask, placement.parallelism))


def _catch_up(manifest: StoreManifest, placement: SubtaskPlacement,
              handle: KeyedStateHandle) -> CatchUp | None:
    """How the store the manifest describes (an older checkpoint of the same subtask)
    becomes ``handle``'s state, or None when a full restore costs less.

    The store holds exactly the manifest's snapshot plus its changelog, and only the
    manifest's changed key groups (and those of a job it had pending) differ from that
    snapshot. When ``handle`` continues the store (same backend and snapshot, the
    store's changelog a prefix of ``handle``'s: handles name exact offset ranges), only
    the newer changelog is replayed. Otherwise (a materialization came between, or the
    store is of a checkpoint whose batch was re-run elsewhere) every key group that may
    differ from ``handle``'s snapshot is replaced by it (the store's changed key groups,
    and those whose chunks differ: chunks are immutable records, so the same chunks
    are the same state), and ``handle``'s whole changelog is replayed: nothing the
    store applied is applied twice. That is worth it while the snapshot's key groups
    kept are at least half its bytes; else None."""
    if not _same_subtask(manifest, placement):
        return None
    old = SubtaskState.from_bytes(manifest.handle).keyed
    if old is None or old.key_group_range != handle.key_group_range:
        return None
    if (old.backend_id == handle.backend_id == manifest.backend_id
            and old.materialization_id == handle.materialization_id
            and old.snapshot == handle.snapshot
            and handle.changelog[:len(old.changelog)] == old.changelog):
        return CatchUp(False, frozenset(), handle.changelog[len(old.changelog):])
    snapshot, previous = handle.snapshot, old.snapshot
    if snapshot is None or (previous is not None and previous.topic != snapshot.topic):
        return None  # nothing of the store is known to be the base's
    changed = set(manifest.changed_key_groups)
    if manifest.pending is not None:
        changed.update(manifest.pending[1])
    reload: set[int] = set()
    deltas: dict[int, int] = {}
    read_bytes = 0
    for key_group in handle.key_group_range:
        layers = snapshot.layers_of(key_group)
        held = previous.layers_of(key_group) if previous is not None else ()
        if key_group not in changed and layers[:len(held)] == held:
            if len(layers) == len(held):
                continue  # the same chunks (immutable records): the same state
            if held:  # the store is its older layers exactly: only the newer ones
                deltas[key_group] = len(held)
                read_bytes += sum(c.size for layer in layers[len(held):] for c in layer)
                continue
        reload.add(key_group)
        read_bytes += sum(c.size for c in snapshot.chunks_of(key_group))
    if not snapshot.state_size or 2 * read_bytes > snapshot.state_size:
        return None  # a restore into an empty store (ingested whole) is faster
    return CatchUp(True, frozenset(reload), handle.changelog, deltas)


def _reattach(settings: HostStoreSettings, placement: SubtaskPlacement,
              manifest: StoreManifest, handle: KeyedStateHandle, store: SubtaskStore,
              storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
              catch_up: CatchUp | None = None
              ) -> tuple[ChangelogKeyedStateBackend, HostStoreTable]:
    """A backend on the store as it is, continuing ``handle``: its backend id, snapshot
    and changelog as base, and (unless rebased by ``catch_up``) the manifest's key groups
    still to materialize. ``catch_up``: how the store becomes ``handle``'s state first
    (see :class:`CatchUp`); None: it is exactly at ``handle`` already."""
    table = settings.open_table(store.db_path)
    rebased = catch_up is not None and catch_up.rebased
    changed = set() if rebased else set(manifest.changed_key_groups)
    try:
        backend = ChangelogKeyedStateBackend(
            storage, snapshots, placement.operator_id, placement.key_groups,
            placement.max_parallelism, _NO_TIMER, handle.backend_id, table=table)
    except BaseException:
        table.close()
        raise
    try:
        if catch_up is not None:
            # A checkpoint that says how many entries its state has spares the replay a
            # read of every key it writes.
            counted = (table.recounted(handle.entry_count) if handle.entry_count is not None
                       else nullcontext())
            with counted:
                if rebased:
                    _rebase(table, handle, catch_up, placement, snapshots)
                reader = storage.reader()
                try:
                    replay_pieces(table, reader, catch_up.changelog, placement.key_groups,
                                  changed)
                finally:
                    reader.close()
    except BaseException:
        backend.close()
        raise
    backend.adopt_base(handle, changed)
    logger.debug("subtask store %s at checkpoint %d taken to the base of materialization "
                 "%d (%d entries; %s)", store.directory, manifest.checkpoint_id,
                 handle.materialization_id, table.entry_count(),
                 "as it was" if catch_up is None else
                 f"{len(catch_up.reload)} key group(s) reloaded, {len(catch_up.deltas)} "
                 f"given newer delta layers, "
                 f"{len(catch_up.changelog)} changelog handle(s) replayed")
    return backend, table


def _rebase(table: HostStoreTable, handle: KeyedStateHandle, catch_up: CatchUp,
            placement: SubtaskPlacement, snapshots: SnapshotStore) -> None:
    """Make the store ``handle``'s snapshot (see :class:`CatchUp`), every changed-key mark
    forgotten (marks say what changed since the snapshot, and now nothing has)."""
    snapshot = handle.snapshot
    assert snapshot is not None  # _catch_up rebases only onto a snapshot
    table.clear_changes(table.start_change_epoch())
    empty = assemble_key_group(())
    for key_group in sorted(catch_up.reload):
        if not snapshot.chunks_of(key_group) and table.has_entries(key_group):
            table.load_group(key_group, empty)
    read = catch_up.reload | catch_up.deltas.keys()
    wanted = dataclasses.replace(
        snapshot, chunks=tuple(c for c in snapshot.chunks if c.key_group in read))
    load_layers(table, snapshots.read_layers(wanted, placement.key_groups, catch_up.deltas))


def materialize_in_background(hold: StoreHold, checkpoint_id: int, encoded_handle: bytes,
                              materialization: MaterializationConfig) -> bool:
    """After the snapshot of ``checkpoint_id`` (``encoded_handle``: the subtask's state in
    it): when a materialization is due and none is pending, keep a copy of the store and
    the job of writing its changed key groups (run it with :func:`run_started` after
    :func:`release`). Returns whether one was started. The task does not wait for it: a
    later task applies it (see :func:`attach`)."""
    due, interval = hold.due_at, materialization.interval_s
    if due is None or not interval or time.time() < due or hold.pending is not None:
        return False
    backend, table = hold.backend, hold.table
    taken = backend.take_changed_for_materialization()
    hold.due_at = time.time() + interval
    if taken is None:
        return False
    materialization_id, changed = taken
    try:
        # Keys changed from now on are the next materialization's, not this one's.
        epoch = table.start_change_epoch()
        job = jobs.MaterializationJob(materialization_id, backend.backend_id,
                                      backend.key_group_range, tuple(sorted(changed)),
                                      checkpoint_id, encoded_handle, epoch)
        table.flush()
        hold.started = jobs.create_job(hold.store.directory, job, table.copy_to)
    except Exception as exc:  # rocksdict raises plain Exceptions for I/O errors
        logger.warning("no background materialization of %s at checkpoint %d (its key "
                       "groups stay to be written): %s", hold.store.directory,
                       checkpoint_id, exc)
        backend.mark_changed(changed)
        return False
    hold.pending = (materialization_id, job.changed)
    return True


def release(hold: StoreHold, checkpoint_id: int, encoded_handle: bytes) -> CachedBackend | None:
    """After the snapshot of ``checkpoint_id``: flush the store, write its manifest, close
    and unlock it. Returns what the process keeps (None after starting a background
    materialization: its backend's own log spans the copy's checkpoint, so the next task
    builds a new one on the store). A local disk that fails here only costs the next task
    a restore (logged): the checkpoint is in Kafka."""
    backend, store, table, placement = hold.backend, hold.store, hold.table, hold.placement
    try:
        table.flush()
        manifest = StoreManifest(
            placement.application, placement.operator_id, placement.subtask,
            placement.parallelism, backend.key_group_range, placement.max_parallelism,
            checkpoint_id, backend.backend_id, encoded_handle,
            tuple(sorted(backend.unmaterialized_key_groups())),
            hold.due_at, hold.owner, hold.pending, hold.failures)
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
    if hold.started is not None:
        backend.close()
        return None
    return CachedBackend(backend, checkpoint_id, hold.owner, table)


def run_started(hold: StoreHold, snapshots: SnapshotStore,
                background: Callable[[jobs.StartedJob], None], process_outlives_task: bool
                ) -> None:
    """After :func:`release`: write the materialization the task started, with
    ``background`` when the process outlives the task and earlier ones did not fail too
    often, else here, waiting for it."""
    started = hold.started
    if started is None:
        return
    if process_outlives_task and hold.failures < MAX_BACKGROUND_FAILURES:
        background(started)
    else:
        jobs.run_job(started, snapshots)


def abandon(hold: StoreHold) -> None:
    """The task failed: drop the materialization it started (its checkpoint never
    completes), close its backend and let the store go (it has no manifest: the next
    task rolls it back or restores)."""
    try:
        if hold.started is not None:
            jobs.cancel(hold.started)
            hold.started = None
        hold.backend.close()
    finally:
        hold.store.unlock()


__all__ = ["LOCK_TIMEOUT_S", "MAX_BACKGROUND_FAILURES", "MAX_BASE_HANDLES",
           "HostStoreSettings", "StoreHold", "abandon", "attach", "expected_handle",
           "materialize_in_background", "release", "run_started"]
