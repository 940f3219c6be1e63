"""State objects of states with a TTL: each value stored with its expiry
(:mod:`kafka_changelog.state.schema.ttl`), expired entries invisible and removed when seen.

The same API as :mod:`kafka_changelog.state.tables.state_objects`. "Now" is the backend's
processing time (in streaming, the batch's). An entry read at or after its expiry is
absent to the caller, and the read removes it from the state as a logged change (a
value or map entry deleted, a list rewritten without its expired elements): the
changelog holds every removal, so a restore sees exactly the state the function saw.
Entries nobody reads are removed by the backend's expiry timers (see
:meth:`~kafka_changelog.state.backend.keyed_backend.ChangelogKeyedStateBackend.expire_due`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from ..errors import StateMismatchError
from ..schema.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from ..schema.ops import DELETE, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, StateMeta
from ..schema.ttl import expiry_of, split_serializer_name, stamp, value_of
from ..tables.state_objects import KeyContext, MapState

V = TypeVar("V")
K = TypeVar("K")

#: Called with (state name) when a TTL'd state of the current key is written: the
#: backend makes sure an expiry timer of the key and state exists.
OnWrite = Callable[[str, int], None]


class _TtlState:
    def __init__(self, context: KeyContext, descriptor: StateDescriptor,
                 now_ms: Callable[[], int], on_write: OnWrite) -> None:
        assert descriptor.ttl is not None
        self._descriptor = descriptor
        self._name = descriptor.name
        self._values = descriptor.value_serializer
        self._ttl_ms = descriptor.ttl.ttl_ms
        self._update_on_read = descriptor.ttl.update_on_read
        self._context = context
        self._now = now_ms
        self._on_write = on_write

    def _stamp(self, data: bytes) -> bytes:
        expires = self._now() + self._ttl_ms
        self._on_write(self._name, expires)
        return stamp(expires, data)

    def clear(self) -> None:
        """Remove the current key's entry."""
        if self._context.read(self._name) is not None:
            self._context.write(self._name, DELETE)


class _TtlValue(_TtlState):
    """A value-like state's live value bytes (None: absent or expired, then removed)."""

    def _live(self) -> bytes | None:
        stored = self._context.read(self._name)
        if stored is None:
            return None
        assert isinstance(stored, bytes)
        if expiry_of(stored) <= self._now():
            self._context.write(self._name, DELETE)
            return None
        data = value_of(stored)
        if self._update_on_read:
            self._context.write(self._name, SET, None, self._stamp(data))
        return data

    def _set(self, data: bytes) -> None:
        self._context.write(self._name, SET, None, self._stamp(data))


class TtlValueState(_TtlValue, Generic[V]):
    """One value per key, expiring ``ttl`` after its last write."""

    def value(self, default: V | None = None) -> V | None:
        """The current key's value (``default`` if none or expired)."""
        data = self._live()
        return default if data is None else self._values.deserialize(data)

    def update(self, value: V) -> None:
        """Set the current key's value (its expiry starts again)."""
        self._set(self._values.serialize(value))


class TtlReducingState(_TtlValue, Generic[V]):
    """A folded value per key, expiring ``ttl`` after its last write (then starting afresh)."""

    def get(self) -> V | None:
        """The folded value (None if nothing was added since it expired)."""
        data = self._live()
        return None if data is None else self._values.deserialize(data)

    def add(self, value: V) -> None:
        """Fold ``value`` in."""
        descriptor = self._descriptor
        assert isinstance(descriptor, ReducingStateDescriptor) and descriptor.reduce is not None
        current = self.get()
        folded = value if current is None else descriptor.reduce(current, value)
        self._set(self._values.serialize(folded))


class TtlAggregatingState(_TtlValue, Generic[V]):
    """An accumulator per key, expiring ``ttl`` after its last write."""

    def get(self) -> Any:
        """The accumulator (None if nothing was added since it expired)."""
        data = self._live()
        return None if data is None else self._values.deserialize(data)

    def add(self, value: V) -> None:
        """Add ``value`` to the accumulator."""
        descriptor = self._descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        assert descriptor.create is not None and descriptor.add is not None
        current = self.get()
        accumulator = descriptor.add(descriptor.create() if current is None else current, value)
        self._set(self._values.serialize(accumulator))


