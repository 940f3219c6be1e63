"""A changelog replayed column-wise: runs of ops applied to a table in bulk.

A restore or a catch-up replays what a reader decoded column-wise
(:class:`~kafka_changelog.change_columns.DecodedChanges`): the ops' fields are read for all
changes at once (:mod:`kafka_changelog.state.schema.op_columns`). Registrations are applied
where they stand in the log; between two of them, the ops are grouped by state (a stable
sort: ops of different states touch different stored keys, so only each state's own order
matters) and cut into runs of one op kind. A long run goes to
:meth:`KeyedStateTable.apply_columns
<kafka_changelog.state.tables.protocol.KeyedStateTable.apply_columns>` (one write batch and
one multi-get for the RocksDB table) instead of an op object per change; short runs (a
state whose op kinds alternate, e.g. timers moved: a remove and a put per key) go together,
op by op, to ``apply_batch``.

The per-change replay (:func:`~kafka_changelog.state.backend.restore.replay_changes`) stays
the reference: changes the column-wise decoder leaves to it (an encoding only it reads,
anything malformed, which it names) and logs it would refuse (an op of a state not
registered before it) are replayed through it, with the same result and the same error.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...avro_columns import Int64s, read_lengths
from ...change import META_KEY_GROUP
from ...change_columns import DecodedChanges
from ...keygroups import KeyGroupRange
from ..schema.op_columns import OpColumns, Slices, decode_ops
from ..schema.op_run import OpRun
from ..schema.ops import OpKind, StateMeta, StateOp
from ..tables.protocol import KeyedStateTable

#: The op kinds by their index in the schema's enum (``OpColumns.op``).
_OPS = tuple(OpKind)


@dataclass(frozen=True)
class _Decoded:
    """The kept changes' ops decoded: ``rows`` (into the changes), which are registrations,
    each op's state name and fields (``ops`` has a row per op, in the same order)."""

    rows: Int64s
    meta: np.ndarray
    state_names: list[str]
    state_ids: Int64s
    ops: OpColumns
    #: The change (position in the changes) of each op.
    op_rows: Int64s

    @cached_property
    def item_starts(self) -> Int64s:
        """Where each op's ``values`` items start among all ops' items (one more: the end)."""
        return np.concatenate(([0], np.cumsum(self.ops.values.counts)))


#: Runs shorter than this are applied op by op (``apply_batch``), several at once: a call
#: of ``apply_columns`` costs more than a few ops' objects.
MIN_COLUMN_RUN = 32


def replay_columns(table: KeyedStateTable, changes: DecodedChanges,
                   key_group_range: KeyGroupRange, changed: set[int]) -> bool:
    """Apply ``changes`` (in log order) to ``table`` as
    :func:`~kafka_changelog.state.backend.restore.replay_changes` of them would: the
    registrations, and the ops of ``key_group_range``; adds the key groups changed to
    ``changed``. False, with nothing applied, when they are left to the per-change path
    (see the module)."""
    decoded = _decode_kept(changes, key_group_range)
    if decoded is None:
        return False
    registrations = _registrations(changes, decoded)
    if not _registered_first(table, decoded, registrations):
        return False
    done = 0  # ops applied: the k-th registration (at row ``at``) follows ``at - k`` ops
    for k, (at, registration) in enumerate(registrations):
        _apply_ops(table, changes, decoded, done, at - k)
        table.register(registration)
        done = at - k
    _apply_ops(table, changes, decoded, done, decoded.state_ids.size)
    changed.update(np.unique(changes.key_groups[decoded.op_rows]).tolist())
    return True


def _decode_kept(changes: DecodedChanges, key_group_range: KeyGroupRange
                 ) -> _Decoded | None:
    """The registrations and the ops of ``key_group_range`` among ``changes``, decoded
    column-wise; None to leave them to the per-change path."""
    key_groups = changes.key_groups
    meta = key_groups == META_KEY_GROUP
    rows = np.flatnonzero(meta | ((key_groups >= key_group_range.start)
                                  & (key_groups <= key_group_range.end)))
    return _decode(changes, rows, meta[rows])


def _registrations(changes: DecodedChanges, decoded: _Decoded) -> list[tuple[int, StateMeta]]:
    """Each registration with its position among the kept changes, in log order."""
    rows = decoded.rows
    return [(int(at), StateMeta.from_bytes(_payload(changes, int(rows[at]))))
            for at in np.flatnonzero(decoded.meta).tolist()]


