"""Completing checkpoints, collecting what subsumed ones leave behind, and restoring.

A checkpoint is complete once its record in the checkpoint store is durable. Then
retention subsumes the oldest ones: the coordinator removes their records first
(so nothing can restore from them any more) and then deletes what no retained
checkpoint needs: snapshot chunks (tombstones) and changelog records below the
lowest offset a retained checkpoint reads (DeleteRecords). Never more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..handle import ChangelogHandle
from ..kafka.handle import KafkaChangelogHandle
from ..keygroups import KeyGroupRange
from ..storage import StateChangelogStorage
from .checkpoint import CompletedCheckpoint, KeyedStateHandle, SubtaskState
from .checkpoint_store import CheckpointStore
from .keyed_backend import ChangelogKeyedStateBackend
from .local_recovery import LocalRecoveryStore
from .materializer import MaterializationConfig
from .operator_state import OperatorStateBackend, redistribute
from .snapshot import ChunkRef
from .snapshot_store import SnapshotStore


@dataclass
class GarbageReport:
    """What one garbage collection removed."""

    discarded_checkpoints: list[int] = field(default_factory=list)
    deleted_chunks: int = 0
    changelog_log_start: dict[int, int] = field(default_factory=dict)


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
    ) -> None:
        self.application = application
        self.checkpoints = checkpoint_store
        self.snapshots = snapshot_store
        self.storage = changelog_storage
        self.max_parallelism = max_parallelism
        self.changelog_gc = changelog_gc
        self.last_garbage = GarbageReport()

    def complete(
        self, checkpoint_id: int, subtasks: Iterable[SubtaskState],
        timestamp_ms: int | None = None,
        persist: Callable[[CompletedCheckpoint], None] | None = None,
    ) -> CompletedCheckpoint:
        """Commit the checkpoint (durable on return), then collect subsumed garbage.

        ``persist`` replaces the checkpoint store's own write (see
        :meth:`CheckpointStore.commit`), e.g. a transaction that commits outputs with it.
        """
        checkpoint = CompletedCheckpoint(
            self.application, checkpoint_id,
            timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            self.max_parallelism, tuple(subtasks))
        subsumed = self.checkpoints.commit(checkpoint, persist)
        if subsumed:
            self.last_garbage = self.collect_garbage(subsumed)
        return checkpoint

    def retained(self) -> list[CompletedCheckpoint]:
        """Checkpoints retention keeps (newest last)."""
        ids = self.checkpoints.checkpoint_ids(self.application)[-self.checkpoints.retain:]
        return [self.checkpoints.get(self.application, i) for i in ids]

    def collect_garbage(self, subsumed: Sequence[CompletedCheckpoint]) -> GarbageReport:
        """Remove ``subsumed`` and everything of theirs no retained checkpoint needs."""
        report = GarbageReport()
        for checkpoint in subsumed:
            self.checkpoints.discard(self.application, checkpoint.checkpoint_id)
            report.discarded_checkpoints.append(checkpoint.checkpoint_id)
            self.storage.release_checkpoint(checkpoint.checkpoint_id)
        retained = self.retained()
        keep = {(backend, chunk.record_key(backend)) for backend, chunk in _chunks(retained)}
        doomed: dict[str, list[ChunkRef]] = {}
        for backend, chunk in _chunks(subsumed):
            if (backend, chunk.record_key(backend)) not in keep:
                doomed.setdefault(backend, []).append(chunk)
        for backend, chunks in doomed.items():
            unique = list({c.record_key(backend): c for c in chunks}.values())
            self.snapshots.delete(unique, backend)
            report.deleted_chunks += len(unique)
        collect = getattr(self.storage, "collect_garbage", None)
        if self.changelog_gc and collect is not None:
            handles = [h for cp in retained for h in _changelog_handles(cp)
                       if isinstance(h, KafkaChangelogHandle)]
            report.changelog_log_start = dict(collect(handles).deleted_below)
        return report

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
        read_context: object | None = None,
        materialization: MaterializationConfig | None = None,
        local_recovery: LocalRecoveryStore | None = None,
    ) -> ChangelogKeyedStateBackend:
        """A keyed backend for ``key_group_range`` with the operator's state at ``checkpoint``
        (whatever parallelism wrote it), or an empty one when ``checkpoint`` is None."""
        handles: list[KeyedStateHandle] = []
        if checkpoint is not None:
            handles = [s.keyed for s in checkpoint.subtasks_of(operator_id)
                       if s.keyed is not None]
        if not handles:
            return ChangelogKeyedStateBackend(
                self.storage, self.snapshots, operator_id, key_group_range,
                self.max_parallelism, materialization, local_recovery=local_recovery)
        return ChangelogKeyedStateBackend.restore(
            self.storage, self.snapshots, operator_id, key_group_range, self.max_parallelism,
            handles, read_context, materialization, local_recovery)

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


def _chunks(checkpoints: Iterable[CompletedCheckpoint]) -> Iterable[tuple[str, ChunkRef]]:
    for checkpoint in checkpoints:
        for subtask in checkpoint.subtasks:
            keyed = subtask.keyed
            if keyed is not None and keyed.snapshot is not None:
                for chunk in keyed.snapshot.chunks:
                    yield keyed.snapshot.backend_id, chunk


def _changelog_handles(checkpoint: CompletedCheckpoint) -> Iterable[ChangelogHandle]:
    for subtask in checkpoint.subtasks:
        if subtask.keyed is not None:
            yield from subtask.keyed.changelog
