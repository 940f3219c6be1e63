"""What a keyed state is: its name, kind, serializers and (for merging kinds) functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from .kinds import StateKind as StateKind  # part of the descriptors API
from .serializers import BYTES, Serializer
from .ttl import StateTtl, ttl_serializer_name

#: A TTL as descriptors take it: a ``timedelta``, seconds, or a :class:`StateTtl`.
TtlSetting = StateTtl | timedelta | float | None

V = TypeVar("V")
K = TypeVar("K")
A = TypeVar("A")


@dataclass(frozen=True)
class StateDescriptor:
    """Common part of every descriptor.

    ``ttl``: how long each entry (a value, a list element, a map entry) lives after its
    last write (see :mod:`kafka_changelog.state.schema.ttl`); None: forever.
    """

    name: str
    kind: StateKind
    value_serializer: Serializer[Any]
    map_key_serializer: Serializer[Any] | None = None
    ttl: StateTtl | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a state needs a non-empty name")

    def value_serializer_name(self) -> str:
        """The value serializer's name as registered (``ttl:`` in front with a TTL)."""
        name = self.value_serializer.name
        return ttl_serializer_name(name) if self.ttl is not None else name


def _ttl(name: str, ttl: TtlSetting) -> StateTtl | None:
    return None if ttl is None else StateTtl.of(ttl, name)


def value_state(name: str, serializer: Serializer[V] = BYTES,  # type: ignore[assignment]
                ttl: TtlSetting = None) -> StateDescriptor:
    """A single value per key (expiring ``ttl`` after its last write, if given)."""
    return StateDescriptor(name, StateKind.VALUE, serializer, ttl=_ttl(name, ttl))


def list_state(name: str, serializer: Serializer[V] = BYTES,  # type: ignore[assignment]
               ttl: TtlSetting = None) -> StateDescriptor:
    """A list of values per key (each element expiring ``ttl`` after it was written)."""
    return StateDescriptor(name, StateKind.LIST, serializer, ttl=_ttl(name, ttl))


def map_state(
    name: str,
    key_serializer: Serializer[K] = BYTES,  # type: ignore[assignment]
    value_serializer: Serializer[V] = BYTES,  # type: ignore[assignment]
    ttl: TtlSetting = None,
) -> StateDescriptor:
    """A map per key (each entry expiring ``ttl`` after its last write)."""
    return StateDescriptor(name, StateKind.MAP, value_serializer, key_serializer,
                           ttl=_ttl(name, ttl))


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[V]):
    """A value per key that new values are folded into with ``reduce``."""

    reduce: Callable[[V, V], V] | None = None


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[V, A]):
    """An accumulator per key: ``add(acc, value)``, starting from ``create()``."""

    create: Callable[[], A] | None = None
    add: Callable[[A, V], A] | None = None


def reducing_state(
    name: str, reduce: Callable[[V, V], V], serializer: Serializer[V], ttl: TtlSetting = None
) -> ReducingStateDescriptor[V]:
    """A value per key folded with ``reduce`` (e.g. a running sum; expiring ``ttl`` after
    its last write, if given: the next value then starts afresh)."""
    return ReducingStateDescriptor(name, StateKind.REDUCING, serializer,
                                   ttl=_ttl(name, ttl), reduce=reduce)


def aggregating_state(
    name: str, create: Callable[[], A], add: Callable[[A, V], A], serializer: Serializer[A],
    ttl: TtlSetting = None,
) -> AggregatingStateDescriptor[V, A]:
    """An accumulator per key (serialized with ``serializer``) updated by ``add``
    (expiring ``ttl`` after its last write, if given)."""
    return AggregatingStateDescriptor(
        name, StateKind.AGGREGATING, serializer, ttl=_ttl(name, ttl), create=create, add=add)
