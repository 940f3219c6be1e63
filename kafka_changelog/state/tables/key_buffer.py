"""The current key's state changes, kept as net changes until the key changes.

A stateful function reads and updates a key's state many times per call (once per
event, typically). Applied to the working copy and logged one by one, each update costs
a table write (a RocksDB put), an encoded op and a log record. The buffer keeps the
current key's changes instead, one net change per state, and hands them to the backend
(applied, then logged) when the key changes or before anything else reads the working
copy or the log (a snapshot, a materialization, bulk access, entry counts). Reads of the
current key see the buffered changes.

The log then holds one record per state per key and call instead of one per update;
replayed, it gives the same state (changes of different states are independent, and
each net change is what its updates amount to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

from ..errors import NoCurrentKeyError, StateMismatchError
from ..schema.descriptors import StateKind
from ..schema.ops import DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, OpKind, StateOp
from .protocol import Entry, KeyedStateTable


class _ValueChange:
    """A value state's new value; None: deleted."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | None) -> None:
        self.value = value

    def entry(self, table: KeyedStateTable, key_group: int, state: str, key: bytes
              ) -> Entry | None:
        return self.value

    def ops(self, state: str, key: bytes) -> list[StateOp]:
        if self.value is None:
            return [StateOp(state, DELETE, key)]
        return [StateOp(state, SET, key, None, self.value)]


class _ListChange:
    """Items appended to a list state's stored list, or (``replaced``) the whole list."""

    __slots__ = ("items", "replaced")

    def __init__(self, replaced: bool, items: list[bytes]) -> None:
        self.replaced = replaced
        self.items = items

    def entry(self, table: KeyedStateTable, key_group: int, state: str, key: bytes
              ) -> Entry | None:
        if self.replaced:
            return list(self.items) or None
        stored = table.get(key_group, state, key)
        return [*stored, *self.items] if isinstance(stored, list) else list(self.items)

    def ops(self, state: str, key: bytes) -> list[StateOp]:
        items = tuple(self.items)
        if not self.replaced:
            return [StateOp(state, LIST_ADD, key, None, None, items)] if items else []
        if not items:
            return [StateOp(state, DELETE, key)]
        return [StateOp(state, LIST_REPLACE, key, None, None, items)]


class _MapChange:
    """Map entries put (a value) or removed (None), after clearing the map if ``cleared``."""

    __slots__ = ("cleared", "puts")

    def __init__(self, cleared: bool) -> None:
        self.cleared = cleared
        self.puts: dict[bytes, bytes | None] = {}

    def entry(self, table: KeyedStateTable, key_group: int, state: str, key: bytes
              ) -> Entry | None:
        stored = None if self.cleared else table.get(key_group, state, key)
        merged = dict(stored) if isinstance(stored, dict) else {}
        for map_key, value in self.puts.items():
            if value is None:
                merged.pop(map_key, None)
            else:
                merged[map_key] = value
        return dict(sorted(merged.items())) or None

    def value_of(self, table: KeyedStateTable, key_group: int, state: str, key: bytes,
                 map_key: bytes) -> bytes | None:
        if map_key in self.puts:
            return self.puts[map_key]
        return None if self.cleared else table.get_map_value(key_group, state, key, map_key)

    def ops(self, state: str, key: bytes) -> list[StateOp]:
        ops = [StateOp(state, DELETE, key)] if self.cleared else []
        for map_key, value in self.puts.items():
            if value is not None:
                ops.append(StateOp(state, MAP_PUT, key, map_key, value))
            elif not self.cleared:  # after a clear, there is nothing to remove
                ops.append(StateOp(state, MAP_REMOVE, key, map_key))
        return ops


_Change = Union[_ValueChange, _ListChange, _MapChange]  # noqa: UP007 - a runtime alias


class KeyChangeBuffer:
    """Net changes of the current key's states, handed to ``emit`` at :meth:`flush`.

    ``emit(key_group, op)`` applies one op to the working copy and logs it (the keyed
    backend's).
    """

    def __init__(self, table: KeyedStateTable, emit: Callable[[int, StateOp], None]
                 ) -> None:
        self._table = table
        self._emit = emit
        self._key_group = -1
        self._key: bytes | None = None
        self._changes: dict[str, _Change] = {}

    @property
    def pending(self) -> bool:
        """Whether changes wait to be applied and logged."""
        return bool(self._changes)

    def switch(self, key_group: int, key: bytes) -> None:
        """Flush, then buffer the changes of ``key`` (in ``key_group``)."""
        if self._changes:
            self.flush()
        self._key_group, self._key = key_group, key

    def flush(self) -> None:
        """Apply and log the net changes (each state's, in the order first changed)."""
        changes = self._changes
        if not changes:
            return
        key = self._key
        assert key is not None
        key_group, emit = self._key_group, self._emit
        # Cleared first: if emitting fails half-way, nothing is applied twice on retry.
        self._changes = {}
        for state, change in changes.items():
            for op in change.ops(state, key):
                emit(key_group, op)

    def discard(self) -> None:
        """Drop the buffered changes (a backend closed without persisting them)."""
        self._changes = {}

    def _current(self) -> bytes:
        key = self._key
        if key is None:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return key

    # read, read_map_value and write run once per state call: the current key's check is
    # inline, not a call of _current.
    def read(self, state: str) -> Entry | None:
        """The current key's entry of ``state``, with the buffered changes."""
        key = self._key
        if key is None:
            key = self._current()  # raises
        change = self._changes.get(state)
        if change is None:
            return self._table.get(self._key_group, state, key)
        return change.entry(self._table, self._key_group, state, key)

    def read_map_value(self, state: str, map_key: bytes) -> bytes | None:
        """One value of the current key's map ``state``, with the buffered changes."""
        key = self._key
        if key is None:
            key = self._current()  # raises
        change = self._changes.get(state)
        if isinstance(change, _MapChange):
            return change.value_of(self._table, self._key_group, state, key, map_key)
        return self._table.get_map_value(self._key_group, state, key, map_key)

    def write(self, state: str, op: OpKind, map_key: bytes | None = None,
              value: bytes | None = None, values: tuple[bytes, ...] | None = None) -> None:
        """Buffer one change of the current key's ``state`` (a registered state)."""
        if self._key is None:
            self._current()  # raises
        changes = self._changes
        change = changes.get(state)
        if op is SET:
            if isinstance(change, _ValueChange):
                change.value = value
            else:
                changes[state] = _ValueChange(value)
        elif op is LIST_ADD:
            if isinstance(change, _ListChange):
                change.items.extend(values or ())
            else:
                changes[state] = _ListChange(False, list(values or ()))
        elif op is MAP_PUT or op is MAP_REMOVE:
            assert map_key is not None
            if not isinstance(change, _MapChange):
                change = changes[state] = _MapChange(False)
            change.puts[map_key] = value if op is MAP_PUT else None
        elif op is LIST_REPLACE:
            changes[state] = _ListChange(True, list(values or ()))
        elif op is DELETE:
            changes[state] = self._cleared(state)
        else:  # pragma: no cover - OpKind has no other members
            raise StateMismatchError(f"unknown op {op!r} on state {state!r}")

    def _cleared(self, state: str) -> _Change:
        meta = self._table.metas.get(state)
        if meta is None:
            raise StateMismatchError(f"change for unregistered state {state!r}")
        kind = meta.kind
        if kind is StateKind.LIST:
            return _ListChange(True, [])
        if kind is StateKind.MAP:
            return _MapChange(True)
        return _ValueChange(None)


__all__ = ["KeyChangeBuffer"]
