"""The keyed backend's checkpoints: snapshots of its state and their outcome (a part of
:class:`~kafka_changelog.state.backend.keyed_backend.ChangelogKeyedStateBackend`).

Invariants this part keeps:

- A checkpoint's handle is the materialized base (its snapshot and the changelog of
  earlier backends it continues) plus this backend's log persisted from
  ``_materialized_upto``: it restores exactly the state at the snapshot call. The current
  key's buffered changes are flushed first, so the handle holds every change made before.
- ``_handed_out_upto`` is the newest materialization a handle refers to: chunks of later
  ones are in no checkpoint (the materialization part tombstones them when superseded).
- A persisted span is confirmed when its checkpoint completes and reset when it is
  aborted; no other part touches ``_checkpoints``.
- With local recovery, the files a checkpoint uses are retained before its persist
  completes (confirming an earlier checkpoint meanwhile must not prune them); a local
  copy is optional: a failing local disk never fails a checkpoint or the task.

What it needs of the backend's working copy is declared by the materialization part it
builds on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ...sequence import SequenceNumber
from ...writer import SnapshotResult
from ..checkpoints.checkpoint import KeyedStateHandle
from .keyed_materialization import KeyedMaterialization
from .local_recovery import LocalKeyedStateHandle

logger = logging.getLogger(__name__)


class KeyedCheckpoints(KeyedMaterialization):
    """Snapshots of a keyed backend for checkpoints, and their completion or abort.

    Built on the materialization part: a checkpoint refers to its base, and a snapshot is
    where the operator thread applies a finished materialization and acts on the timer.
    """

    # This part's own: the log span each pending checkpoint persisted.
    _checkpoints: dict[int, tuple[SequenceNumber, SequenceNumber]]

    def snapshot(self, checkpoint_id: int) -> Future[KeyedStateHandle]:
        """Persist the log since the materialization; the handle restores this exact state.

        The durable part of :meth:`snapshot_result`.
        """
        handle: Future[KeyedStateHandle] = Future()

        def done(f: Future[SnapshotResult[KeyedStateHandle]]) -> None:
            error = f.exception()
            if error is not None:
                handle.set_exception(error)
            else:
                durable = f.result().job_owned
                assert durable is not None  # snapshot_result always has one
                handle.set_result(durable)

        self.snapshot_result(checkpoint_id).add_done_callback(done)
        return handle

    def snapshot_result(self, checkpoint_id: int) -> Future[SnapshotResult[KeyedStateHandle]]:
        """Like :meth:`snapshot`, with the task-local copy.

        ``job_owned`` is the durable :class:`KeyedStateHandle`; ``task_local`` is a
        :class:`LocalKeyedStateHandle` (same state, plus the local files holding a copy of
        it) when the backend has a local recovery store, else None.

        A snapshot is also where the operator thread acts on the materialization timer,
        as at a key access: a subtask that gets no keys still materializes (started here,
        applied at a later snapshot), so its checkpoints' changelog tail stays bounded.
        """
        self._buffer.flush()  # the checkpoint holds every change made before it
        self.poll_materialization()
        self._materialization.check()
        self._act_on_timer()
        upto = self._materialized_upto
        # The table holds exactly what the log holds up to here: its count is the state's.
        entry_count = self.table.entry_count()
        persisted = self._writer.persist(upto, checkpoint_id)
        self._checkpoints[checkpoint_id] = (upto, self._writer.next_sequence_number())
        snapshot, base = self.snapshot_handle, self._base_changelog
        self._handed_out_upto = self.materialization_id
        materialization_id = self.materialization_id
        local, owner = self._local, self._local_owner
        journal = list(self._journal) if local is not None else []
        if local is not None:
            # Held from now on, before the persist completes: confirming an earlier
            # checkpoint meanwhile must not prune what this one uses.
            local.retain(owner, checkpoint_id, local.files_of(snapshot, base))
        result: Future[SnapshotResult[KeyedStateHandle]] = Future()

        def done(f: Future[SnapshotResult[Any]]) -> None:
            try:
                finish(f)
            except Exception as exc:  # a callback's exception would otherwise be lost
                if not result.done():
                    result.set_exception(exc)

        def finish(f: Future[SnapshotResult[Any]]) -> None:
            error = f.exception()
            if error is not None:
                result.set_exception(error)
                return
            changelog = f.result().job_owned
            keyed = KeyedStateHandle(
                self.backend_id, self.key_group_range, materialization_id, snapshot,
                (*base, changelog) if changelog is not None else base, entry_count)
            task_local: LocalKeyedStateHandle | None = None
            if local is not None:
                try:
                    if changelog is not None:
                        local.put_checkpoint_changes(owner, checkpoint_id, changelog, journal)
                    task_local = local.local_handle(owner, checkpoint_id, keyed)
                except OSError as exc:  # a local copy is optional; the checkpoint is not
                    logger.warning("no task-local copy of checkpoint %d of backend %s: %s",
                                   checkpoint_id, self.backend_id, exc)
            result.set_result(SnapshotResult(keyed, task_local))

        persisted.add_done_callback(done)
        return result

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint is complete: it now holds what it persisted.

        Task-local copies only older checkpoints used are deleted (with anything else in
        the local directory no kept checkpoint uses, e.g. files of earlier runs).
        """
        span = self._checkpoints.pop(checkpoint_id, None)
        if span is not None:
            self._writer.confirm(span[0], span[1], checkpoint_id)
        if self._local is not None:
            self._local_housekeeping(self._local.confirm_checkpoint, checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The checkpoint was aborted: it holds nothing (and its task-local copies go)."""
        span = self._checkpoints.pop(checkpoint_id, None)
        if span is not None:
            self._writer.reset(span[0], span[1], checkpoint_id)
        if self._local is not None:
            self._local_housekeeping(self._local.abort_checkpoint, checkpoint_id)

    def _local_housekeeping(self, action: Callable[[str, int], int], checkpoint_id: int
                            ) -> None:
        # Deleting local copies is housekeeping: a failing local disk must not fail the task.
        try:
            action(self._local_owner, checkpoint_id)
        except OSError as exc:
            logger.warning("task-local copies of backend %s at checkpoint %d: %s",
                           self.backend_id, checkpoint_id, exc)
