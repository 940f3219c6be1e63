"""The one way a stateful task gets its subtask's backend, and gives it back.

:func:`acquire` returns an :class:`AcquiredBackend` at the base checkpoint with how it
was got (a :class:`~kafka_changelog.state.host.subtask_backend.StateSource`): in memory, the
backend the process kept when it is exactly at the base, else one restored from Kafka
(or fresh); with a host-local store (:mod:`~kafka_changelog.state.host.host_store`), the
store reattached, rolled back or restored. After the task's snapshot, :func:`keep`
gives the backend back (what the process caches for the subtask's next task); after a
failure, :func:`discard` drops it (a failed task's backend is at no checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...storage import StateChangelogStorage
from ..backend.keyed_backend import ChangelogKeyedStateBackend
from ..backend.restore import restore_backend
from ..checkpoints.checkpoint import KeyedStateHandle
from ..snapshots.materializer import MaterializationConfig
from ..snapshots.snapshot_store import SnapshotStore
from . import host_store
from .subtask_backend import CachedBackend, StateSource, SubtaskPlacement


@dataclass
class AcquiredBackend:
    """A task's backend, from :func:`acquire` to :func:`keep` or :func:`discard`."""

    backend: ChangelogKeyedStateBackend
    source: StateSource
    #: Seconds getting the backend (reattaching takes milliseconds; a restore, its time).
    seconds: float
    #: The host-local store held (None: an in-memory backend).
    store: host_store.StoreHold | None = None


def acquire(placement: SubtaskPlacement, base: int | None,
            handles: Sequence[KeyedStateHandle], cached: CachedBackend | None,
            storage: StateChangelogStorage[Any], snapshots: SnapshotStore,
            materialization: MaterializationConfig,
            local: host_store.HostStoreSettings | None) -> AcquiredBackend:
    """The subtask's backend at checkpoint ``base`` (None: no checkpoint yet), whose state
    is ``handles`` (the base's handles overlapping the subtask's key groups).

    ``cached`` is the backend this process kept for the subtask, if any: reused when it
    is exactly at ``base``, closed otherwise. ``local`` selects host-local stores (None:
    in memory). In memory the backend materializes on ``materialization``'s schedule
    itself; a host-local store's materializations are the task's to start
    (:func:`~kafka_changelog.state.host.host_store.materialize_in_background`).
    """
    if local is not None:
        hold = host_store.attach(local, placement, base, handles, cached, storage, snapshots,
                                 materialization)
        return AcquiredBackend(hold.backend, hold.source, hold.seconds, hold)
    if cached is not None:
        if base is not None and cached.checkpoint_id == base:
            cached.backend.notify_checkpoint_complete(cached.checkpoint_id)
            return AcquiredBackend(cached.backend, StateSource.REATTACHED, 0.0)
        cached.backend.close()
    started = time.monotonic()
    if not handles:
        return AcquiredBackend(
            ChangelogKeyedStateBackend(storage, snapshots, placement.operator_id,
                                       placement.key_groups, placement.max_parallelism,
                                       materialization),
            StateSource.FRESH, 0.0)
    backend = restore_backend(storage, snapshots, placement.operator_id, placement.key_groups,
                              placement.max_parallelism, handles,
                              materialization=materialization)
    return AcquiredBackend(backend, StateSource.RESTORED, time.monotonic() - started)


def keep(acquired: AcquiredBackend, checkpoint_id: int,
         encoded_handle: bytes) -> CachedBackend | None:
    """After the snapshot of ``checkpoint_id`` (``encoded_handle``: the subtask's state in
    it): what the process keeps for the subtask's next task (a host-local store is
    flushed, its manifest written and the store let go first). None: nothing to keep."""
    if acquired.store is None:
        return CachedBackend(acquired.backend, checkpoint_id)
    return host_store.release(acquired.store, checkpoint_id, encoded_handle)


def discard(acquired: AcquiredBackend) -> None:
    """The task failed: close the backend (a host-local store is let go without a
    manifest, so the next task rolls it back or restores)."""
    if acquired.store is not None:
        host_store.abandon(acquired.store)
    else:
        acquired.backend.close()


__all__ = ["AcquiredBackend", "acquire", "discard", "keep"]
