"""Completing checkpoints, collecting what subsumed ones leave behind, and restoring.

A checkpoint is complete once its record in the checkpoint store is durable. Then
retention subsumes the oldest ones. Garbage collection runs in an order that a
crash at any point leaves nothing behind for good:

1. tombstone the snapshot chunks of subsumed checkpoints that no retained one, nor any
   stored checkpoint of another application (a fork, ``state/history/fork.py``), uses;
2. discard the subsumed checkpoint records (until then the store returns them again
   from the next commit, so a crash before this point repeats step 1);
3. delete changelog records below what anyone still needs (DeleteRecords), computed
   afresh each time from the checkpoint topic: every stored checkpoint of *every*
   application there, each application's log floors (where it may still write
   records a later checkpoint uses) and this process's live writers.

Applications may share changelog and snapshot topics as long as they share the
checkpoint topic too. Garbage collection never fails a committed checkpoint: an
error is logged, kept in :attr:`CheckpointCoordinator.last_garbage`, and the next
commit collects again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...gc_types import LogFloor
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange
from ...reader import StateChangelogReader
from ...storage import StateChangelogStorage
from ..backend.config import StateBackendConfig
from ..backend.keyed_backend import ChangelogKeyedStateBackend
from ..backend.local_recovery import LocalRecoveryStore
from ..backend.operator_state import OperatorStateBackend, redistribute
from ..backend.restore import restore_backend
from ..checkpoints.checkpoint import CompletedCheckpoint, KeyedStateHandle, SubtaskState
from ..checkpoints.checkpoint_store import CheckpointStore
from ..snapshots.chunk_sweep import DEFAULT_SWEEP_GRACE_S, SweepReport, chunks_to_sweep
from ..snapshots.materializer import MaterializationConfig
from ..snapshots.snapshot import ChunkRef, SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore

logger = logging.getLogger(__name__)


@dataclass
class GarbageReport:
    """What one garbage collection removed."""

    discarded_checkpoints: list[int] = field(default_factory=list)
    deleted_chunks: int = 0
    changelog_log_start: dict[int, int] = field(default_factory=dict)
    #: Why the collection stopped early (it is retried at the next commit); None: it did not.
    error: str | None = None


class CheckpointCoordinator:
    """Checkpoints of one application: commit, retention, garbage collection, restore."""

    def __init__(
        self,
        application: str,
        checkpoint_store: CheckpointStore,
        snapshot_store: SnapshotStore,
        changelog_storage: StateChangelogStorage[Any],
        max_parallelism: int = 128,
        changelog_gc: bool = True,
        state_backend: StateBackendConfig | None = None,
        sweep_interval_s: float | None = None,
        sweep_grace_s: float = DEFAULT_SWEEP_GRACE_S,
        collect_in_background: bool = False,
    ) -> None:
        """``state_backend`` is the working copy of the backends :meth:`restore_keyed`
        builds (default: in memory). ``sweep_interval_s``: after a commit, sweep the
        snapshot topic (:meth:`sweep_chunks`, in a background thread) when the last sweep
        of this coordinator is this old, or none ran yet (None: only when called);
        ``sweep_grace_s``: see :mod:`~kafka_changelog.state.snapshots.chunk_sweep`.
        ``collect_in_background``: :meth:`complete` returns once the checkpoint is durable
        and its garbage is collected by a thread of this coordinator, one collection at
        a time (a commit during one leaves its subsumed checkpoints to the next round,
        which takes what the store then names subsumed); :meth:`wait_for_collection`
        waits for it. Safe because nothing a later checkpoint needs is ever collected
        (module docstring); a crash mid-collection is finished by a later commit."""
        self.application = application
        self.checkpoints = checkpoint_store
        self.snapshots = snapshot_store
        self.storage = changelog_storage
        self.max_parallelism = max_parallelism
        self.changelog_gc = changelog_gc
        self.state_backend = state_backend or StateBackendConfig()
        self.last_garbage = GarbageReport()
        self.sweep_interval_s = sweep_interval_s
        self.sweep_grace_s = sweep_grace_s
        #: The last sweep's report (None: none finished yet) and the running one's thread.
        self.last_sweep: SweepReport | None = None
        self._sweep_thread: threading.Thread | None = None
        self._swept_at: float | None = None
        #: Set by :meth:`stop_sweeps`: no sweep starts, and a running one deletes nothing.
        self._sweeps_stopped = threading.Event()
        #: Whether this coordinator guarded its application's first writes already.
        self._guarded = False
        self.collect_in_background = collect_in_background
        #: The running background collection (None: none) and whether a commit asked for
        #: another round meanwhile.
        self._collection: threading.Thread | None = None
        self._collect_again = False
        self._collection_lock = threading.Lock()

    def complete(
        self, checkpoint_id: int, subtasks: Iterable[SubtaskState],
        timestamp_ms: int | None = None,
        persist: Callable[[CompletedCheckpoint], None] | None = None,
        properties: dict[str, str] | None = None,
    ) -> CompletedCheckpoint:
        """Commit the checkpoint (durable on return), then collect subsumed garbage.

        ``persist`` replaces the checkpoint store's own write (see
        :meth:`CheckpointStore.commit`), e.g. a transaction that commits outputs with it.
        ``properties`` are stored with the checkpoint. Garbage collection errors are
        logged and reported in :attr:`last_garbage`, never raised: the checkpoint is
        complete.
        """
        checkpoint = CompletedCheckpoint(
            self.application, checkpoint_id,
            timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            self.max_parallelism, tuple(subtasks), self._log_floors(),
            dict(properties or {}))
        subsumed = self.checkpoints.commit(checkpoint, persist)
        if subsumed and self.collect_in_background:
            self._collect_in_background(subsumed)
        elif subsumed:
            self.last_garbage = self.collect_garbage(subsumed)
        self._sweep_when_due()
        return checkpoint

    def wait_for_collection(self, timeout_s: float | None = None) -> bool:
        """Wait for the background garbage collection (``collect_in_background``), if one
        runs; whether none runs any more."""
        with self._collection_lock:
            thread = self._collection
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def _collect_in_background(self, subsumed: Sequence[CompletedCheckpoint]) -> None:
        with self._collection_lock:
            if self._collection is not None:
                self._collect_again = True
                return
            self._collection = threading.Thread(
                target=self._collecting, args=(list(subsumed),),
                name=f"kafka-changelog-gc-{self.application}", daemon=True)
            self._collection.start()

    def _collecting(self, subsumed: list[CompletedCheckpoint]) -> None:
        while True:
            self.last_garbage = self.collect_garbage(subsumed)  # never raises
            with self._collection_lock:
                if not self._collect_again:
                    self._collection = None
                    return
                self._collect_again = False
            try:
                ids = self.checkpoints.subsumed_ids(self.application)
                subsumed = [self.checkpoints.get(self.application, i) for i in ids]
            except Exception as exc:  # the next commit collects again
                logger.warning("application %s: garbage collection stopped, retried at the "
                               "next commit: %s", self.application, exc)
                with self._collection_lock:
                    self._collection = None
                return

    def sweep_chunks(self) -> SweepReport:
        """Tombstone the snapshot chunks no checkpoint can name any more (the rules:
        :mod:`~kafka_changelog.state.snapshots.chunk_sweep`); reads the whole snapshot topic."""
        live = self.snapshots.live_keys()  # before the names: a chunk named later is newer
        named = list(_snapshots(self.checkpoints.all_checkpoints()))
        for commit in self.checkpoints.all_subtask_commits():
            keyed = SubtaskState.from_bytes(commit.subtask_state).keyed
            if keyed is not None and keyed.snapshot is not None:
                named.append(keyed.snapshot)
        doomed, report = chunks_to_sweep(live, named, time.time(), self.sweep_grace_s)
        if self._sweeps_stopped.is_set():
            logger.info("application %s: the sweep stopped before deleting anything (the "
                        "coordinator is closing)", self.application)
            return report
        self.snapshots.delete_keys(doomed, f"{len(doomed)} snapshot chunks no checkpoint "
                                   f"names (application {self.application}'s sweep)")
        if doomed:
            logger.info("application %s: swept %d of %d snapshot chunks that no checkpoint "
                        "names", self.application, len(doomed), len(live))
        self.last_sweep = report
        return report

    def wait_for_sweep(self, timeout_s: float | None = None) -> None:
        """Wait for the background sweep started by a commit, if one runs."""
        thread = self._sweep_thread
        if thread is not None:
            thread.join(timeout_s)

    def stop_sweeps(self, timeout_s: float) -> bool:
        """Start no more background sweeps and wait up to ``timeout_s`` for a running one
        (which deletes nothing from now on: a sweep cut short only leaves chunks for the
        next one). Whether no sweep thread runs any more."""
        self._sweeps_stopped.set()
        thread = self._sweep_thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _sweep_when_due(self) -> None:
        interval = self.sweep_interval_s
        now = time.monotonic()
        if (self._sweeps_stopped.is_set() or interval is None
                or (self._swept_at is not None and now - self._swept_at < interval)
                or (self._sweep_thread is not None and self._sweep_thread.is_alive())):
            return
        self._swept_at = now
        self._sweep_thread = threading.Thread(
            target=self._sweep_logging, name=f"kafka-changelog-sweep-{self.application}",
            daemon=True)
        self._sweep_thread.start()

    def _sweep_logging(self) -> None:
        try:
            self.sweep_chunks()
        except Exception as exc:  # a chunk left costs space until the next sweep
            logger.warning("application %s: the sweep of snapshot topic %s stopped, retried "
                           "in %s s: %s", self.application, self.snapshots.topic,
                           self.sweep_interval_s, exc, exc_info=True)

    def _log_floors(self) -> tuple[LogFloor, ...]:
        """Where this application may still write records a later checkpoint uses.

        Read before the commit, so everything written after it lies above. When the
        storage cannot tell right now, the latest checkpoint's floors (lower, so safe)
        stand in; without a latest checkpoint the error fails the commit.
        """
        try:
            return tuple(self.storage.uncommitted_floors())
        except Exception as exc:
            latest = self.checkpoints.latest(self.application)
            if latest is None:
                raise
            logger.warning("application %s: cannot read the changelog end offsets (%s); "
                           "recording the previous log floors instead", self.application, exc)
            return latest.log_floors

    def retained(self) -> list[CompletedCheckpoint]:
        """Checkpoints retention keeps (newest last): the newest ``retain`` and, with
        ``retain_for_s``, older ones younger than that (``CheckpointStore.retained_ids``)."""
        return self.checkpoints.retained_checkpoints(self.application)

    def collect_garbage(self, subsumed: Sequence[CompletedCheckpoint]) -> GarbageReport:
        """Remove ``subsumed`` and everything of theirs nobody needs (module docstring).

        Never raises: a failure is logged and kept in the report's ``error``; the next
        commit returns the subsumed checkpoints not yet discarded and collects again.
        """
        report = GarbageReport()
        try:
            self._collect(subsumed, report)
        except Exception as exc:  # the checkpoint is committed anyway
            report.error = f"{type(exc).__name__}: {exc}"
            logger.warning("application %s: garbage collection stopped, retried at the next "
                           "commit: %s", self.application, report.error, exc_info=True)
        return report

    def _collect(self, subsumed: Sequence[CompletedCheckpoint], report: GarbageReport) -> None:
        subsumed_ids = {cp.checkpoint_id for cp in subsumed}
        retained = [cp for cp in self.retained() if cp.checkpoint_id not in subsumed_ids]
        # A forked application's checkpoints name chunks of the one it was forked from
        # (state/history/fork.py), and the other way round: keep what any other one names.
        others = [cp for cp in self.checkpoints.all_checkpoints()
                  if cp.application != self.application]
        keep = {(backend, chunk.record_key(backend))
                for backend, chunk in _chunks([*retained, *others])}
        doomed: dict[str, list[ChunkRef]] = {}
        for backend, chunk in _chunks(subsumed):
            if (backend, chunk.record_key(backend)) not in keep:
                doomed.setdefault(backend, []).append(chunk)
        # Chunks first: until its record is discarded, a subsumed checkpoint comes back
        # from the next commit and its chunks are tombstoned again (idempotent).
        for backend, chunks in doomed.items():
            unique = list({c.record_key(backend): c for c in chunks}.values())
            self.snapshots.delete(unique, backend)
            report.deleted_chunks += len(unique)
        for checkpoint in subsumed:
            self.checkpoints.discard(self.application, checkpoint.checkpoint_id)
            report.discarded_checkpoints.append(checkpoint.checkpoint_id)
            self.storage.release_checkpoint(checkpoint.checkpoint_id)
        if report.discarded_checkpoints:
            logger.info("application %s: discarded checkpoints %s and %d snapshot chunks",
                        self.application, report.discarded_checkpoints, report.deleted_chunks)
        if self.changelog_gc:
            result = self.storage.collect_garbage(self._still_needed)
            if result is not None:
                report.changelog_log_start = dict(result.deleted_below)

    def _still_needed(self) -> tuple[list[ChangelogHandle], list[LogFloor]]:
        """What no application sharing the checkpoint topic may lose: the changelog
        handles of every stored checkpoint and every application's log floors. The
        storage asks only after reading its high watermarks (so nothing written later
        is missed)."""
        handles = [h for cp in self.checkpoints.all_checkpoints() for h in _changelog_handles(cp)]
        return handles, self.checkpoints.log_floors()

    # -- restore -------------------------------------------------------------------------

    def checkpoint(self, checkpoint_id: int | None = None) -> CompletedCheckpoint | None:
        """The given checkpoint, or the latest (None when there is none yet)."""
        if checkpoint_id is None:
            return self.checkpoints.latest(self.application)
        return self.checkpoints.get(self.application, checkpoint_id)

    def restore_keyed(
        self,
        operator_id: str,
        key_group_range: KeyGroupRange,
        checkpoint: CompletedCheckpoint | None,
        reader: StateChangelogReader[Any] | object | None = None,
        materialization: MaterializationConfig | None = None,
        local_recovery: LocalRecoveryStore | None = None,
        state_backend: StateBackendConfig | None = None,
    ) -> ChangelogKeyedStateBackend:
        """A keyed backend for ``key_group_range`` with the operator's state at ``checkpoint``
        (whatever parallelism wrote it), or an empty one when ``checkpoint`` is None.

        ``reader`` reads the changelog (default: a reader of the coordinator's storage).
        Anything else passed there (a client config, as before 0.2) is ignored: the
        storage knows how to read its handles. ``state_backend`` picks the working copy
        (default: the coordinator's); any kind restores checkpoints written by any other.
        """
        handles: list[KeyedStateHandle] = []
        if checkpoint is not None:
            checkpoint.require_max_parallelism(self.max_parallelism)
            handles = [s.keyed for s in checkpoint.subtasks_of(operator_id)
                       if s.keyed is not None]
        else:
            self.guard_first_writes()
        table = (state_backend or self.state_backend).create_table(operator_id)
        if not handles:
            try:
                return ChangelogKeyedStateBackend(
                    self.storage, self.snapshots, operator_id, key_group_range,
                    self.max_parallelism, materialization, local_recovery=local_recovery,
                    table=table)
            except BaseException:
                table.close()
                raise
        return restore_backend(
            self.storage, self.snapshots, operator_id, key_group_range, self.max_parallelism,
            handles, reader if isinstance(reader, StateChangelogReader) else None,
            materialization, local_recovery, table)

    def guard_first_writes(self) -> None:
        """Before the application's first checkpoint, record where it starts writing.

        Other applications' garbage collection keeps these offsets until this one
        commits a checkpoint (whose log floors take over). Nothing happens once the
        application has a checkpoint or when the storage keeps no offsets, nor after this
        coordinator's first guard (what is written later lies above its floors: one guard
        per process, not one per batch until the first commit).
        """
        if self._guarded or self.checkpoints.checkpoint_ids(self.application):
            return
        floors = self.storage.uncommitted_floors()
        if floors:
            self.checkpoints.guard(self.application, floors)
            self._guarded = True

    def restore_operator_state(
        self, operator_id: str, subtask_index: int, parallelism: int,
        checkpoint: CompletedCheckpoint | None,
    ) -> OperatorStateBackend:
        """The operator state of one subtask, redistributed to ``parallelism``."""
        if checkpoint is None:
            return OperatorStateBackend(operator_id, subtask_index)
        old = [s.operator for s in checkpoint.subtasks_of(operator_id) if s.operator is not None]
        if not old:
            return OperatorStateBackend(operator_id, subtask_index)
        return OperatorStateBackend(operator_id, subtask_index,
                                    redistribute(old, parallelism)[subtask_index])


def _snapshots(checkpoints: Iterable[CompletedCheckpoint]) -> Iterable[SnapshotHandle]:
    for checkpoint in checkpoints:
        for subtask in checkpoint.subtasks:
            if subtask.keyed is not None and subtask.keyed.snapshot is not None:
                yield subtask.keyed.snapshot


def _chunks(checkpoints: Iterable[CompletedCheckpoint]) -> Iterable[tuple[str, ChunkRef]]:
    for snapshot in _snapshots(checkpoints):
        for chunk in snapshot.chunks:
            yield snapshot.backend_id, chunk


def _changelog_handles(checkpoint: CompletedCheckpoint) -> Iterable[ChangelogHandle]:
    for subtask in checkpoint.subtasks:
        if subtask.keyed is not None:
            yield from subtask.keyed.changelog
