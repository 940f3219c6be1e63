"""A changelog replayed column-wise: runs of ops applied to a table in bulk.

A restore or a catch-up replays what a reader decoded column-wise
(:class:`~kafka_changelog.change_columns.DecodedChanges`): the ops' fields are read for all
changes at once (:mod:`kafka_changelog.state.schema.op_columns`), the changes are cut into
runs of one state and one op kind in log order, and each run goes to
:meth:`KeyedStateTable.apply_columns
<kafka_changelog.state.tables.protocol.KeyedStateTable.apply_columns>` (one write batch and
one multi-get for the RocksDB table) instead of an op object per change. Registrations are
applied where they stand in the log.

The per-change replay (:func:`~kafka_changelog.state.backend.restore.replay_changes`) stays
the reference: changes the column-wise decoder leaves to it (an encoding only it reads,
anything malformed, which it names) are replayed through it, with the same result.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ...avro_columns import Int64s, read_lengths
from ...change import META_KEY_GROUP
from ...change_columns import DecodedChanges
from ...keygroups import KeyGroupRange
from ..schema.op_columns import OpColumns, Slices, decode_ops
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


def replay_columns(table: KeyedStateTable, changes: DecodedChanges,
                   key_group_range: KeyGroupRange, changed: set[int]) -> bool:
    """Apply ``changes`` (in log order) to ``table`` as
    :func:`~kafka_changelog.state.backend.restore.replay_changes` of them would: the
    registrations, and the ops of ``key_group_range``; adds the key groups changed to
    ``changed``. False, with nothing applied, when they are left to the per-change path
    (see the module)."""
    key_groups = changes.key_groups
    meta = key_groups == META_KEY_GROUP
    rows = np.flatnonzero(meta | ((key_groups >= key_group_range.start)
                                  & (key_groups <= key_group_range.end)))
    decoded = _decode(changes, rows, meta[rows])
    if decoded is None:
        return False
    for start, end in _runs(decoded):
        if decoded.meta[start]:
            table.register(StateMeta.from_bytes(_payload(changes, int(rows[start]))))
        else:
            _apply_run(table, changes, decoded, start, end)
    changed.update(np.unique(key_groups[rows[~decoded.meta]]).tolist())
    return True


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
    return _Decoded(rows, meta, names, state_ids, ops)


def _runs(decoded: _Decoded) -> Iterator[tuple[int, int]]:
    """``[start, end)`` of each run of ops of one state and kind (each registration a run
    of its own), in log order, as positions in ``decoded.rows``."""
    n = decoded.rows.size
    codes = np.empty(n, np.int64)
    op_rows = np.flatnonzero(~decoded.meta)
    codes[op_rows] = decoded.state_ids * len(_OPS) + decoded.ops.op
    meta_rows = np.flatnonzero(decoded.meta)
    codes[meta_rows] = -1 - np.arange(meta_rows.size)  # never equal to a neighbour's
    bounds = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), n]
    for start, end in itertools.pairwise(bounds):
        if end > start:
            yield start, end


def _apply_run(table: KeyedStateTable, changes: DecodedChanges, decoded: _Decoded,
               start: int, end: int) -> None:
    """Apply the ops at ``[start, end)`` of ``decoded.rows`` (one state, one kind)."""
    # Ops before ``start`` in op order: the run's rows are all ops, so they are contiguous.
    first = start - int(np.count_nonzero(decoded.meta[:start]))
    last = first + (end - start)
    ops = decoded.ops
    state = decoded.state_names[int(decoded.state_ids[first])]
    kind = _OPS[int(ops.op[first])]
    key_groups = changes.key_groups[decoded.rows[start:end]].tolist()
    map_key_present = _uniform(ops.map_key.present, first, last)
    value_present = _uniform(ops.value.present, first, last)
    items_present = _uniform(ops.values.present, first, last)
    if map_key_present is None or value_present is None or items_present is None:
        # Fields present for some ops of the run only: per op, as the log says.
        table.apply_batch([
            (key_group, StateOp.from_bytes(_payload(changes, int(row))))
            for key_group, row in zip(key_groups, decoded.rows[start:end].tolist(),
                                      strict=True)])
        return
    data = changes.data
    table.apply_columns(
        state, kind, key_groups, _slices(data, ops.key, first, last),
        _slices(data, ops.map_key, first, last) if map_key_present else None,
        _slices(data, ops.value, first, last) if value_present else None,
        _items(data, ops, first, last) if items_present else None)


def _uniform(present: np.ndarray | None, first: int, last: int) -> bool | None:
    """Whether a field is present in every op of ``[first, last)`` (True), in none
    (False), or in some only (None)."""
    if present is None:
        return True
    part = present[first:last]
    if bool(part.all()):
        return True
    return False if not bool(part.any()) else None


def _slices(data: bytes, slices: Slices, first: int, last: int) -> list[bytes]:
    starts = slices.starts[first:last].tolist()
    ends = (slices.starts[first:last] + slices.lengths[first:last]).tolist()
    return [data[s:e] for s, e in zip(starts, ends, strict=True)]


def _items(data: bytes, ops: OpColumns, first: int, last: int) -> Sequence[tuple[bytes, ...]]:
    """The ``values`` of ops ``[first, last)`` (all present), as tuples."""
    counts = ops.values.counts
    before = int(counts[:first].sum())
    item_bounds = np.concatenate(([0], np.cumsum(counts[first:last]))).tolist()
    items = ops.values.items
    taken = slice(before, before + item_bounds[-1])
    everything = _slices(data, Slices(items.starts[taken], items.lengths[taken]), 0,
                         item_bounds[-1])
    return [tuple(everything[a:b]) for a, b in itertools.pairwise(item_bounds)]


__all__ = ["replay_columns"]
