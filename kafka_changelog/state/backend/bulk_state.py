"""Keyed state of many keys at once: a bulk view over a keyed backend.

The per-key API (:mod:`kafka_changelog.state.tables.state_objects`) scopes every call to the
backend's current key: ``set_current_key`` per key, a state object per state, one
call per value. A :class:`BulkState` is opened for a fixed set of keys (e.g. the keys of
a micro-batch) and each of its calls reads or writes one state of many keys::

    state = BulkState(backend, keys=["ann", "bob"], key_bytes=[b"ann", b"bob"])
    counts = state.value(COUNT)
    counts.set(state.keys, [n + 1 for n in counts.get(state.keys, default=0)])

Keys are given by their natural value (whatever the caller uses to name them: the
``keys`` it was opened with); the view maps each to its key bytes and key group.
Writes are exactly the per-key API's: for each key, in the order given, the same
:class:`~kafka_changelog.state.schema.ops.StateOp` is applied to the working copy and logged
(through :meth:`ChangelogKeyedStateBackend.mutate_columns`), so checkpoints, restores,
rescaling, materialization and the readers see no difference. ``values.set(keys, vs)``
logs what ``set_current_key(k); value.update(v)`` logs for each ``k, v``; a
read-modify-write (``clear``, ``remove``, a reducing or aggregating ``add``) sees the
earlier writes of the same call when a key is given twice.

Sequences of keys and values may be lists, tuples, NumPy arrays or pandas Series /
Index (``tolist()`` turns NumPy scalars into Python ones, which the serializers need).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar

from ...keygroups import key_group_for_key
from ..errors import KeyNotInBatchError, StateMismatchError
from ..schema.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
)
from ..schema.ops import DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, MAP_REMOVE, SET, OpKind
from ..tables.protocol import Entry
from .bulk_ttl import BulkTtlState
from .keyed_backend import ChangelogKeyedStateBackend

#: How many of the view's keys an unknown-key error shows.
_EXAMPLES = 3


def _as_list(values: Iterable[Any]) -> list[Any]:
    """``values`` as a list of Python values (NumPy scalars converted)."""
    if isinstance(values, list):
        return values
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        converted = tolist()
        if isinstance(converted, list):
            return converted
    return list(values)


class BulkState:
    """Keyed state of ``keys`` (distinct natural key values) over ``backend``.

    ``key_bytes[i]`` is the state key of ``keys[i]`` and ``key_groups[i]`` its key group
    (computed from the key bytes when not given; when given, it must be
    ``key_group_for_key(key_bytes[i], max_parallelism)``, as for
    :meth:`ChangelogKeyedStateBackend.set_current_key`). Every key group must be in the
    backend's range. The backend's current key is neither used nor changed.

    Not thread-safe, like the backend. Use it while the keys' batch is processed: it
    caches nothing of the state, only the keys and the registered descriptors.
    """

    def __init__(self, backend: ChangelogKeyedStateBackend, keys: Iterable[Hashable],
                 key_bytes: Iterable[bytes], key_groups: Iterable[int] | None = None) -> None:
        self.backend = backend
        self._keys = _as_list(keys)
        #: The view's keys, in the order it was opened with (do not modify).
        self.keys: list[Any] = list(self._keys)
        self._key_bytes = _as_list(key_bytes)
        n = len(self._keys)
        if len(self._key_bytes) != n:
            raise ValueError(f"bulk state: {n} keys but {len(self._key_bytes)} key bytes")
        wrong = next((k for k in self._key_bytes if type(k) is not bytes), None)
        if wrong is not None:
            raise TypeError(f"bulk state: key bytes must be bytes, got "
                            f"{type(wrong).__name__} ({wrong!r})")
        if key_groups is None:
            max_p = backend.max_parallelism
            self._key_groups = [key_group_for_key(k, max_p) for k in self._key_bytes]
        else:
            self._key_groups = [int(kg) for kg in _as_list(key_groups)]
            if len(self._key_groups) != n:
                raise ValueError(f"bulk state: {n} keys but {len(self._key_groups)} key groups")
        self._index: dict[Any, int] = dict(zip(self._keys, range(n), strict=True))
        if len(self._index) != n:
            seen: set[Any] = set()
            twice = next(k for k in self._keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise ValueError(f"bulk state: key {twice!r} is given twice (keys must be "
                             "distinct)")
        backend.prepare_keys(self._key_groups)
        self._states: dict[str, _BulkKeyed | BulkTtlState] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._index
        except TypeError:  # unhashable: not a key
            return False

    @property
    def key_bytes(self) -> list[bytes]:
        """The state key of each of :attr:`keys` (do not modify)."""
        return self._key_bytes

    @property
    def key_groups(self) -> list[int]:
        """The key group of each of :attr:`keys` (do not modify)."""
        return self._key_groups

    # -- states ----------------------------------------------------------------------------

    def value(self, descriptor: StateDescriptor) -> BulkValueState:
        """The value state of ``descriptor`` (a ``value_state``) for many keys."""
        return self._state(descriptor, BulkValueState)  # type: ignore[no-any-return]

    def list(self, descriptor: StateDescriptor) -> BulkListState:
        """The list state of ``descriptor`` (a ``list_state``) for many keys."""
        return self._state(descriptor, BulkListState)  # type: ignore[no-any-return]

    def map(self, descriptor: StateDescriptor) -> BulkMapState:
        """The map state of ``descriptor`` (a ``map_state``) for many keys."""
        return self._state(descriptor, BulkMapState)  # type: ignore[no-any-return]

    def reducing(self, descriptor: StateDescriptor) -> BulkReducingState:
        """The reducing state of ``descriptor`` (a ``reducing_state``) for many keys."""
        return self._state(descriptor, BulkReducingState)  # type: ignore[no-any-return]

    def aggregating(self, descriptor: StateDescriptor) -> BulkAggregatingState:
        """The aggregating state of ``descriptor`` (an ``aggregating_state``) for many
        keys."""
        return self._state(descriptor, BulkAggregatingState)  # type: ignore[no-any-return]

    def __call__(self, descriptor: StateDescriptor) -> Any:
        """The bulk state object of ``descriptor``'s kind (like ``KeyState``'s call)."""
        return self._state(descriptor, _BY_KIND[descriptor.kind])

    def _state(self, descriptor: StateDescriptor, cls: type[_BulkKeyed]) -> Any:
        found: Any = self._states.get(descriptor.name)
        if found is None:
            known = self.backend.register(descriptor)
            # A TTL'd state goes key by key through the per-key TTL objects (bulk_ttl).
            found = self._states[descriptor.name] = (
                BulkTtlState(self, known) if known.ttl is not None
                else _BY_KIND[known.kind](self, known))
        if found.kind is not cls.kind:
            raise StateMismatchError(
                f"state {descriptor.name!r} is a {found.kind.value} state, not "
                f"{cls.kind.value}: use state.{_ACCESSOR[found.kind]}(...)")
        return found

    # -- keys ------------------------------------------------------------------------------

    def resolve(self, keys: Iterable[Hashable]
                ) -> tuple[builtins.list[int], builtins.list[bytes], bool]:
        """Key groups and key bytes of ``keys`` (natural values, any of the view's keys,
        in any order, repeats allowed), and whether they are distinct.

        Raises :class:`~kafka_changelog.state.errors.KeyNotInBatchError` naming the first
        key that is not one of the view's.
        """
        # Every bulk call resolves its keys first: changes the per-key API buffered for
        # its current key are applied before the call reads or writes the working copy.
        self.backend.flush_current_key()
        wanted = _as_list(keys)
        own = self._keys
        if len(wanted) == len(own) and (wanted is own or wanted == own):
            return self._key_groups, self._key_bytes, True  # all the keys, in their order
        index = self._index
        try:
            positions = [index[k] for k in wanted]
        except (KeyError, TypeError):
            missing = next(k for k in wanted if k not in self)
            raise KeyNotInBatchError(missing, len(own), own[:_EXAMPLES]) from None
        groups, key_bytes = self._key_groups, self._key_bytes
        return ([groups[p] for p in positions], [key_bytes[p] for p in positions],
                len(set(positions)) == len(positions))


#: What a read-modify-write step returns for a key it writes nothing for.
_SKIP = object()


class _BulkKeyed:
    """What the bulk state objects share: the view, the backend, the state's name."""

    kind: ClassVar[StateKind]

    def __init__(self, view: BulkState, descriptor: StateDescriptor) -> None:
        self._view = view
        self._backend = view.backend
        self._table = view.backend.table
        self._descriptor = descriptor
        self._name = descriptor.name
        self._values = descriptor.value_serializer

    def _aligned(self, keys: Iterable[Hashable], values: Iterable[Any], what: str
                 ) -> tuple[list[int], list[bytes], bool, list[Any]]:
        groups, key_bytes, distinct = self._view.resolve(keys)
        listed = _as_list(values)
        if len(listed) != len(key_bytes):
            raise ValueError(f"state {self._name!r}: {len(key_bytes)} keys but {len(listed)} "
                             f"{what}")
        return groups, key_bytes, distinct, listed

    def _entries(self, groups: list[int], key_bytes: list[bytes]) -> list[Entry | None]:
        get, name = self._table.get, self._name
        return [get(kg, name, kb) for kg, kb in zip(groups, key_bytes, strict=True)]

    def _read_entry(self, key_group: int, key: bytes) -> Entry | None:
        return self._table.get(key_group, self._name, key)

    def _read_modify_write(
        self, op: OpKind, groups: list[int], key_bytes: list[bytes], distinct: bool,
        args: list[Any], read: Callable[[int, bytes], Any],
        step: Callable[[Any, Any], tuple[Any, Any]], map_key: bytes | None = None,
    ) -> list[Any]:
        """Per key, in order: ``step(read(key group, key), arg) -> (value, result)``;
        ``value`` is what the key's ``op`` writes (the SET value; None for a DELETE or
        MAP_REMOVE), or ``_SKIP`` for no change. Returns the results.

        Distinct keys: every read first, then all changes in one
        :meth:`~ChangelogKeyedStateBackend.mutate_columns` call (a key's read sees no
        other key's write). A key given twice: each change is made before the next read,
        as one per-key call after another would."""
        results: list[Any] = []
        if distinct:
            changed_groups: list[int] = []
            changed_keys: list[bytes] = []
            changed_values: list[Any] = []
            for kg, kb, arg in zip(groups, key_bytes, args, strict=True):
                value, result = step(read(kg, kb), arg)
                results.append(result)
                if value is not _SKIP:
                    changed_groups.append(kg)
                    changed_keys.append(kb)
                    changed_values.append(value)
            self._write(op, changed_groups, changed_keys, changed_values, map_key)
        else:
            for kg, kb, arg in zip(groups, key_bytes, args, strict=True):
                value, result = step(read(kg, kb), arg)
                results.append(result)
                if value is not _SKIP:
                    self._write(op, [kg], [kb], [value], map_key)
        return results

    def _write(self, op: OpKind, groups: list[int], key_bytes: list[bytes],
               values: list[Any], map_key: bytes | None) -> None:
        self._backend.mutate_columns(
            self._name, op, groups, key_bytes,
            None if map_key is None else [map_key] * len(key_bytes),
            values if op is SET else None)

    def clear(self, keys: Iterable[Hashable]) -> None:
        """Remove the entry of each key (no change logged for keys that have none)."""
        groups, key_bytes, distinct = self._view.resolve(keys)

        def step(entry: Entry | None, _: Any) -> tuple[Any, None]:
            return (_SKIP if entry is None else None), None

        self._read_modify_write(DELETE, groups, key_bytes, distinct, [None] * len(groups),
                                self._read_entry, step)


