"""The keyed backend's materialization: the snapshot its log is truncated to (a part of
:class:`~kafka_changelog.state.backend.keyed_backend.ChangelogKeyedStateBackend`, the
target :class:`~kafka_changelog.state.snapshots.materialization.MaterializationManager`
schedules, as Flink's changelog backend is its materialization manager's).

Invariants this part keeps:

- At most one materialization runs. It is started and applied on the operator thread
  only (the timer merely marks it due, :meth:`_act_on_timer`); its I/O runs in the
  background, serialized at the start so it is consistent with the log position
  ``upto`` it covers.
- The base is ``snapshot_handle`` (with ``materialization_id``), the log position it
  covers (``_materialized_upto``) and the changelog of earlier backends it continues
  (``_base_changelog``). Applying a materialization replaces all of them at once,
  truncates the log at its ``upto`` and drops the local journal up to its cut.
- ``_changed`` holds every key group changed since the base (a running
  materialization's are handed to it): a failed one gives them back, so nothing changed
  is ever left unwritten.
- Chunks of a superseded materialization that no checkpoint handle refers to are
  tombstoned by this backend (the coordinator's collection never sees them); a chunk a
  handle refers to is never deleted here.

What it needs of the backend is declared below, as attributes and methods the backend
defines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ...change import StateChange
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange
from ...sequence import SequenceNumber
from ...writer import StateChangelogWriter
from ..checkpoints.checkpoint import KeyedStateHandle
from ..snapshots.materialization import (
    MaterializationManager,
    MaterializationStats,
    next_materialization_id,
)
from ..snapshots.materializer import PeriodicMaterializer
from ..snapshots.snapshot import ChunkRef, SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore, finish_or_abandon
from ..tables.key_buffer import KeyChangeBuffer
from ..tables.protocol import KeyedStateTable
from .local_recovery import BASE, MATERIALIZING, LocalRecoveryStore

logger = logging.getLogger(__name__)


def _raising(error: Exception) -> Callable[[], SnapshotHandle]:
    """A materialization's write that fails with ``error`` (in the background, where a
    failed write is counted and retried)."""
    def fail() -> SnapshotHandle:
        raise error
    return fail



class KeyedMaterialization:
    """Materialization of a keyed backend: started, written, applied, adopted."""

    backend_id: str
    key_group_range: KeyGroupRange
    _table: KeyedStateTable
    _buffer: KeyChangeBuffer
    _writer: StateChangelogWriter[Any]
    _store: SnapshotStore
    _local: LocalRecoveryStore | None
    _local_owner: str
    _journal: list[StateChange]
    # This part's own: the schedule and the running one, the base, what changed since.
    _materialization: MaterializationManager
    materialization_id: int
    snapshot_handle: SnapshotHandle | None
    _materialized_upto: SequenceNumber
    _base_changelog: tuple[ChangelogHandle, ...]
    _handed_out_upto: int
    _changed: set[int]

    if TYPE_CHECKING:
        @property
        def table(self) -> KeyedStateTable: ...

        def _check_key_groups(self, key_groups: Iterable[int]) -> None: ...

        def _log_all_metas(self) -> None: ...

        def take_logged(self) -> tuple[int, int]: ...

    def _act_on_timer(self) -> None:
        # The timer only marks materialization as due; the operator thread starts it.
        if self._materialization.take_due():
            self.materialize()

    @property
    def materializer(self) -> PeriodicMaterializer:
        """The materialization timer (its ``due`` event is set when one is due)."""
        return self._materialization.timer

    @property
    def materialization_in_flight(self) -> Future[SnapshotHandle] | None:
        """The materialization started but not yet applied (None when there is none)."""
        running = self._materialization.running
        return running.future if running is not None else None

    def materialize(self) -> Future[SnapshotHandle] | None:
        """Start a materialization; None when one is in flight or nothing changed."""
        self._buffer.flush()
        self.poll_materialization()
        if self._materialization.running is not None:
            return None
        if not self._changed:
            self._materialization.skipped()
            return None
        upto = self._writer.next_sequence_number()
        journal_cut = len(self._journal)
        self._log_all_metas()
        materialization_id = next_materialization_id(self.materialization_id)
        changed = set(self._changed)
        written = [kg for kg in sorted(changed) if self._table.has_entries(kg)]
        previous = self.snapshot_handle
        reused = {
            kg: previous.chunks_of(kg) for kg in self.key_group_range
            if previous is not None and kg not in changed and previous.chunks_of(kg)
        }
        if self._local is not None:
            # The files it will write, held until it is applied or has failed.
            self._local.retain(self._local_owner, MATERIALIZING, {
                self._local.snapshot_file(self.backend_id, kg, materialization_id)
                for kg in written}, replace=True)
        finish = self._write_key_groups(materialization_id, written, reused, upto.value)
        future = self._materialization.start(materialization_id, upto, changed, journal_cut,
                                             finish)
        self._changed = set()
        return future

    def _write_key_groups(
        self, materialization_id: int, key_groups: list[int],
        reused: dict[int, tuple[ChunkRef, ...]], upto: int,
    ) -> Callable[[], SnapshotHandle]:
        """Serialize the key groups now (consistent with ``upto``), one at a time, each
        handed to the snapshot store as it is done, so that only one key group's bytes are
        in memory (a store in Kafka produces them at once, and holds a bounded amount
        unacknowledged). Returns what waits for them, in the background: the handle, or
        the store's error (a failed materialization)."""
        try:
            writer = self._store.begin_write(self.backend_id, materialization_id,
                                             self.key_group_range, upto)
        except Exception as exc:
            return _raising(exc)
        local = self._local
        for key_group in key_groups:
            data = self._table.serialize_group(key_group)
            try:
                writer.add(key_group, data)
            except Exception as exc:
                writer.abandon()  # its chunks would be in no checkpoint, ever
                return _raising(exc)
            if local is not None:
                try:
                    local.put_key_group(self.backend_id, key_group, materialization_id, data,
                                        self._local_owner)
                except OSError as exc:  # the snapshot is durable; a local copy is optional
                    logger.warning("no task-local copy of materialization %d of backend %s: "
                                   "%s", materialization_id, self.backend_id, exc)
                    local = None
        return lambda: finish_or_abandon(writer, reused)

    def materialize_now(self, timeout: float = 120.0) -> SnapshotHandle | None:
        """Materialize and wait until the result is applied (tests, shutdown, restore)."""
        future = self.materialize() or self.materialization_in_flight
        if future is None:
            return self.snapshot_handle
        future.exception(timeout)
        self.poll_materialization()
        if future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
        return self.snapshot_handle

    def materialize_if_due(self) -> bool:
        """If the timer says materialization is due (or one is in flight): run it to its
        end and apply it, so that the next snapshot refers to it. For a backend that may
        not outlive the current unit of work (a Spark task: the subtask's next batch may
        run in another Python worker, and a materialization started at one snapshot and
        applied at a later one would be lost with it). Returns whether one was applied;
        a failed one counts as usual (see :meth:`poll_materialization`)."""
        self.poll_materialization()
        future = self.materialization_in_flight
        if future is None:
            if not self._materialization.take_due():
                return False
            future = self.materialize()
            if future is None:
                return False
        future.exception()  # waits; the outcome is applied (or counted) just below
        self.poll_materialization()
        return future.exception() is None

    def poll_materialization(self) -> None:
        """Apply a finished materialization (operator thread only)."""
        flight = self._materialization.finished()
        if flight is None:
            return
        error = flight.future.exception()
        if self._local is not None:
            # Failed: its files are garbage. Applied: the base hold below keeps them.
            self._local.release(self._local_owner, MATERIALIZING, delete=error is not None)
        if error is not None:
            self._changed |= flight.changed  # not materialized: still to do
            return
        self._drop_unused_chunks(self.snapshot_handle, flight.future.result())
        self.snapshot_handle = flight.future.result()
        self.materialization_id = flight.materialization_id
        self._materialized_upto = flight.upto
        self._base_changelog = ()
        self._writer.truncate(flight.upto)
        del self._journal[:flight.journal_cut]
        self._hold_base()

    @property
    def base_changelog(self) -> tuple[ChangelogHandle, ...]:
        """The changelog handles of earlier backends this one continues (after a restore
        or reattach that adopted a base), replayed before its own log."""
        return self._base_changelog

    def take_changed_for_materialization(self) -> tuple[int, set[int]] | None:
        """Start a materialization that is written elsewhere (from a copy of the working
        copy as it is now, see :mod:`~kafka_changelog.state.host.store_materialization`): the
        new materialization's id and the key groups it must write, which from now on no
        longer count as changed here (give them back with :meth:`mark_changed` if it
        fails). None when one runs in this backend or nothing changed."""
        self._buffer.flush()
        self.poll_materialization()
        if self._materialization.running is not None or not self._changed:
            return None
        changed, self._changed = self._changed, set()
        self._materialization.started_elsewhere()
        return next_materialization_id(self.materialization_id), changed

    def mark_changed(self, key_groups: Iterable[int]) -> None:
        """Count ``key_groups`` as changed since the snapshot (the next materialization
        writes them): those of a materialization that failed elsewhere."""
        self._check_key_groups(key_groups)
        self._changed.update(key_groups)

    def apply_materialization(self, snapshot: SnapshotHandle, covered: KeyedStateHandle,
                              written_bytes: int = 0) -> bool:
        """Make ``snapshot``, a materialization written elsewhere of the state at the
        checkpoint whose handle was ``covered``, this backend's base: when this backend
        continues that checkpoint (same snapshot, and its changelog begins with
        ``covered``'s), the next checkpoint refers to ``snapshot`` plus the changelog
        after ``covered``'s. Returns False (nothing changed) when it does not continue it.
        """
        self._buffer.flush()
        count = len(covered.changelog)
        if (self._materialization.running is not None
                or covered.backend_id != self.backend_id
                or snapshot.backend_id != self.backend_id
                or covered.materialization_id != self.materialization_id
                or covered.snapshot != self.snapshot_handle
                or snapshot.materialization_id <= self.materialization_id
                or snapshot.key_group_range != self.key_group_range
                or self._base_changelog[:count] != covered.changelog):
            return False
        self.snapshot_handle = snapshot
        self.materialization_id = snapshot.materialization_id
        self._base_changelog = self._base_changelog[count:]
        self._materialization.completed_elsewhere(written_bytes)
        self._hold_base()
        return True

    def _drop_unused_chunks(self, previous: SnapshotHandle | None,
                            current: SnapshotHandle | None) -> None:
        """Tombstone chunks of ``previous`` that no checkpoint refers to and ``current``
        does not reuse.

        A materialization superseded before any snapshot handed it out (or still
        unreferenced when the backend closes) is in no checkpoint, so the coordinator's
        garbage collection would never see its chunks. Best effort, in the background.
        """
        if previous is None or previous.backend_id != self.backend_id:
            return
        kept = ({c.record_key(current.backend_id) for c in current.chunks}
                if current is not None else set())
        unused = [c for c in previous.chunks if c.materialization_id > self._handed_out_upto
                  and c.record_key(self.backend_id) not in kept]
        if unused:
            self._materialization.in_background(self._delete_chunks, unused)

    def _delete_chunks(self, chunks: list[ChunkRef]) -> None:
        try:
            self._store.delete(chunks, self.backend_id)
        except Exception as exc:  # a leaked chunk costs space, never correctness
            logger.warning("backend %s: could not tombstone %d unused snapshot chunks: %s",
                           self.backend_id, len(chunks), exc)

    def _hold_base(self) -> None:
        # The next checkpoint will use the base's copies: keep them until a newer base.
        if self._local is not None:
            self._local.retain(self._local_owner, BASE, self._local.files_of(
                self.snapshot_handle, self._base_changelog), replace=True)

    def unmaterialized_key_groups(self) -> set[int]:
        """Key groups changed since the snapshot the next checkpoint refers to (a running
        materialization's included): what a backend continuing from that checkpoint
        must write at its first materialization (see :meth:`adopt_base`)."""
        self._buffer.flush()  # the current key's group counts as changed
        running = self._materialization.running
        return self._changed | (running.changed if running is not None else set())

    @property
    def materialization_due_at(self) -> float | None:
        """When materialization is next due (seconds since the epoch; now if it is due
        already); None without a timer."""
        timer = self._materialization.timer
        return time.time() if timer.due.is_set() else timer.next_due_at

    def schedule_materialization(self, at: float) -> None:
        """Make the next materialization due at ``at`` (seconds since the epoch), e.g. to
        keep the schedule of the backend whose state this one continues; a time that has
        passed makes it due at once. No-op without a timer."""
        self._materialization.timer.reschedule(at)

    @property
    def materialization_stats(self) -> MaterializationStats:
        """Completed, consecutive failed and skipped materializations."""
        return self._materialization.stats
    # -- a restored base -------------------------------------------------------------------

    def adopt_base(self, base: KeyedStateHandle, replayed: set[int]) -> None:
        """Continue from ``base`` (restored into :attr:`table`): its snapshot and log are
        this backend's base; ``replayed`` are the key groups its log changed, which the
        next materialization must write (it drops the base log)."""
        self._log_all_metas()
        self.materialization_id = base.materialization_id
        self.snapshot_handle = base.snapshot
        self._base_changelog = tuple(base.changelog)
        self._changed = set(replayed)
        if base.snapshot is not None and base.snapshot.backend_id != self.backend_id:
            # Another backend's snapshot (a forked checkpoint, state/history/fork.py): its chunks
            # cannot be reused under this backend's record keys, so the next
            # materialization writes every key group whole.
            self._changed = set(self.key_group_range)
        self._handed_out_upto = base.materialization_id  # a checkpoint refers to it
        self._hold_base()

    def materialize_restored(self) -> None:
        """Make the state restored into :attr:`table` this backend's own base, at once."""
        self._log_all_metas()
        self._changed = set(self.table.key_groups())
        self.take_logged()  # truncated by the materialization below: in no checkpoint
        self.materialize_now()
