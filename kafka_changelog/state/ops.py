"""State mutations and registrations as changelog payloads (``schemas/state_op.avsc``,
``schemas/state_meta.avsc``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..serialization import decode, encode
from .descriptors import StateKind


class OpKind(str, Enum):
    """Mutation kinds (names as in ``schemas/state_op.avsc``)."""

    SET = "SET"
    DELETE = "DELETE"
    LIST_ADD = "LIST_ADD"
    LIST_REPLACE = "LIST_REPLACE"
    MAP_PUT = "MAP_PUT"
    MAP_REMOVE = "MAP_REMOVE"


@dataclass(frozen=True, slots=True)
class StateOp:
    """One mutation of one state for one key."""

    state: str
    op: OpKind
    key: bytes
    map_key: bytes | None = None
    value: bytes | None = None
    values: tuple[bytes, ...] | None = None

    def to_bytes(self) -> bytes:
        return encode("state_op", {
            "state": self.state, "op": self.op.value, "key": self.key,
            "map_key": self.map_key, "value": self.value,
            "values": list(self.values) if self.values is not None else None,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> StateOp:
        r = decode("state_op", data)
        values = r["values"]
        return cls(r["state"], OpKind(r["op"]), r["key"], r["map_key"], r["value"],
                   tuple(values) if values is not None else None)


@dataclass(frozen=True, slots=True)
class StateMeta:
    """Registration of a state: kind and serializer names."""

    state: str
    kind: StateKind
    value_serializer: str
    map_key_serializer: str | None = None

    def to_record(self) -> dict[str, object]:
        return {"state": self.state, "kind": self.kind.value,
                "value_serializer": self.value_serializer,
                "map_key_serializer": self.map_key_serializer}

    @classmethod
    def from_record(cls, r: dict[str, object]) -> StateMeta:
        map_key = r["map_key_serializer"]
        return cls(str(r["state"]), StateKind(str(r["kind"])), str(r["value_serializer"]),
                   str(map_key) if map_key is not None else None)

    def to_bytes(self) -> bytes:
        return encode("state_meta", self.to_record())

    @classmethod
    def from_bytes(cls, data: bytes) -> StateMeta:
        return cls.from_record(decode("state_meta", data))
