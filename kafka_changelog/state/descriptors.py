"""What a keyed state is: its name, kind, serializers and (for merging kinds) functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from .serializers import BYTES, Serializer

V = TypeVar("V")
K = TypeVar("K")
A = TypeVar("A")


class StateKind(str, Enum):
    """Kinds of keyed state (names as in ``schemas/state_meta.avsc``)."""

    VALUE = "VALUE"
    LIST = "LIST"
    MAP = "MAP"
    REDUCING = "REDUCING"
    AGGREGATING = "AGGREGATING"


@dataclass(frozen=True)
class StateDescriptor:
    """Common part of every descriptor."""

    name: str
    kind: StateKind
    value_serializer: Serializer[Any]
    map_key_serializer: Serializer[Any] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a state needs a non-empty name")


def value_state(name: str, serializer: Serializer[V] = BYTES) -> StateDescriptor:  # type: ignore[assignment]
    """A single value per key."""
    return StateDescriptor(name, StateKind.VALUE, serializer)


def list_state(name: str, serializer: Serializer[V] = BYTES) -> StateDescriptor:  # type: ignore[assignment]
    """A list of values per key."""
    return StateDescriptor(name, StateKind.LIST, serializer)


def map_state(
    name: str,
    key_serializer: Serializer[K] = BYTES,  # type: ignore[assignment]
    value_serializer: Serializer[V] = BYTES,  # type: ignore[assignment]
) -> StateDescriptor:
    """A map per key."""
    return StateDescriptor(name, StateKind.MAP, value_serializer, key_serializer)


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
    name: str, reduce: Callable[[V, V], V], serializer: Serializer[V]
) -> ReducingStateDescriptor[V]:
    """A value per key folded with ``reduce`` (e.g. a running sum)."""
    return ReducingStateDescriptor(name, StateKind.REDUCING, serializer, None, reduce)


def aggregating_state(
    name: str, create: Callable[[], A], add: Callable[[A, V], A], serializer: Serializer[A]
) -> AggregatingStateDescriptor[V, A]:
    """An accumulator per key (serialized with ``serializer``) updated by ``add``."""
    return AggregatingStateDescriptor(
        name, StateKind.AGGREGATING, serializer, None, create, add)