class TtlListState(_TtlState, Generic[V]):
    """A list per key; each element expires ``ttl`` after it was added."""

    def _live(self) -> list[bytes]:
        """The live elements as stored (with expiry); the expired ones are removed."""
        stored = self._context.read(self._name)
        if not stored:
            return []
        assert isinstance(stored, list)
        now = self._now()
        live = [item for item in stored if expiry_of(item) > now]
        if len(live) != len(stored):
            if live:
                self._context.write(self._name, LIST_REPLACE, None, None, tuple(live))
            else:
                self._context.write(self._name, DELETE)
        return live

    def get(self) -> list[V]:
        """The current key's live elements, oldest first."""
        live = self._live()
        if live and self._update_on_read:
            live = [self._stamp(value_of(item)) for item in live]
            self._context.write(self._name, LIST_REPLACE, None, None, tuple(live))
        return [self._values.deserialize(value_of(item)) for item in live]

    def add(self, value: V) -> None:
        """Append one value."""
        self.add_all((value,))

    def add_all(self, values: Iterable[V]) -> None:
        """Append several values (the expired elements are dropped at the same time)."""
        added = [self._stamp(self._values.serialize(v)) for v in values]
        if added:
            self._context.write(self._name, LIST_REPLACE, None, None,
                                (*self._live(), *added))

    def update(self, values: Iterable[V]) -> None:
        """Replace the list (every element's expiry starts now)."""
        items = tuple(self._stamp(self._values.serialize(v)) for v in values)
        self._context.write(self._name, LIST_REPLACE, None, None, items)


class TtlMapState(_TtlState, MapState[K, V]):
    """A map per key; each entry expires ``ttl`` after its last write. Reads go through
    :class:`~kafka_changelog.state.tables.state_objects.MapState`'s, over the live entries."""

    def __init__(self, context: KeyContext, descriptor: StateDescriptor,
                 now_ms: Callable[[], int], on_write: OnWrite) -> None:
        MapState.__init__(self, context, descriptor)
        _TtlState.__init__(self, context, descriptor, now_ms, on_write)

    def _value_of(self, encoded_key: bytes) -> bytes | None:
        """The live value under a map key (expired: removed, None)."""
        stored = self._context.read_map_value(self._name, encoded_key)
        if stored is None:
            return None
        if expiry_of(stored) <= self._now():
            self._context.write(self._name, MAP_REMOVE, encoded_key)
            return None
        data = value_of(stored)
        if self._update_on_read:
            self._context.write(self._name, MAP_PUT, encoded_key, self._stamp(data))
        return data

    def _map(self) -> dict[bytes, bytes]:
        """Live entries (values without expiry); the expired ones are removed."""
        stored = self._context.read(self._name)
        if not isinstance(stored, dict):
            return {}
        now = self._now()
        live = {}
        for key, item in list(stored.items()):
            if expiry_of(item) <= now:
                self._context.write(self._name, MAP_REMOVE, key)
            else:
                live[key] = value_of(item)
        if self._update_on_read:
            for key, data in live.items():
                self._context.write(self._name, MAP_PUT, key, self._stamp(data))
        return live

    def get(self, map_key: K, default: V | None = None) -> V | None:
        """The value under ``map_key`` (``default`` if none or expired)."""
        data = self._value_of(self._keys.serialize(map_key))
        return default if data is None else self._values.deserialize(data)

    def put(self, map_key: K, value: V) -> None:
        """Set the value under ``map_key`` (its expiry starts again)."""
        self._context.write(self._name, MAP_PUT, self._keys.serialize(map_key),
                            self._stamp(self._values.serialize(value)))


def check_ttl_unchanged(known: StateMeta | None, meta: StateMeta) -> None:
    """Refuse adding or removing a state's TTL (its values' bytes differ), naming it."""
    if known is None or known.kind != meta.kind:
        return
    was, was_ttl = split_serializer_name(known.value_serializer)
    now, now_ttl = split_serializer_name(meta.value_serializer)
    if was == now and was_ttl != now_ttl:
        raise StateMismatchError(
            f"state {meta.state!r} was written {'with' if was_ttl else 'without'} a TTL and "
            f"is now declared {'with' if now_ttl else 'without'} one: adding or removing a "
            "TTL changes how its values are stored; give the state a new name (a changed "
            "TTL duration is fine: it applies from each entry's next write)")


def expire_entries(context: KeyContext, state: str, now: int) -> int | None:
    """Remove the current key's entries of TTL'd ``state`` expired at ``now`` (logged
    changes); the earliest expiry of what remains (None: nothing)."""
    entry = context.read(state)
    if entry is None:
        return None
    if isinstance(entry, bytes):
        expires = expiry_of(entry)
        if expires > now:
            return expires
        context.write(state, DELETE)
        return None
    if isinstance(entry, list):
        live = [item for item in entry if expiry_of(item) > now]
        if len(live) != len(entry):
            if live:
                context.write(state, LIST_REPLACE, None, None, tuple(live))
            else:
                context.write(state, DELETE)
        return min((expiry_of(item) for item in live), default=None)
    following: int | None = None
    for map_key, item in list(entry.items()):
        expires = expiry_of(item)
        if expires <= now:
            context.write(state, MAP_REMOVE, map_key)
        elif following is None or expires < following:
            following = expires
    return following


__all__ = ["TtlAggregatingState", "TtlListState", "TtlMapState", "TtlReducingState",
           "TtlValueState", "check_ttl_unchanged", "expire_entries"]
