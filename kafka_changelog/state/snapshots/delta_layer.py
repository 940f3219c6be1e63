"""Delta layers: an incremental materialization of one key group.

A materialization that knows which keys changed since the key group's last snapshot
layer writes only those keys' entries, as they are now, on top of the earlier layers:
the same key-group snapshot format (``schemas/key_group_state.avsc``, readable with the
same tools) where a key without value, values or map is a key deleted since. A restore
loads the key group's whole state (its first layer), then applies each delta in order:
every key in it is replaced by its entry there, or deleted.

A key group gets a new whole layer instead when its deltas would grow past a share of
its whole state or past a number of layers (see :func:`worth_a_delta`), so restores stay
bounded by the state's size.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..schema.key_group_codec import assemble_key_group, encode_entries, iter_key_group
from ..schema.ops import DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, SET, StateMeta, StateOp
from ..tables.protocol import Entry, KeyedStateTable
from .snapshot import ChunkRef

#: Layers a key group may have (its whole state and its deltas) before a materialization
#: writes it whole again.
MAX_LAYERS = 4
#: A key group's deltas may add up to this share of its whole layer's bytes.
MAX_DELTA_SHARE = 0.5


def encode_delta(table: KeyedStateTable, key_group: int,
                 changed: Iterable[tuple[str, bytes]]) -> bytes:
    """The delta layer of ``key_group``: for each changed (state, key), the entry
    ``table`` holds now, or a key without data when it holds none."""
    by_state: dict[str, set[bytes]] = {}
    for state, key in changed:
        by_state.setdefault(state, set()).add(key)
    states = []
    for name in sorted(by_state):
        meta = table.metas.get(name)
        if meta is None:
            continue  # a state unknown here has no entries to write
        entries: list[tuple[bytes, Entry | None]] = [
            (key, table.get(key_group, name, key)) for key in sorted(by_state[name])]
        body, count = encode_entries(entries)
        states.append((meta, body, count))
    return assemble_key_group(states)


def apply_delta(table: KeyedStateTable, key_group: int, data: bytes) -> None:
    """Apply the delta layer ``data`` of ``key_group`` to ``table``: each of its keys
    gets exactly its entry there (or is deleted)."""
    ops: list[tuple[int, StateOp]] = []
    for meta, key, value, values, items in iter_key_group(data):
        if key is None:
            _register(table, meta)
            continue
        ops.append((key_group, StateOp(meta.state, DELETE, key)))
        if value is not None:
            ops.append((key_group, StateOp(meta.state, SET, key, value=value)))
        elif values:
            ops.append((key_group, StateOp(meta.state, LIST_REPLACE, key,
                                           values=tuple(values))))
        elif values is not None:  # an empty list is an entry (as LIST_ADD of nothing makes)
            ops.append((key_group, StateOp(meta.state, LIST_ADD, key, values=())))
        elif items:
            ops.extend((key_group, StateOp(meta.state, MAP_PUT, key, map_key=map_key,
                                           value=item)) for map_key, item in items)
    if ops:
        table.apply_batch(ops)


def _register(table: KeyedStateTable, meta: StateMeta) -> None:
    if table.metas.get(meta.state) != meta:
        table.register(meta)


def worth_a_delta(layers: tuple[tuple[ChunkRef, ...], ...], delta_bytes: int) -> bool:
    """Whether a key group with ``layers`` takes a delta of ``delta_bytes`` (else it is
    written whole): fewer than :data:`MAX_LAYERS` layers, and its deltas, this one
    included, at most :data:`MAX_DELTA_SHARE` of its whole layer."""
    if not layers or len(layers) >= MAX_LAYERS:
        return False
    whole = sum(c.size for c in layers[0])
    deltas = sum(c.size for layer in layers[1:] for c in layer) + delta_bytes
    return deltas <= MAX_DELTA_SHARE * whole


__all__ = ["MAX_DELTA_SHARE", "MAX_LAYERS", "apply_delta", "encode_delta", "worth_a_delta"]
