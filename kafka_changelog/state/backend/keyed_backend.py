"""The changelog keyed state backend: a working copy, every mutation logged.

State lives in a working copy (a :class:`KeyedStateTable`: in memory by default, or
RocksDB) and every mutation is appended to a changelog writer. A checkpoint persists
the log since the last materialization; materialization writes a snapshot of the
changed key groups (reusing the chunks of unchanged ones) and truncates the log, so
restore costs O(state + tail).

The backend is one object in four parts, each in its own module and readable alone,
the way Flink splits its changelog backend from the materialization manager and the
timer service:

- this module: the working copy and its change log (keys, state objects,
  registrations, mutations);
- :mod:`~kafka_changelog.state.backend.keyed_checkpoints`: snapshots for checkpoints;
- :mod:`~kafka_changelog.state.backend.keyed_materialization`: the materialized base
  and its replacement (the target the materialization manager schedules);
- :mod:`~kafka_changelog.state.backend.keyed_time`: TTL expiry and timers.

Invariants of this part:

- Every mutation reaches the working copy and the log together, in the same order
  (:meth:`ChangelogKeyedStateBackend._apply_and_log`, :meth:`mutate_columns`), and marks
  its key group changed; with local recovery it is also journaled (the journal is
  exactly the next checkpoint's changelog since the materialization).
- The current key's changes are buffered as net changes and applied and logged when the
  key changes, before a snapshot or a materialization, and before anything else reads
  the working copy or the log (:attr:`table`).
- Every registration is logged before the first change of its state, and every log
  segment a checkpoint may start from begins with all registrations
  (:meth:`_log_all_metas`), so a replay never meets a change of a state it does not know.
- A state keeps the descriptor it was first used with; a new declaration must read what
  earlier ones wrote (:mod:`~kafka_changelog.state.schema.evolution`).
- Key access is where the operator thread acts on the materialization timer.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from ...change import StateChange, new_unchecked
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange, check_parallelism, key_group_for_key
from ...sequence import SequenceNumber
from ...storage import StateChangelogStorage
from ...writer import StateChangelogWriter
from ..errors import NoCurrentKeyError, StateMismatchError
from ..schema.descriptors import StateDescriptor, StateKind
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
from ..snapshots.materialization import MaterializationManager
from ..snapshots.materializer import MaterializationConfig
from ..snapshots.snapshot import SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore
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
from ..time.timers import TIMERS_STATE, TimerService
from ..time.ttl_state import (
    TtlAggregatingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    check_ttl_unchanged,
)
from .keyed_checkpoints import KeyedCheckpoints
from .keyed_time import TIMERS_DESCRIPTOR, KeyedTime
from .local_recovery import LocalRecoveryStore

logger = logging.getLogger(__name__)

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

#: The mutations that apply to each kind of state (what the state objects log).
_OPS_OF_KIND: dict[StateKind, frozenset[OpKind]] = {
    StateKind.VALUE: frozenset({SET, DELETE}),
    StateKind.REDUCING: frozenset({SET, DELETE}),
    StateKind.AGGREGATING: frozenset({SET, DELETE}),
    StateKind.LIST: frozenset({LIST_ADD, LIST_REPLACE, DELETE}),
    StateKind.MAP: frozenset({MAP_PUT, MAP_REMOVE, DELETE}),
}



class ChangelogKeyedStateBackend(KeyedCheckpoints, KeyedTime):
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
        # The processing time TTL and processing-time timers see (None: the wall clock),
        # and the timers (keyed_time.py).
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

    def key_groups(self) -> Iterator[int]:
        """This backend's key groups, in order."""
        return iter(range(self.key_group_range.start, self.key_group_range.end + 1))


    def register(self, descriptor: StateDescriptor) -> StateDescriptor:
        """Register ``descriptor``'s state (logged on first use, as :meth:`state` does) and
        return the descriptor the backend knows under its name (the first one used).

        A declaration that cannot read what the state's earlier ones wrote (another kind
        or serializer type, an Avro schema without a resolution: see
        :mod:`~kafka_changelog.state.schema.evolution`) raises
        :class:`~kafka_changelog.state.errors.StateSchemaError`; the descriptor returned
        reads every value the state's earlier Avro schemas wrote.
        """
        if descriptor.name == TIMERS_STATE and descriptor is not TIMERS_DESCRIPTOR:
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

    # -- metrics and inspection ------------------------------------------------------------

    def take_logged(self) -> tuple[int, int]:
        """Changes logged and their payload bytes since the last call (metrics).

        What a restore logs counts too (the registrations its next checkpoint persists),
        but not what its own materialization truncates at once (rescaling)."""
        logged = (self._logged_changes, self._logged_bytes)
        self._logged_changes = self._logged_bytes = 0
        return logged

    def state_rows(self) -> int:
        """Entries in the working copy (a key of a value or list state is one; a map
        counts each of its entries)."""
        return self.table.entry_count()

    @property
    def writer(self) -> StateChangelogWriter[Any]:
        """The changelog writer (for inspection)."""
        return self._writer

    # -- the end ---------------------------------------------------------------------------

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