class BulkValueState(_BulkKeyed):
    """One value per key, for many keys (see ``ValueState``)."""

    kind = StateKind.VALUE

    def get(self, keys: Iterable[Hashable], default: Any = None) -> list[Any]:
        """Each key's value (``default`` where it has none)."""
        deserialize = self._values.deserialize
        return [default if e is None else deserialize(e)  # type: ignore[arg-type]
                for e in self._entries(*self._view.resolve(keys)[:2])]

    def set(self, keys: Iterable[Hashable], values: Iterable[Any]) -> None:
        """Set each key's value: one ``SET`` per key, as ``ValueState.update``."""
        groups, key_bytes, _, listed = self._aligned(keys, values, "values")
        self._backend.mutate_columns(self._name, SET, groups, key_bytes,
                                     values=list(map(self._values.serialize, listed)))

    #: Same as :meth:`set` (the per-key API's name).
    update = set


class BulkListState(_BulkKeyed):
    """A list of values per key, for many keys (see ``ListState``)."""

    kind = StateKind.LIST

    def get(self, keys: Iterable[Hashable]) -> list[list[Any]]:
        """Each key's list (empty where it has none)."""
        deserialize = self._values.deserialize
        return [[deserialize(item) for item in e] if e else []  # type: ignore[arg-type]
                for e in self._entries(*self._view.resolve(keys)[:2])]

    def add(self, keys: Iterable[Hashable], items: Iterable[Any]) -> None:
        """Append one item to each key's list (``ListState.add``)."""
        groups, key_bytes, _, listed = self._aligned(keys, items, "items")
        serialize = self._values.serialize
        self._backend.mutate_columns(self._name, LIST_ADD, groups, key_bytes,
                                     items=[(serialize(v),) for v in listed])

    def add_all(self, keys: Iterable[Hashable], lists: Iterable[Iterable[Any]]) -> None:
        """Append a list of items to each key's list (``ListState.add_all``: nothing is
        logged for an empty one)."""
        groups, key_bytes, _, listed = self._aligned(keys, lists, "lists")
        serialize = self._values.serialize
        encoded = [tuple(map(serialize, items)) for items in listed]
        kept = [i for i, entry in enumerate(encoded) if entry]
        self._backend.mutate_columns(self._name, LIST_ADD, [groups[i] for i in kept],
                                     [key_bytes[i] for i in kept],
                                     items=[encoded[i] for i in kept])

    def update(self, keys: Iterable[Hashable], lists: Iterable[Iterable[Any]]) -> None:
        """Replace each key's list (``ListState.update``; an empty list removes it)."""
        groups, key_bytes, _, listed = self._aligned(keys, lists, "lists")
        serialize = self._values.serialize
        self._backend.mutate_columns(self._name, LIST_REPLACE, groups, key_bytes,
                                     items=[tuple(map(serialize, items)) for items in listed])


