"""The changelog keyed state backend: a working copy, every mutation logged.

State lives in a working copy (a :class:`KeyedStateTable`: in memory by default, or
RocksDB) and every mutation is appended to a changelog writer. A checkpoint persists
the log since the last materialization; materialization writes a snapshot of the
changed key groups (reusing the chunks of unchanged ones) and truncates the log, so
restore costs O(state + tail).

Why this module is long: the backend is one object whose invariants tie its parts
together (the log position each checkpoint and materialization refers to, the changed
key groups, the chunks handed out, the current key's buffered changes). The parts that
need none of its private state live beside it: the state objects (``state_objects``,
``ttl_state``), the current key's buffer (``key_buffer``), timers (``timers``), the
materialization schedule (``materialization``, ``materializer``) and restore
(``restore``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from ...change import StateChange, new_unchecked
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange, check_parallelism, key_group_for_key
from ...sequence import SequenceNumber
from ...storage import StateChangelogStorage
from ...writer import SnapshotResult, StateChangelogWriter
from ..checkpoints.checkpoint import KeyedStateHandle
from ..errors import NoCurrentKeyError, StateMismatchError
from ..schema.descriptors import StateDescriptor, StateKind, map_state
from ..schema.evolution import evolve_meta, requested_meta, resolved_descriptor
from ..schema.ops import (
    DELETE,
    LIST_ADD,
    LIST_REPLACE,
    MAP_PUT,
    MAP_REMOVE,
    SET,
    OpKind,
    StateMeta,
    StateOp,
    encode_ops,
)
from ..schema.ttl import split_serializer_name
from ..snapshots.materialization import (
    MaterializationManager,
    MaterializationStats,
    next_materialization_id,
)
from ..snapshots.materializer import MaterializationConfig, PeriodicMaterializer
from ..snapshots.snapshot import ChunkRef, SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore, finish_or_abandon
from ..tables.key_buffer import KeyChangeBuffer
from ..tables.memory import StateTable
from ..tables.protocol import Entry, KeyedStateTable
from ..tables.state_objects import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from ..time.timers import TIMERS_STATE, TimeDomain, Timer, TimerService
from ..time.ttl_state import (
    TtlAggregatingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    check_ttl_unchanged,
    expire_entries,
)
from .local_recovery import BASE, MATERIALIZING, LocalKeyedStateHandle, LocalRecoveryStore

logger = logging.getLogger(__name__)


def _raising(error: Exception) -> Callable[[], SnapshotHandle]:
    """A materialization's write that fails with ``error`` (in the background, where a
    failed write is counted and retried)."""
    def fail() -> SnapshotHandle:
        raise error
    return fail


_STATE_TYPES: dict[StateKind, type[Any]] = {
    StateKind.VALUE: ValueState,
    StateKind.LIST: ListState,
    StateKind.MAP: MapState,
    StateKind.REDUCING: ReducingState,
    StateKind.AGGREGATING: AggregatingState,
}

_TTL_STATE_TYPES: dict[StateKind, type[Any]] = {
    StateKind.VALUE: TtlValueState,
    StateKind.LIST: TtlListState,
    StateKind.MAP: TtlMapState,
    StateKind.REDUCING: TtlReducingState,
    StateKind.AGGREGATING: TtlAggregatingState,
}

#: The registration of the reserved state of every key's timers.
_TIMERS_META = StateMeta(TIMERS_STATE, StateKind.MAP, "bytes", "bytes")
_TIMERS_DESCRIPTOR = map_state(TIMERS_STATE)

#: The mutations that apply to each kind of state (what the state objects log).
_OPS_OF_KIND: dict[StateKind, frozenset[OpKind]] = {
    StateKind.VALUE: frozenset({SET, DELETE}),
    StateKind.REDUCING: frozenset({SET, DELETE}),
    StateKind.AGGREGATING: frozenset({SET, DELETE}),
    StateKind.LIST: frozenset({LIST_ADD, LIST_REPLACE, DELETE}),
    StateKind.MAP: frozenset({MAP_PUT, MAP_REMOVE, DELETE}),
}


class ChangelogKeyedStateBackend:
    """Keyed state (value, list, map, reducing, aggregating) over a changelog storage.

    Not thread-safe: one operator thread sets the current key, reads and writes
    state, and takes snapshots. Materialization's I/O runs on a background thread.
    """

    def __init__(
        self,
        storage: StateChangelogStorage[Any],
        snapshot_store: SnapshotStore,
        operator_id: str,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        materialization: MaterializationConfig | None = None,
        backend_id: str | None = None,
        local_recovery: LocalRecoveryStore | None = None,
        table: KeyedStateTable | None = None,
    ) -> None:
        """``table`` is the working copy (default: an in-memory :class:`StateTable`); the
        backend owns it from now on and closes it in :meth:`close`."""
        check_parallelism(max_parallelism)
        if not key_group_range.is_empty and key_group_range.end >= max_parallelism:
            raise ValueError(f"key-group range {key_group_range} exceeds max parallelism "
                             f"{max_parallelism}")
        self.operator_id = operator_id
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self._table: KeyedStateTable = table if table is not None else StateTable()
        # The current key's changes, applied and logged when the key changes (or before
        # anything else reads the table or the log).
        self._buffer = KeyChangeBuffer(self._table, self._apply_and_log)
        # State objects by state name, with the descriptor each was asked for by.
        self._state_objects: dict[str, tuple[StateDescriptor, Any]] = {}
        self._storage = storage
        self._store = snapshot_store
        self._writer: StateChangelogWriter[Any] = storage.create_writer(
            operator_id, key_group_range)
        self.backend_id = backend_id or f"{operator_id}-{uuid.uuid4().hex[:12]}"
        self._materialization = MaterializationManager(
            materialization or MaterializationConfig(interval_s=None), self.backend_id)
        self._descriptors: dict[str, StateDescriptor] = {}
        self._dropped: set[str] = set()  # dropped by drop_state
        self._current: tuple[int, bytes] | None = None
        # The materialized base: snapshot, where the log continues, and (after a restore
        # that adopted an earlier backend's base) that backend's log since its snapshot.
        self.materialization_id = 0
        self.snapshot_handle: SnapshotHandle | None = None
        self._materialized_upto = self._writer.initial_sequence_number()
        self._base_changelog: tuple[ChangelogHandle, ...] = ()
        # The newest materialization a checkpoint handle refers to: chunks written by
        # later ones are in no checkpoint, so when superseded (or at close) they are
        # nobody's and the backend tombstones them itself.
        self._handed_out_upto = 0
        self._changed: set[int] = set()
        # Changes logged (and their payload bytes) since the last take_logged().
        self._logged_changes = 0
        self._logged_bytes = 0
        self._checkpoints: dict[int, tuple[SequenceNumber, SequenceNumber]] = {}
        self._lock = threading.Lock()
        # Local recovery keeps a journal of what was logged since the materialization:
        # exactly the changes of the next checkpoint's changelog handle.
        self._local = local_recovery
        self._journal: list[StateChange] = []
        # This backend's name for what it holds in the local store (unique even when a
        # restored backend adopts an earlier one's backend id).
        self._local_owner = f"{self.backend_id}#{uuid.uuid4().hex[:8]}"
        # The processing time TTL and processing-time timers see (None: the wall clock).
        self._processing_time_ms: int | None = None
        self._timers = TimerService(self)

    # -- keys and state access -------------------------------------------------------------

    def set_current_key(self, key: bytes, key_group: int | None = None) -> None:
        """Scope state access to ``key`` (its key group must be in this backend's range).

        ``key_group`` is the key's key group when the caller has it already (Spark
        computes it with the row); it must equal ``key_group_for_key(key, max_p)``.
        """
        if key_group is None:
            key_group = key_group_for_key(key, self.max_parallelism)
        if not self.key_group_range.contains(key_group):
            from ...errors import KeyGroupOutOfRangeError

            raise KeyGroupOutOfRangeError(key_group, self.key_group_range, self.backend_id)
        self._buffer.switch(key_group, key)
        self._current = (key_group, key)
        self._act_on_timer()
        self.poll_materialization()

    def current(self) -> tuple[int, bytes]:
        """(key group, key) of the current key."""
        if self._current is None:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return self._current

    @property
    def table(self) -> KeyedStateTable:
        """The working copy, with the current key's buffered changes applied (and logged)."""
        if self._buffer.pending:
            self._buffer.flush()
        return self._table

    def flush_current_key(self) -> None:
        """Apply and log the current key's buffered changes now (they are, anyway, when the
        key changes and before a snapshot, a materialization or any read of :attr:`table`)."""
        self._buffer.flush()

    def read(self, state: str) -> Entry | None:
        """The current key's entry of ``state`` (buffered changes included)."""
        return self._buffer.read(state)

    def read_map_value(self, state: str, map_key: bytes) -> bytes | None:
        """One value of the current key's map ``state`` (buffered changes included)."""
        return self._buffer.read_map_value(state, map_key)

    def write(self, state: str, op: OpKind, map_key: bytes | None = None,
              value: bytes | None = None, values: tuple[bytes, ...] | None = None) -> None:
        """Change the current key's ``state``: buffered as the state's net change until
        the key changes, then applied and logged once (what the state objects' calls do:
        they are given the buffer itself)."""
        self._buffer.write(state, op, map_key, value, values)

    def state(self, descriptor: StateDescriptor) -> Any:
        """The state object for ``descriptor`` (registered, and logged, on first use).

        State objects hold no key (they act on the current key when called), so the
        same object serves every key: a function asking for its states once per key
        gets them from a cache instead of new objects.
        """
        cached = self._state_objects.get(descriptor.name)
        if cached is not None and cached[0] is descriptor:
            return cached[1]
        known = self.register(descriptor)
        # The current key's buffer is the state objects' context: its reads and writes
        # are what this backend's are, one call less per state call.
        if known.ttl is not None:
            made = _TTL_STATE_TYPES[known.kind](self._buffer, known, self.processing_time_ms,
                                                self._expires)
        else:
            made = _STATE_TYPES[known.kind](self._buffer, known)
        self._state_objects[descriptor.name] = (descriptor, made)
        return made

    # -- time: TTL and timers -----------------------------------------------------------

    def set_processing_time(self, time_ms: int | None) -> None:
        """Fix the processing time (ms since the epoch) that TTL and processing-time timers
        see until the next call (streaming sets the batch's); None: the wall clock."""
        self._processing_time_ms = time_ms

    def processing_time_ms(self) -> int:
        """The processing time TTL and timers see now."""
        fixed = self._processing_time_ms
        return fixed if fixed is not None else int(time.time() * 1000)

    @property
    def timers(self) -> TimerService:
        """The timers of this backend's keys (register/delete act on the current key)."""
        return self._timers

    def key_groups(self) -> Iterator[int]:
        """This backend's key groups, in order."""
        return iter(range(self.key_group_range.start, self.key_group_range.end + 1))

    def ensure_timers_state(self) -> None:
        """Register the reserved timers state (once)."""
        if TIMERS_STATE not in self._descriptors and TIMERS_STATE not in self._table.metas:
            self._buffer.flush()
            self._table.register(_TIMERS_META)
            self._append_meta(_TIMERS_META)
        self._descriptors.setdefault(TIMERS_STATE, _TIMERS_DESCRIPTOR)

    def _expires(self, state: str, expires_at_ms: int) -> None:
        self._timers.expire_at(state.encode(), expires_at_ms)

    def expire_due(self) -> int:
        """Remove the TTL'd entries expired at the processing time (their keys' expiry
        timers being due), as logged changes; returns how many keys' states were looked
        at. Entries refreshed since keep a timer at their new expiry."""
        now = self.processing_time_ms()
        due = self._timers.pop_due(TimeDomain.EXPIRY, now)
        metas = self._table.metas
        for timer in due:
            meta = metas.get(timer.tag.decode())
            if meta is None or not split_serializer_name(meta.value_serializer)[1]:
                continue  # dropped, or no longer TTL'd
            self.set_current_key(timer.key, timer.key_group)
            following = expire_entries(self._buffer, meta.state, now)
            if following is not None:
                self._timers.expire_at(timer.tag, following)
        return len(due)

    def due_timers(self, domain: TimeDomain, upto_ms: int) -> list[Timer]:
        """Take the users' timers of ``domain`` due at ``upto_ms`` (removed from the state
        as logged changes), in firing order."""
        if domain is TimeDomain.EXPIRY:
            raise ValueError("expiry timers are the backend's: see expire_due")
        return self._timers.pop_due(domain, upto_ms)

    def register(self, descriptor: StateDescriptor) -> StateDescriptor:
        """Register ``descriptor``'s state (logged on first use, as :meth:`state` does) and
        return the descriptor the backend knows under its name (the first one used).

        A declaration that cannot read what the state's earlier ones wrote (another kind
        or serializer type, an Avro schema without a resolution: see
        :mod:`~kafka_changelog.state.schema.evolution`) raises
        :class:`~kafka_changelog.state.errors.StateSchemaError`; the descriptor returned
        reads every value the state's earlier Avro schemas wrote.
        """
        if descriptor.name == TIMERS_STATE and descriptor is not _TIMERS_DESCRIPTOR:
            raise StateMismatchError(f"state name {TIMERS_STATE!r} is reserved for timers")
        known = self._descriptors.get(descriptor.name)
        if known is None:
            requested = requested_meta(descriptor)
            registered = self._table.metas.get(descriptor.name)
            check_ttl_unchanged(registered, requested)
            meta = evolve_meta(registered, requested)  # refuses what cannot read the old
            self._table.register(meta)
            self._append_meta(meta)
            known = self._descriptors[descriptor.name] = resolved_descriptor(descriptor, meta)
        return known

    def drop_state(self, name: str) -> int:
        """Delete every entry of state ``name`` in this backend's key groups, as logged
        changes, and return how many there were (0: unknown here, or already empty).

        The next materialization writes the key groups without it, and changelog GC
        then frees what held it. The state's registration stays (a restore of the log
        meets it before the deletions), so the name cannot be given another kind or
        serializer until a materialization has run since. A state this backend's
        function has used cannot be dropped (``StateMismatchError``).
        """
        if name == TIMERS_STATE:
            raise StateMismatchError(f"state name {TIMERS_STATE!r} is reserved for timers")
        if name in self._descriptors:
            raise StateMismatchError(
                f"state {name!r} is declared and in use: it cannot also be dropped")
        if name not in self._table.metas or name in self._dropped:
            return 0
        self._buffer.flush()
        dropped = 0
        for key_group in self.key_groups():
            keys = [key for key, _ in self._table.state_entries(key_group, name)]
            for key in keys:
                self._apply_and_log(key_group, StateOp(name, DELETE, key))
            dropped += len(keys)
        self._dropped.add(name)  # nothing is written to it here after: no second pass
        return dropped

    def mutate(self, key_group: int, op: StateOp) -> None:
        """Apply ``op`` to the working copy and log it now (after the buffered changes)."""
        self._buffer.flush()
        self._apply_and_log(key_group, op)

    def _apply_and_log(self, key_group: int, op: StateOp) -> None:
        self._table.apply(key_group, op)
        payload = op.to_bytes()
        self._writer.append(key_group, payload)
        self._changed.add(key_group)
        self._logged_changes += 1
        self._logged_bytes += len(payload)
        if self._local is not None:
            self._journal.append(StateChange(key_group, payload))

    # -- many keys at once (kafka_changelog.state.backend.bulk_state) ---------------------

    def prepare_keys(self, key_groups: Iterable[int]) -> None:
        """Get ready to access keys of ``key_groups`` without a current key (bulk state):
        refuses a key group outside this backend's range, as :meth:`set_current_key`
        does, and acts on the materialization timer once, as a key access does."""
        self._check_key_groups(key_groups)
        self._buffer.flush()
        self._act_on_timer()
        self.poll_materialization()

    def _check_key_groups(self, key_groups: Iterable[int]) -> None:
        contains = self.key_group_range.contains
        for key_group in set(key_groups):
            if not contains(key_group):
                from ...errors import KeyGroupOutOfRangeError

                raise KeyGroupOutOfRangeError(key_group, self.key_group_range, self.backend_id)

    def mutate_columns(
        self, state: str, op: OpKind, key_groups: Sequence[int], keys: Sequence[bytes],
        map_keys: Sequence[bytes | None] | None = None,
        values: Sequence[bytes | None] | None = None,
        items: Sequence[tuple[bytes, ...] | None] | None = None,
    ) -> None:
        """Apply and log many mutations of one registered state, given column by column:
        op ``i`` is ``StateOp(state, op, keys[i], map_keys[i], values[i], items[i])`` in
        key group ``key_groups[i]`` (a column that is None is None for all).

        The same changes are logged, in the same order, and the working copy ends the
        same as with :meth:`mutate` of each op, without building the ops: the payloads
        are encoded column by column (:func:`~kafka_changelog.state.schema.ops.encode_ops`) and
        the table applies them all (``apply_columns``) before they are appended. The key
        groups must be in this backend's range and the op must suit the state's kind
        (both checked first). A failure while applying or appending leaves the working
        copy and the log apart: discard the backend, as after any failed task.
        """
        descriptor = self._descriptors.get(state)
        if descriptor is None:
            raise StateMismatchError(f"changes for unregistered state {state!r}")
        if op not in _OPS_OF_KIND[descriptor.kind]:
            raise StateMismatchError(f"{op.value} on {descriptor.kind.value} state {state!r}")
        if not keys:
            return
        payloads = encode_ops(state, op, keys, map_keys, values, items)
        if len(key_groups) != len(payloads):
            raise ValueError(f"{len(payloads)} changes of state {state!r} but "
                             f"{len(key_groups)} key groups")
        self._check_key_groups(key_groups)
        self._buffer.flush()
        self._table.apply_columns(state, op, key_groups, keys, map_keys, values, items)
        self._writer.append_all(key_groups, payloads)
        self._changed.update(key_groups)
        self._logged_changes += len(payloads)
        self._logged_bytes += sum(map(len, payloads))
        if self._local is not None:
            self._journal += map(partial(new_unchecked, StateChange),
                                 zip(key_groups, payloads, strict=True))

    def _append_meta(self, meta: StateMeta) -> None:
        payload = meta.to_bytes()
        self._writer.append_meta(payload)
        self._logged_changes += 1
        self._logged_bytes += len(payload)
        if self._local is not None:
            self._journal.append(StateChange.meta(payload))

    def _log_all_metas(self) -> None:
        # Every log segment a checkpoint may start from begins with the registrations, so
        # replaying it never meets a change of a state it does not know.
        for meta in self._table.metas.values():
            self._append_meta(meta)

    # -- checkpoints -----------------------------------------------------------------------

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
                (*base, changelog) if changelog is not None else base)
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

    # -- materialization ---------------------------------------------------------------------

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

    def take_logged(self) -> tuple[int, int]:
        """Changes logged and their payload bytes since the last call (metrics).

        What a restore logs counts too (the registrations its next checkpoint persists),
        but not what its own materialization truncates at once (rescaling)."""
        logged = (self._logged_changes, self._logged_bytes)
        self._logged_changes = self._logged_bytes = 0
        return logged

    def state_rows(self) -> int:
        """Entries in the working copy (a key of a state; list and map states count once)."""
        return self.table.entry_count()

    @property
    def writer(self) -> StateChangelogWriter[Any]:
        """The changelog writer (for inspection)."""
        return self._writer

    # -- restore -----------------------------------------------------------------------------

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

    def close(self) -> None:
        """Stop the timer and the writer; unpersisted changes are dropped, and snapshot
        chunks no checkpoint refers to are tombstoned.

        Task-local copies of this backend's checkpoints stay (a restart on this directory
        uses them); local files it wrote that none of its checkpoints uses are deleted.
        """
        running = self.materialization_in_flight
        if running is not None:
            running.exception()  # wait: its chunks must not outlive an unused result
            self.poll_materialization()
        # Chunks written since the last handed-out materialization are in no checkpoint.
        self._drop_unused_chunks(self.snapshot_handle, None)
        self._materialization.close()
        self._writer.close()
        self._buffer.discard()
        self._table.close()
        if self._local is not None:
            try:
                self._local.close_owner(self._local_owner)
            except OSError as exc:
                logger.warning("task-local files of backend %s at close: %s",
                               self.backend_id, exc)
