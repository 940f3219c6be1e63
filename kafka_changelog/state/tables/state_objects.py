"""User-facing keyed state objects, scoped to the current key of a :class:`KeyContext`.

State objects read and change the current key's state through the context (the keyed
backend's buffer of the current key's net changes is the one it gives them); they know
nothing else of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from ..schema.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from ..schema.ops import DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, OpKind
from .protocol import Entry

V = TypeVar("V")
K = TypeVar("K")


class KeyContext(Protocol):
    """The current key's state, read and changed by name (the keyed backend is one)."""

    def read(self, state: str) -> Entry | None:
        """The current key's entry of ``state`` (None if absent)."""
        ...

    def read_map_value(self, state: str, map_key: bytes) -> bytes | None:
        """One value of the current key's map ``state`` (None if absent)."""
        ...

    def write(self, state: str, op: OpKind, map_key: bytes | None = None,
              value: bytes | None = None, values: tuple[bytes, ...] | None = None) -> None:
        """Change the current key's ``state`` (applied to the working copy and logged)."""
        ...


class _KeyedState:
    def __init__(self, backend: KeyContext, descriptor: StateDescriptor) -> None:
        self._descriptor = descriptor
        self._name = descriptor.name
        self._values = descriptor.value_serializer
        # Bound once: state objects are called per event.
        # Entries as Any: each kind knows the shape of its own (bytes, list or dict).
        self._read: Callable[[str], Any] = backend.read
        self._write = backend.write
        self._read_map_value = backend.read_map_value

    def _entry(self) -> Any:
        return self._read(self._name)

    def _log(
        self,
        op: OpKind,
        map_key: bytes | None = None,
        value: bytes | None = None,
        values: tuple[bytes, ...] | None = None,
    ) -> None:
        # Named parameters passed on positionally: no kwargs dict built and unpacked per op.
        self._write(self._name, op, map_key, value, values)

    def clear(self) -> None:
        """Remove the current key's entry."""
        if self._entry() is not None:
            self._log(DELETE)


class ValueState(_KeyedState, Generic[V]):
    """One value per key."""

    # The hot methods call the context directly (no _entry/_log frame): once per event.
    def value(self, default: V | None = None) -> V | None:
        """The current key's value (``default`` if none)."""
        entry = self._read(self._name)
        return default if entry is None else self._values.deserialize(entry)

    def update(self, value: V) -> None:
        """Set the current key's value."""
        self._write(self._name, SET, None, self._values.serialize(value))


class ListState(_KeyedState, Generic[V]):
    """A list of values per key."""

    def get(self) -> list[V]:
        """The current key's list (empty if none)."""
        entry = self._entry() or []
        return [self._values.deserialize(item) for item in entry]

    def add(self, value: V) -> None:
        """Append one value."""
        self._write(self._name, LIST_ADD, None, None, (self._values.serialize(value),))

    def add_all(self, values: Iterable[V]) -> None:
        """Append several values."""
        encoded = tuple(map(self._values.serialize, values))
        if encoded:
            self._log(LIST_ADD, values=encoded)

    def update(self, values: Iterable[V]) -> None:
        """Replace the list."""
        self._log(LIST_REPLACE, values=tuple(map(self._values.serialize, values)))


class MapState(_KeyedState, Generic[K, V]):
    """A map per key."""

    def __init__(self, backend: KeyContext, descriptor: StateDescriptor) -> None:
        super().__init__(backend, descriptor)
        assert descriptor.map_key_serializer is not None
        self._keys = descriptor.map_key_serializer

    def _map(self) -> dict[bytes, bytes]:
        entry = self._entry()
        return entry if isinstance(entry, dict) else {}

    def _value_of(self, encoded_key: bytes) -> bytes | None:
        # A point lookup: the whole map is never built for one value.
        return self._read_map_value(self._name, encoded_key)

    def get(self, map_key: K, default: V | None = None) -> V | None:
        """The value under ``map_key`` (``default`` if none)."""
        data = self._read_map_value(self._name, self._keys.serialize(map_key))
        return default if data is None else self._values.deserialize(data)

    def put(self, map_key: K, value: V) -> None:
        """Set the value under ``map_key``."""
        self._write(self._name, MAP_PUT, self._keys.serialize(map_key),
                    self._values.serialize(value))

    def remove(self, map_key: K) -> None:
        """Remove ``map_key`` (no-op if absent)."""
        encoded = self._keys.serialize(map_key)
        if self._value_of(encoded) is not None:
            self._log(MAP_REMOVE, map_key=encoded)

    def contains(self, map_key: K) -> bool:
        """True if ``map_key`` is present."""
        return self._value_of(self._keys.serialize(map_key)) is not None

    def items(self) -> Iterator[tuple[K, V]]:
        """(map key, value) pairs, ordered by serialized key."""
        entries = self._map()
        for k in sorted(entries):
            yield self._keys.deserialize(k), self._values.deserialize(entries[k])

    def keys(self) -> Iterator[K]:
        """Map keys, ordered by serialized key."""
        return (k for k, _ in self.items())

    def is_empty(self) -> bool:
        """True when the current key has no entries."""
        return not self._map()


class ReducingState(_KeyedState, Generic[V]):
    """A value per key that added values are folded into."""

    def __init__(self, backend: KeyContext, descriptor: StateDescriptor) -> None:
        super().__init__(backend, descriptor)
        assert isinstance(descriptor, ReducingStateDescriptor) and descriptor.reduce is not None
        self._reduce = descriptor.reduce

    def get(self) -> V | None:
        """The folded value (None if nothing was added)."""
        entry = self._read(self._name)
        return None if entry is None else self._values.deserialize(entry)

    def add(self, value: V) -> None:
        """Fold ``value`` in."""
        values = self._values
        entry = self._read(self._name)
        folded = value if entry is None else self._reduce(values.deserialize(entry), value)
        self._write(self._name, SET, None, values.serialize(folded))


class AggregatingState(_KeyedState, Generic[V]):
    """An accumulator per key."""

    def get(self) -> Any:
        """The accumulator (None if nothing was added)."""
        entry = self._entry()
        return None if entry is None else self._values.deserialize(entry)

    def add(self, value: V) -> None:
        """Add ``value`` to the accumulator."""
        descriptor = self._descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        assert descriptor.create is not None and descriptor.add is not None
        current = self.get()
        accumulator = descriptor.add(descriptor.create() if current is None else current, value)
        self._log(SET, value=self._values.serialize(accumulator))