class BulkMapState(_BulkKeyed):
    """A map per key, for many keys (see ``MapState``).

    ``get``/``put``/``remove``/``contains`` use one map key for all keys;
    ``get_each``/``put_each`` take a map key per key (e.g. the two levels of a
    ``groupby([key, map key])``).
    """

    kind = StateKind.MAP

    def __init__(self, view: BulkState, descriptor: StateDescriptor) -> None:
        super().__init__(view, descriptor)
        assert descriptor.map_key_serializer is not None
        self._map_keys = descriptor.map_key_serializer

    def _encoded_map_keys(self, map_keys: list[Any]) -> list[bytes]:
        # Few distinct map keys per batch, as a rule: each is serialized once.
        cache: dict[Any, bytes] = {}
        serialize = self._map_keys.serialize
        encoded = []
        for map_key in map_keys:
            data = cache.get(map_key)
            if data is None:
                data = cache[map_key] = serialize(map_key)
            encoded.append(data)
        return encoded

    def get(self, keys: Iterable[Hashable], map_key: Any, default: Any = None) -> list[Any]:
        """Each key's value under ``map_key`` (``default`` where there is none)."""
        groups, key_bytes, _ = self._view.resolve(keys)
        return self._values_at(groups, key_bytes,
                               [self._map_keys.serialize(map_key)] * len(groups), default)

    def get_each(self, keys: Iterable[Hashable], map_keys: Iterable[Any],
                 default: Any = None) -> list[Any]:
        """The value of each key under its own map key (``default`` where none)."""
        groups, key_bytes, _, listed = self._aligned(keys, map_keys, "map keys")
        return self._values_at(groups, key_bytes, self._encoded_map_keys(listed), default)

    def _values_at(self, groups: list[int], key_bytes: list[bytes], map_keys: list[bytes],
                   default: Any) -> list[Any]:
        get, name = self._table.get_map_value, self._name
        deserialize = self._values.deserialize
        found = [get(kg, name, kb, mk)
                 for kg, kb, mk in zip(groups, key_bytes, map_keys, strict=True)]
        return [default if data is None else deserialize(data) for data in found]

    def put(self, keys: Iterable[Hashable], map_key: Any, values: Iterable[Any]) -> None:
        """Set each key's value under ``map_key`` (``MapState.put``)."""
        groups, key_bytes, _, listed = self._aligned(keys, values, "values")
        encoded = self._map_keys.serialize(map_key)
        self._backend.mutate_columns(self._name, MAP_PUT, groups, key_bytes,
                                     [encoded] * len(key_bytes),
                                     list(map(self._values.serialize, listed)))

    def put_each(self, keys: Iterable[Hashable], map_keys: Iterable[Any],
                 values: Iterable[Any]) -> None:
        """Set the value of each key under its own map key."""
        groups, key_bytes, _, listed = self._aligned(keys, values, "values")
        encoded = self._encoded_map_keys(_as_list(map_keys))
        if len(encoded) != len(listed):
            raise ValueError(f"state {self._name!r}: {len(listed)} values but "
                             f"{len(encoded)} map keys")
        self._backend.mutate_columns(self._name, MAP_PUT, groups, key_bytes, encoded,
                                     list(map(self._values.serialize, listed)))

    def remove(self, keys: Iterable[Hashable], map_key: Any) -> None:
        """Remove ``map_key`` from each key's map (no change logged where it is absent)."""
        groups, key_bytes, distinct = self._view.resolve(keys)
        encoded = self._map_keys.serialize(map_key)
        get, name = self._table.get_map_value, self._name

        def read(kg: int, kb: bytes) -> bytes | None:
            return get(kg, name, kb, encoded)  # the one map value, not the whole map

        def step(value: bytes | None, _: Any) -> tuple[Any, None]:
            return (_SKIP if value is None else None), None

        self._read_modify_write(MAP_REMOVE, groups, key_bytes, distinct,
                                [None] * len(groups), read, step, encoded)

    def contains(self, keys: Iterable[Hashable], map_key: Any) -> list[bool]:
        """Whether each key's map holds ``map_key``."""
        groups, key_bytes, _ = self._view.resolve(keys)
        encoded = self._map_keys.serialize(map_key)
        get, name = self._table.get_map_value, self._name
        return [get(kg, name, kb, encoded) is not None
                for kg, kb in zip(groups, key_bytes, strict=True)]

    def get_all(self, keys: Iterable[Hashable]) -> list[dict[Any, Any]]:
        """Each key's whole map ({} where it has none), ordered by serialized map key
        (``MapState.items``)."""
        map_key_of, value_of = self._map_keys.deserialize, self._values.deserialize
        maps: list[dict[Any, Any]] = []
        for entry in self._entries(*self._view.resolve(keys)[:2]):
            if not entry:
                maps.append({})
                continue
            assert isinstance(entry, dict)
            maps.append({map_key_of(k): value_of(entry[k]) for k in sorted(entry)})
        return maps