def _registered_first(table: KeyedStateTable, decoded: _Decoded,
                      registrations: list[tuple[int, StateMeta]]) -> bool:
    """Whether every op's state is registered before it: in the table already, or by a
    registration earlier in the log (else the per-change path raises where it should)."""
    first_registered: dict[str, int] = {}
    for at, registration in registrations:
        first_registered.setdefault(registration.state, at)
    op_positions = np.flatnonzero(~decoded.meta)  # each op's row among the rows
    ids, first_op = np.unique(decoded.state_ids, return_index=True)
    known = table.metas
    for state_id, op in zip(ids.tolist(), first_op.tolist(), strict=True):
        name = decoded.state_names[state_id]
        if name in known:
            continue
        registered_at = first_registered.get(name)
        if registered_at is None or registered_at > int(op_positions[op]):
            return False
    return True


def _apply_ops(table: KeyedStateTable, changes: DecodedChanges, decoded: _Decoded,
               first: int, last: int) -> None:
    """Apply the ops ``[first, last)`` (positions among the ops; no registration between
    them): grouped by state, in log order within each, long runs of one kind column-wise,
    the rest op by op."""
    if last <= first:
        return
    order = first + np.argsort(decoded.state_ids[first:last], kind="stable")
    codes = decoded.state_ids[order] * len(_OPS) + decoded.ops.op[order]
    bounds = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), order.size]
    pending: list[Int64s] = []
    for start, end in itertools.pairwise(bounds):
        run = order[start:end]
        if end - start < MIN_COLUMN_RUN:
            pending.append(run)
            continue
        if pending:
            _apply_each(table, changes, decoded, np.concatenate(pending))
            pending = []
        _apply_run(table, changes, decoded, run)
    if pending:
        _apply_each(table, changes, decoded, np.concatenate(pending))


def _payload(changes: DecodedChanges, row: int) -> bytes:
    start = int(changes.payload_starts[row])
    return changes.data[start:start + int(changes.payload_lengths[row])]


def _decode(changes: DecodedChanges, rows: Int64s, meta: np.ndarray) -> _Decoded | None:
    """The ops of ``rows`` decoded column-wise; None to leave them to the per-change path."""
    buffer, limit = changes.buffer, changes.limit
    starts = changes.payload_starts[rows]
    ends = starts + changes.payload_lengths[rows]
    state = read_lengths(buffer, limit, starts)  # the state name leads ops and registrations
    if state is None:
        return None
    name_lengths, name_starts = state
    op_rows = np.flatnonzero(~meta)
    ops = decode_ops(buffer, limit, name_starts[op_rows] + name_lengths[op_rows],
                     ends[op_rows])
    if ops is None:
        return None
    data = changes.data
    ids: dict[bytes, int] = {}
    state_ids = np.array(
        [ids.setdefault(data[s:s + n], len(ids))
         for s, n in zip(name_starts[op_rows].tolist(), name_lengths[op_rows].tolist(),
                         strict=True)], np.int64)
    try:
        names = [name.decode() for name in ids]
    except UnicodeDecodeError:
        return None
    return _Decoded(rows, meta, names, state_ids, ops, rows[~meta])


def _apply_each(table: KeyedStateTable, changes: DecodedChanges, decoded: _Decoded,
                ops: Int64s) -> None:
    """Apply the ops at positions ``ops`` (in that order) one by one (``apply_batch``)."""
    rows = decoded.op_rows[ops]
    table.apply_batch([
        (key_group, StateOp.from_bytes(_payload(changes, row)))
        for key_group, row in zip(changes.key_groups[rows].tolist(), rows.tolist(),
                                  strict=True)])


def _apply_run(table: KeyedStateTable, changes: DecodedChanges, decoded: _Decoded,
               run: Int64s) -> None:
    """Apply the ops at positions ``run`` (one state, one kind, in log order) column-wise."""
    ops = decoded.ops
    state = decoded.state_names[int(decoded.state_ids[run[0]])]
    kind = _OPS[int(ops.op[run[0]])]
    present = [_uniform(field, run) for field in (ops.map_key.present, ops.value.present,
                                                  ops.values.present)]
    if None in present:
        # Fields present for some ops of the run only: per op, as the log says.
        _apply_each(table, changes, decoded, run)
        return
    map_key_present, value_present, items_present = present
    data = changes.data
    table.apply_columns(
        state, kind, changes.key_groups[decoded.op_rows[run]].tolist(),
        _slices(data, ops.key, run),
        _slices(data, ops.map_key, run) if map_key_present else None,
        _slices(data, ops.value, run) if value_present else None,
        _items(data, decoded, run) if items_present else None)


