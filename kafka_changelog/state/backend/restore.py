"""Restore: keyed state of any old key-group ranges into a backend for a new range.

Snapshot chunks first (task-local copies when valid), then each changelog handle
replayed in order through a storage reader. One old subtask with exactly the new
range is *adopted* (its snapshot and log stay the base, nothing is rewritten);
anything else (rescaling) is materialized at once under a new backend id, so later
checkpoints need nothing of the old ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...change import StateChange
from ...keygroups import KeyGroupRange
from ...reader import StateChangelogReader
from ...storage import StateChangelogStorage
from ..checkpoints.checkpoint import KeyedStateHandle
from ..schema.op_run import OpRun
from ..schema.ops import StateMeta, StateOp
from ..snapshots.delta_layer import apply_delta
from ..snapshots.materialization import materialized_at
from ..snapshots.materializer import MaterializationConfig
from ..snapshots.snapshot_store import SnapshotStore
from ..tables.protocol import BulkLoadTable, KeyedStateTable
from .column_replay import collect_columns, replay_columns
from .keyed_backend import ChangelogKeyedStateBackend
from .local_recovery import LocalRecoveryStore

logger = logging.getLogger(__name__)


def restore_backend(
    storage: StateChangelogStorage[Any],
    snapshot_store: SnapshotStore,
    operator_id: str,
    key_group_range: KeyGroupRange,
    max_parallelism: int,
    handles: Sequence[KeyedStateHandle],
    reader: StateChangelogReader[Any] | None = None,
    materialization: MaterializationConfig | None = None,
    local_recovery: LocalRecoveryStore | None = None,
    table: KeyedStateTable | None = None,
) -> ChangelogKeyedStateBackend:
    """A backend for ``key_group_range`` with the state of ``handles`` (any old ranges).

    ``reader`` reads the changelog handles (default: a reader of ``storage``, closed
    afterwards). ``table`` is the empty working copy to restore into (default: in
    memory); the backend owns it (a failed restore closes it).
    """
    started = time.monotonic()
    narrowed = [n for h in handles if (n := h.intersection(key_group_range)) is not None]
    # Adopt only an untouched base: one old subtask with exactly this range (the other
    # old subtasks' ranges do not overlap it).
    adopt = len(narrowed) == 1 and narrowed[0].key_group_range == key_group_range and any(
        h.key_group_range == key_group_range for h in handles)
    try:
        backend = ChangelogKeyedStateBackend(
            storage, snapshot_store, operator_id, key_group_range, max_parallelism,
            materialization, narrowed[0].backend_id if adopt else None, local_recovery, table)
    except BaseException:
        if table is not None:
            table.close()
        raise
    own_reader = reader is None
    changelog = storage.reader() if reader is None else reader
    try:
        replayed: set[int] = set()
        for handle in narrowed:
            replayed |= load_keyed_state(backend.table, handle, key_group_range,
                                         snapshot_store, changelog, local_recovery)
    except BaseException:
        backend.close()
        raise
    finally:
        if own_reader:
            changelog.close()
    if adopt:
        backend.adopt_base(narrowed[0], replayed)
        if materialization is not None and materialization.interval_s:
            # Keep the restored state's schedule: the next materialization is due an
            # interval after its snapshot was made (at once when it has none), not an
            # interval after this restore (a subtask restored at every batch would
            # otherwise never materialize).
            backend.schedule_materialization(
                materialized_at(narrowed[0].materialization_id) + materialization.interval_s)
    else:
        backend.materialize_restored()
    logger.info("restored operator %s key groups %s from %d handle(s): %d key groups with "
                "state, %.3f s%s", operator_id, key_group_range, len(narrowed),
                len(backend.table.key_groups()), time.monotonic() - started,
                "" if adopt else " (rescaled: materialized anew)")
    return backend


def load_keyed_state(
    table: KeyedStateTable,
    handle: KeyedStateHandle,
    key_group_range: KeyGroupRange,
    snapshot_store: SnapshotStore,
    reader: StateChangelogReader[Any],
    local: LocalRecoveryStore | None = None,
) -> set[int]:
    """Snapshot chunks first, then the changelog in order, into ``table``.

    Valid task-local copies are used first; anything else comes from the snapshot
    store and ``reader``. Returns the key groups the changelog changed.
    """
    snapshot = handle.snapshot
    if snapshot is not None and local is not None:
        remote = set()
        for key_group in snapshot.key_groups:
            if key_group_range.contains(key_group):
                # Task-local copies are of whole key groups: a layered one is read remotely.
                layered = len(snapshot.layers_of(key_group)) > 1
                data = None if layered else local.get_key_group(
                    snapshot.backend_id, snapshot.chunks_of(key_group))
                if data is None:
                    remote.add(key_group)
                else:
                    table.load_group(key_group, data)
        snapshot = dataclasses.replace(
            snapshot, chunks=tuple(c for c in snapshot.chunks if c.key_group in remote))
    changed: set[int] = set()
    if snapshot is not None and snapshot.chunks:
        tail: dict[int, list[OpRun]] | None = None
        if (isinstance(table, BulkLoadTable) and not snapshot.layered
                and sum(c.state_size for c in handle.changelog) <= MERGED_TAIL_BYTES):
            # A small tail is read first and merged into the snapshot as it is loaded
            # (BulkLoadTable.load_groups); with delta layers it must come after them.
            tail = collect_tail(table, reader, handle.changelog, key_group_range, local)
            changed.update(tail)
        load_layers(table, snapshot_store.read_layers(snapshot, key_group_range), tail)
        if tail is not None:
            return changed
    _each_piece(handle.changelog, local, lambda pieces: replay_pieces(
        table, reader, pieces, key_group_range, changed), lambda kept: replay_changes(
        table, kept, key_group_range, changed))
    return changed


def _each_piece(pieces: Sequence[Any], local: LocalRecoveryStore | None,
                read: Callable[[Sequence[Any]], None],
                kept: Callable[[Sequence[StateChange]], None]) -> None:
    """Hand the changelog ``pieces`` (in order) to ``read`` (to read from Kafka), all
    together when no local copies exist, else each piece without a valid local copy;
    those with one, to ``kept`` as the changes kept."""
    if local is None:
        read(pieces)
        return
    for piece in pieces:
        changes = local.get_changes(piece)
        if changes is None:
            read([piece])
        else:
            kept(changes)


#: A changelog tail up to this many bytes (its handles' ``state_size``) is held in memory
#: as runs of ops during a restore into a :class:`BulkLoadTable`, to be merged into the snapshot;
#: a longer one is replayed after it.
MERGED_TAIL_BYTES = 16 << 20


def collect_tail(table: KeyedStateTable, reader: StateChangelogReader[Any],
                 pieces: Sequence[Any], key_group_range: KeyGroupRange,
                 local: LocalRecoveryStore | None) -> dict[int, list[OpRun]]:
    """The ops of ``key_group_range`` in the changelog ``pieces`` (of one handle, in
    order) by key group, as runs of one state and op kind in log order; registrations go
    into ``table`` at once. Pieces read from Kafka are collected column-wise
    (:func:`.column_replay.collect_columns`) when the reader decodes them so, else change
    by change (:func:`collect_changes`), as are valid local copies."""
    tail: dict[int, list[OpRun]] = {}

    def read(some: Sequence[Any]) -> None:
        columns = reader.read_columns(some)
        if columns is None or not collect_columns(table, columns, key_group_range, tail):
            for piece in some:
                collect_changes(table, reader.read(piece), key_group_range, tail)

    _each_piece(pieces, local, read,
                lambda kept: collect_changes(table, kept, key_group_range, tail))
    return tail


def collect_changes(table: KeyedStateTable, changes: Iterable[StateChange],
                    key_group_range: KeyGroupRange, tail: dict[int, list[OpRun]]) -> None:
    """Registrations of ``changes`` into ``table`` at once, the ops of
    ``key_group_range`` appended to ``tail`` by key group as runs of one state and op
    kind (each key group's in log order: key groups are independent, so applying them
    replays as the log order does)."""
    contains = key_group_range.contains
    decode = StateOp.from_bytes
    for change in changes:
        if change.is_meta:
            table.register(StateMeta.from_bytes(change.payload))
        elif contains(change.key_group):
            op = decode(change.payload)
            runs = tail.get(change.key_group)
            if runs is None:
                tail[change.key_group] = [OpRun.started(op)]
            elif runs[-1].state == op.state and runs[-1].op is op.op:
                runs[-1].add(op)
            else:
                runs.append(OpRun.started(op))


def load_layers(table: KeyedStateTable, layers: Iterable[tuple[int, bytes, bool]],
                tail: Mapping[int, Sequence[OpRun]] | None = None) -> None:
    """Load snapshot layers (key group, serialized layer, whether a delta) in order:
    the whole states before the first delta in one :meth:`BulkLoadTable.load_groups` when
    the table has it (a snapshot's layers come whole states first), each later layer on
    its own (a delta merged into its key group's state, a whole state replacing it).
    ``tail``: runs of ops (by key group, in log order) to apply after the layers; only for a
    :class:`BulkLoadTable` and layers without deltas (ValueError otherwise)."""
    found = iter(layers)
    first_delta: tuple[int, bytes] | None = None

    def whole_states() -> Iterator[tuple[int, bytes]]:
        nonlocal first_delta
        for key_group, data, delta in found:
            if delta:
                first_delta = (key_group, data)
                return
            yield key_group, data

    if isinstance(table, BulkLoadTable):
        table.load_groups(whole_states(), tail)
    else:
        if tail is not None:
            raise ValueError(f"a changelog tail is merged only into a bulk-loading table, "
                             f"not {type(table).__name__}")
        for key_group, data in whole_states():
            table.load_group(key_group, data)
    if first_delta is not None:
        if tail is not None:
            raise ValueError(f"snapshot delta of key group {first_delta[0]}: a changelog "
                             "tail merged into the snapshot must come after its deltas")
        apply_delta(table, *first_delta)
    for key_group, data, delta in found:
        if delta:
            apply_delta(table, key_group, data)
        else:
            table.load_group(key_group, data)


def replay_pieces(table: KeyedStateTable, reader: StateChangelogReader[Any],
                  pieces: Sequence[Any], key_group_range: KeyGroupRange,
                  changed: set[int]) -> None:
    """Read the changelog ``pieces`` (of one handle, in order) with ``reader`` and replay
    them into ``table``: all read together and replayed column-wise
    (:mod:`.column_replay`) when the reader can, else piece by piece (column-wise when the
    reader decodes it so, else change by change: :func:`replay_changes`); adds the key
    groups changed to ``changed``."""
    if len(pieces) > 1:
        together = reader.read_columns(pieces)
        if together is not None and replay_columns(table, together, key_group_range,
                                                   changed):
            return
    for piece in pieces:
        columns = reader.read_columns([piece])
        if columns is None:
            replay_changes(table, reader.read(piece), key_group_range, changed)
        elif not replay_columns(table, columns, key_group_range, changed):
            replay_changes(table, columns.changes(), key_group_range, changed)


#: Ops a replay hands the table at once (:meth:`KeyedStateTable.apply_batch`).
REPLAY_BATCH = 4096


def replay_changes(table: KeyedStateTable, changes: Iterable[StateChange],
                   key_group_range: KeyGroupRange, changed: set[int]) -> None:
    """Apply ``changes`` (in log order) to ``table``: registrations at once, the ops of
    ``key_group_range`` in batches; adds the key groups changed to ``changed``."""
    ops: list[tuple[int, StateOp]] = []
    contains = key_group_range.contains
    decode = StateOp.from_bytes
    for change in changes:
        if change.is_meta:
            if ops:
                table.apply_batch(ops)
                ops = []
            table.register(StateMeta.from_bytes(change.payload))
        elif contains(change.key_group):
            ops.append((change.key_group, decode(change.payload)))
            changed.add(change.key_group)
            if len(ops) >= REPLAY_BATCH:
                table.apply_batch(ops)
                ops = []
    if ops:
        table.apply_batch(ops)