class BulkReducingState(_BulkKeyed):
    """A value per key that added values are folded into, for many keys (see
    ``ReducingState``)."""

    kind = StateKind.REDUCING

    def get(self, keys: Iterable[Hashable]) -> list[Any]:
        """Each key's folded value (None where nothing was added)."""
        deserialize = self._values.deserialize
        return [None if e is None else deserialize(e)  # type: ignore[arg-type]
                for e in self._entries(*self._view.resolve(keys)[:2])]

    def add(self, keys: Iterable[Hashable], values: Iterable[Any]) -> list[Any]:
        """Fold each value into its key's value (``ReducingState.add``: read, reduce,
        ``SET``); returns the folded values."""
        descriptor = self._descriptor
        assert isinstance(descriptor, ReducingStateDescriptor) and descriptor.reduce is not None
        reduce = descriptor.reduce
        serialize, deserialize = self._values.serialize, self._values.deserialize

        def step(entry: Entry | None, value: Any) -> tuple[bytes, Any]:
            folded = value if entry is None else reduce(deserialize(entry), value)  # type: ignore[arg-type]
            return serialize(folded), folded

        return self._read_modify_write(SET, *self._aligned(keys, values, "values"),
                                       self._read_entry, step)


class BulkAggregatingState(_BulkKeyed):
    """An accumulator per key, for many keys (see ``AggregatingState``)."""

    kind = StateKind.AGGREGATING

    def get(self, keys: Iterable[Hashable]) -> list[Any]:
        """Each key's accumulator (None where nothing was added)."""
        deserialize = self._values.deserialize
        return [None if e is None else deserialize(e)  # type: ignore[arg-type]
                for e in self._entries(*self._view.resolve(keys)[:2])]

    def add(self, keys: Iterable[Hashable], values: Iterable[Any]) -> list[Any]:
        """Add each value to its key's accumulator (``AggregatingState.add``); returns
        the accumulators."""
        descriptor = self._descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        assert descriptor.create is not None and descriptor.add is not None
        create, add = descriptor.create, descriptor.add
        serialize, deserialize = self._values.serialize, self._values.deserialize

        def step(entry: Entry | None, value: Any) -> tuple[bytes, Any]:
            accumulator = add(create() if entry is None else deserialize(entry), value)  # type: ignore[arg-type]
            return serialize(accumulator), accumulator

        return self._read_modify_write(SET, *self._aligned(keys, values, "values"),
                                       self._read_entry, step)


_BY_KIND: dict[StateKind, type[_BulkKeyed]] = {
    StateKind.VALUE: BulkValueState,
    StateKind.LIST: BulkListState,
    StateKind.MAP: BulkMapState,
    StateKind.REDUCING: BulkReducingState,
    StateKind.AGGREGATING: BulkAggregatingState,
}
_ACCESSOR = {StateKind.VALUE: "value", StateKind.LIST: "list", StateKind.MAP: "map",
             StateKind.REDUCING: "reducing", StateKind.AGGREGATING: "aggregating"}

__all__ = [
    "BulkAggregatingState",
    "BulkListState",
    "BulkMapState",
    "BulkReducingState",
    "BulkState",
    "BulkValueState",
]
