"""Bulk access (many keys per call) to states with a TTL.

A TTL'd state checks each entry's expiry against the backend's processing time and
removes what expired when it is seen, which the per-key TTL state objects
(:mod:`kafka_changelog.state.time.ttl_state`) already do exactly. The bulk objects of a TTL'd
state call them key by key (the backend's current key moves through the keys), so the
per-key and the vectorised entry points see and log exactly the same; what a TTL'd state
costs in a vectorised function is one state call per key, as in a per-key function.
"""

from __future__ import annotations

import builtins
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Protocol

from ..schema.descriptors import StateDescriptor, StateKind
from .keyed_backend import ChangelogKeyedStateBackend


class KeysView(Protocol):
    """What a TTL'd bulk state needs of the batch's view of its keys (a ``BulkState``)."""

    @property
    def backend(self) -> ChangelogKeyedStateBackend:
        """The backend the keys' state is in."""
        ...

    def resolve(self, keys: Iterable[Hashable]) -> tuple[list[int], list[bytes], bool]:
        """Key groups and key bytes of ``keys``, in order, and whether they are distinct."""
        ...


class BulkTtlState:
    """One TTL'd state of many keys (the API of the bulk state objects of its kind)."""

    def __init__(self, view: KeysView, descriptor: StateDescriptor) -> None:
        self.kind: StateKind = descriptor.kind
        self._view = view
        self._backend = view.backend
        self._object = view.backend.state(descriptor)

    def _each(self, keys: Iterable[Hashable]) -> Iterator[Any]:
        """The TTL state object, with each of ``keys`` current in turn."""
        groups, key_bytes, _ = self._view.resolve(keys)
        set_current_key = self._backend.set_current_key
        for key_group, key in zip(groups, key_bytes, strict=True):
            set_current_key(key, key_group)
            yield self._object

    def _pairs(self, keys: Iterable[Hashable], values: Iterable[Any]
               ) -> Iterator[tuple[Any, Any]]:
        listed, given = builtins.list(keys), builtins.list(values)
        if len(listed) != len(given):
            raise ValueError(f"state {self._object._name!r}: {len(listed)} keys but "
                             f"{len(given)} values")
        return zip(self._each(listed), given, strict=True)

    # value, reducing, aggregating, list: get; map: get(keys, map_key)
    def get(self, keys: Iterable[Hashable], *args: Any) -> builtins.list[Any]:
        """Each key's live value (list: elements; map: the value under ``map_key``)."""
        if self.kind is StateKind.VALUE:
            default = args[0] if args else None
            return [state.value(default) for state in self._each(keys)]
        if self.kind is StateKind.MAP:
            map_key, default = args[0], (args[1] if len(args) > 1 else None)
            return [state.get(map_key, default) for state in self._each(keys)]
        return [state.get() for state in self._each(keys)]

    def set(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """Set each key's value (value states)."""
        for state, value in self._pairs(keys, values):
            state.update(value)

    def clear(self, keys: Iterable[Hashable]) -> None:
        """Remove each key's entry."""
        for state in self._each(keys):
            state.clear()

    def add(self, keys: Iterable[Hashable], values: Iterable[Any]) -> builtins.list[Any] | None:
        """Append an item (list), fold a value in (reducing, aggregating: the results)."""
        results = []
        for state, value in self._pairs(keys, values):
            state.add(value)
            if self.kind is not StateKind.LIST:
                results.append(state.get())
        return None if self.kind is StateKind.LIST else results

    def add_all(self, keys: Iterable[Hashable], lists: Iterable[Iterable[Any]]) -> None:
        """Append items to each key's list."""
        for state, items in self._pairs(keys, lists):
            state.add_all(items)

    def update(self, keys: Iterable[Hashable], lists: Iterable[Iterable[Any]]) -> None:
        """Replace each key's list."""
        for state, items in self._pairs(keys, lists):
            state.update(items)

    def get_each(self, keys: Iterable[Hashable], map_keys: Iterable[Any],
                 default: Any = None) -> builtins.list[Any]:
        """The value under each key's own map key."""
        return [state.get(map_key, default) for state, map_key in self._pairs(keys, map_keys)]

    def put(self, keys: Iterable[Hashable], map_key: Any, values: Iterable[Any]) -> None:
        """Put each value under ``map_key`` of its key's map."""
        for state, value in self._pairs(keys, values):
            state.put(map_key, value)

    def put_each(self, keys: Iterable[Hashable], map_keys: Iterable[Any],
                 values: Iterable[Any]) -> None:
        """Put each value under its own map key of its key's map."""
        listed_keys, listed_map_keys = builtins.list(keys), builtins.list(map_keys)
        for (state, map_key), value in zip(self._pairs(listed_keys, listed_map_keys),
                                           builtins.list(values), strict=True):
            state.put(map_key, value)

    def remove(self, keys: Iterable[Hashable], map_key: Any) -> None:
        """Remove ``map_key`` from each key's map."""
        for state in self._each(keys):
            state.remove(map_key)

    def contains(self, keys: Iterable[Hashable], map_key: Any) -> builtins.list[bool]:
        """Whether each key's map has a live ``map_key``."""
        return [state.contains(map_key) for state in self._each(keys)]

    def get_all(self, keys: Iterable[Hashable]) -> builtins.list[dict[Any, Any]]:
        """Each key's live map."""
        return [dict(state.items()) for state in self._each(keys)]


__all__ = ["BulkTtlState"]