def collect_columns(table: KeyedStateTable, changes: DecodedChanges,
                    key_group_range: KeyGroupRange, tail: dict[int, list[OpRun]]) -> bool:
    """The registrations of ``changes`` into ``table`` at once, and the ops of
    ``key_group_range`` appended to ``tail`` (key group -> runs of one state and kind;
    within a key group, each state's ops in log order: key groups and states are
    independent, so applying the runs replays as the log does). False, with nothing
    registered or collected, when the changes are left to the per-change path."""
    decoded = _decode_kept(changes, key_group_range)
    if decoded is None:
        return False
    for _, registration in _registrations(changes, decoded):
        table.register(registration)
    ops = decoded.ops
    op_groups = changes.key_groups[decoded.op_rows]
    if not op_groups.size:
        return True
    # By key group, then state, each in log order (lexsort is stable); runs end where
    # the key group, the state or the op kind changes.
    order = np.lexsort((decoded.state_ids, op_groups))
    codes = (op_groups[order] * (len(decoded.state_names) + 1)
             + decoded.state_ids[order]) * len(_OPS) + ops.op[order]
    bounds = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), order.size]
    data = changes.data
    for start, end in itertools.pairwise(bounds):
        run = order[start:end]
        first = int(run[0])
        tail.setdefault(int(op_groups[first]), []).append(OpRun(
            decoded.state_names[int(decoded.state_ids[first])], _OPS[int(ops.op[first])],
            _slices(data, ops.key, run), _optional_slices(data, ops.map_key, run),
            _optional_slices(data, ops.value, run), _optional_items(data, decoded, run)))
    return True


def _optional_slices(data: bytes, slices: Slices, run: Int64s) -> list[bytes | None] | None:
    """A field of the ops of ``run``: None when absent from all, else each op's bytes
    (None where absent)."""
    present = _uniform(slices.present, run)
    if present is False:
        return None
    found: list[bytes | None] = list(_slices(data, slices, run))
    if present is None:
        assert slices.present is not None
        for at in np.flatnonzero(~slices.present[run]).tolist():
            found[at] = None
    return found


def _optional_items(data: bytes, decoded: _Decoded, run: Int64s
                    ) -> list[tuple[bytes, ...] | None] | None:
    """The ``values`` of the ops of ``run``: None when absent from all, else each op's
    items (None where absent)."""
    present = _uniform(decoded.ops.values.present, run)
    if present is False:
        return None
    found: list[tuple[bytes, ...] | None] = list(_items(data, decoded, run))
    if present is None:
        for at in np.flatnonzero(~decoded.ops.values.present[run]).tolist():
            found[at] = None
    return found


def _uniform(present: np.ndarray | None, run: Int64s) -> bool | None:
    """Whether a field is present in every op of ``run`` (True), in none (False), or in
    some only (None)."""
    if present is None:
        return True
    part = present[run]
    if bool(part.all()):
        return True
    return False if not bool(part.any()) else None


def _slices(data: bytes, slices: Slices, run: Int64s) -> list[bytes]:
    starts = slices.starts[run]
    ends = (starts + slices.lengths[run]).tolist()
    return [data[s:e] for s, e in zip(starts.tolist(), ends, strict=True)]


def _items(data: bytes, decoded: _Decoded, run: Int64s) -> Sequence[tuple[bytes, ...]]:
    """The ``values`` of the ops of ``run`` (all present), as tuples."""
    item_starts = decoded.item_starts
    items = decoded.ops.values.items
    found = []
    for op in run.tolist():
        first, last = int(item_starts[op]), int(item_starts[op + 1])
        found.append(tuple(data[s:s + n] for s, n in zip(
            items.starts[first:last].tolist(), items.lengths[first:last].tolist(),
            strict=True)))
    return found


__all__ = ["collect_columns", "replay_columns"]
