"""The in-memory working copy of keyed state: per key group, per state, per key; all bytes.

Reads are served from here, never from Kafka. Mutations applied here are the
same ones logged to the changelog, so replaying the log onto a snapshot gives
back exactly this table. It implements
:class:`~kafka_changelog.state.tables.protocol.KeyedStateTable`, as the RocksDB table
does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..errors import StateMismatchError
from ..schema.descriptors import StateKind
from ..schema.evolution import merge_metas
from ..schema.key_group_codec import StateLoad, encode_key_group, load_key_group, shape_of
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
    ops_of_columns,
)
from .protocol import Entry


class StateTable:
    """State of a set of key groups: ``{key_group: {state: {key: entry}}}`` plus metas."""

    def __init__(self) -> None:
        self.metas: dict[str, StateMeta] = {}
        self.groups: dict[int, dict[str, dict[bytes, Entry]]] = {}

    # -- registrations -------------------------------------------------------------------

    def register(self, meta: StateMeta) -> None:
        """Register a state; a different kind or serializer under the same name is refused."""
        known = self.metas.get(meta.state)
        if known is None:
            self.metas[meta.state] = meta
        elif known != meta:
            self.metas[meta.state] = merge_metas(known, meta)

    # -- mutations ---------------------------------------------------------------------

    def apply(self, key_group: int, op: StateOp) -> None:
        """Apply one logged mutation."""
        state = op.state
        if state not in self.metas:
            raise StateMismatchError(
                f"change for unregistered state {state!r} in key group {key_group}")
        # get-then-insert rather than setdefault(k, {}), which builds a dict on every call.
        group = self.groups.get(key_group)
        if group is None:
            group = self.groups[key_group] = {}
        table = group.get(state)
        if table is None:
            table = group[state] = {}
        kind, key = op.op, op.key
        if kind is SET:
            assert op.value is not None
            table[key] = op.value
        elif kind is DELETE:
            table.pop(key, None)
        elif kind is LIST_ADD:
            entry = table.get(key)
            if entry is None:
                entry = table[key] = []
            assert isinstance(entry, list) and op.values is not None
            entry.extend(op.values)
        elif kind is LIST_REPLACE:
            values = op.values
            assert values is not None
            if values:
                table[key] = list(values)
            else:
                table.pop(key, None)
        elif kind is MAP_PUT:
            entry = table.get(key)
            if entry is None:
                entry = table[key] = {}
            assert isinstance(entry, dict) and op.map_key is not None and op.value is not None
            entry[op.map_key] = op.value
        elif kind is MAP_REMOVE:
            current = table.get(key)
            if isinstance(current, dict):
                assert op.map_key is not None
                current.pop(op.map_key, None)
                if not current:
                    del table[key]

    def apply_batch(self, ops: Sequence[tuple[int, StateOp]]) -> None:
        """Apply (key group, op) pairs in order."""
        apply = self.apply
        for key_group, op in ops:
            apply(key_group, op)

    def apply_columns(
        self, state: str, op: OpKind, key_groups: Sequence[int], keys: Sequence[bytes],
        map_keys: Sequence[bytes | None] | None = None,
        values: Sequence[bytes | None] | None = None,
        items: Sequence[tuple[bytes, ...] | None] | None = None,
    ) -> None:
        """Apply many mutations of one state and kind, in order (the same as :meth:`apply`
        of each): ``SET``, ``MAP_PUT``, ``MAP_REMOVE`` and ``LIST_REPLACE`` write the
        dicts directly."""
        if state not in self.metas:
            raise StateMismatchError(f"changes for unregistered state {state!r}")
        if op is SET and values is not None:
            for table, key, value in zip(self._tables(state, key_groups), keys, values,
                                         strict=True):
                assert value is not None
                table[key] = value
        elif op is MAP_PUT and map_keys is not None and values is not None:
            for table, key, map_key, value in zip(self._tables(state, key_groups), keys,
                                                  map_keys, values, strict=True):
                assert map_key is not None and value is not None
                entry = table.get(key)
                if entry is None:
                    entry = table[key] = {}
                assert isinstance(entry, dict)
                entry[map_key] = value
        elif op is MAP_REMOVE and map_keys is not None:
            for table, key, map_key in zip(self._tables(state, key_groups), keys, map_keys,
                                           strict=True):
                current = table.get(key)
                if isinstance(current, dict):
                    assert map_key is not None
                    current.pop(map_key, None)
                    if not current:
                        del table[key]
        elif op is LIST_REPLACE and items is not None:
            for table, key, replacement in zip(self._tables(state, key_groups), keys, items,
                                               strict=True):
                assert replacement is not None
                if replacement:
                    table[key] = list(replacement)
                else:
                    table.pop(key, None)
        else:
            for key_group, state_op in zip(
                    key_groups, ops_of_columns(state, op, keys, map_keys, values, items),
                    strict=True):
                self.apply(key_group, state_op)

    def _tables(self, state: str, key_groups: Sequence[int]) -> list[dict[bytes, Entry]]:
        """The entries of ``state`` in each of ``key_groups`` (created where missing)."""
        groups = self.groups
        found: dict[int, dict[bytes, Entry]] = {}
        for key_group in set(key_groups):
            group = groups.get(key_group)
            if group is None:
                group = groups[key_group] = {}
            table = group.get(state)
            if table is None:
                table = group[state] = {}
            found[key_group] = table
        return [found[kg] for kg in key_groups]

    def get(self, key_group: int, state: str, key: bytes) -> Entry | None:
        """The entry of ``key`` (None if absent)."""
        group = self.groups.get(key_group)
        entries = group.get(state) if group is not None else None
        return entries.get(key) if entries is not None else None

    def get_map_value(self, key_group: int, state: str, key: bytes,
                      map_key: bytes) -> bytes | None:
        """One value of a map entry (None if absent)."""
        entry = self.get(key_group, state, key)
        return entry.get(map_key) if isinstance(entry, dict) else None

    def get_map_values(self, key_groups: Sequence[int], state: str, keys: Sequence[bytes],
                       map_keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`get_map_value` of each."""
        groups = self.groups
        tables: dict[int, dict[bytes, Entry] | None] = {}
        for key_group in set(key_groups):  # each key group's entries looked up once
            group = groups.get(key_group)
            tables[key_group] = group.get(state) if group is not None else None
        found: list[bytes | None] = []
        append = found.append
        for key_group, key, map_key in zip(key_groups, keys, map_keys, strict=True):
            table = tables[key_group]
            entry = table.get(key) if table is not None else None
            append(entry.get(map_key) if isinstance(entry, dict) else None)
        return found

    def key_groups(self) -> list[int]:
        """Key groups holding at least one entry, ascending."""
        return sorted(kg for kg, states in self.groups.items() if any(states.values()))

    def has_entries(self, key_group: int) -> bool:
        """Whether ``key_group`` holds at least one entry."""
        return any(self.groups.get(key_group, {}).values())

    def entries(self, key_group: int) -> Iterator[tuple[str, bytes, Entry]]:
        """(state, key, entry) of the key group, ordered by state name then key."""
        states = self.groups.get(key_group, {})
        for name in sorted(states):
            entries = states[name]
            for key in sorted(entries):
                entry = entries[key]
                yield name, key, ({k: entry[k] for k in sorted(entry)}
                                  if isinstance(entry, dict) else entry)

    def state_entries(self, key_group: int, state: str) -> Iterator[tuple[bytes, Entry]]:
        """(key, entry) of one state in the key group, ordered by key."""
        entries = self.groups.get(key_group, {}).get(state, {})
        for key in sorted(entries):
            yield key, entries[key]

    def entry_count(self) -> int:
        """Entries in all (a key of a value or list state is one; a map counts each of
        its entries)."""
        maps = {name for name, meta in self.metas.items() if meta.kind is StateKind.MAP}
        return sum(sum(map(len, entries.values())) if name in maps else len(entries)
                   for states in self.groups.values() for name, entries in states.items())

    def close(self) -> None:
        """Nothing to release: the table is plain Python objects."""

    def keys(self, state: str) -> Iterator[tuple[int, bytes]]:
        """(key group, key) of every entry of ``state``."""
        for key_group in sorted(self.groups):
            for key in self.groups[key_group].get(state, {}):
                yield key_group, key

    # -- snapshots of a key group -----------------------------------------------------------

    def serialize_group(self, key_group: int) -> bytes:
        """The key group's state (``schemas/key_group_state.avsc``), deterministic order."""
        states = self.groups.get(key_group, {})
        return encode_key_group(
            (self.metas[name], ((key, _ordered(states[name][key]))
                                for key in sorted(states[name])))
            for name in sorted(states))

    def load_group(self, key_group: int, data: bytes) -> None:
        """Replace the key group's state with a serialized one (registering its states)."""
        group: dict[str, dict[bytes, Entry]] = {}

        def state(meta: StateMeta) -> StateLoad:
            self.register(meta)
            entries = group[meta.state] = {}

            def other(key: bytes, value: bytes | None, values: list[bytes] | None,
                      items: list[tuple[bytes, bytes]] | None) -> int:
                # Stored as found, the first of value, values and map that is present.
                found: Entry | None = (value if value is not None else values
                                       if values is not None else dict(items)
                                       if items is not None else None)
                if found is None:
                    return 0
                entries[key] = found
                return len(found) if isinstance(found, dict) else 1

            return StateLoad(shape_of(meta.kind), b"", entries.__setitem__, other,
                             list_value=_same)

        load_key_group(data, state)
        self.groups[key_group] = group


def _same(values: list[bytes]) -> list[bytes]:
    return values


def _ordered(entry: Entry) -> Entry:
    """A map with its items ordered by map key (the snapshot's order)."""
    return {k: entry[k] for k in sorted(entry)} if isinstance(entry, dict) else entry


__all__ = ["Entry", "StateKind", "StateTable"]
