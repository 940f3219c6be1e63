"""The kinds of keyed state: what a descriptor declares and every logged change names."""

from __future__ import annotations

from enum import Enum


class StateKind(str, Enum):
    """Kinds of keyed state (names as in ``schemas/state_meta.avsc``)."""

    VALUE = "VALUE"
    LIST = "LIST"
    MAP = "MAP"
    REDUCING = "REDUCING"
    AGGREGATING = "AGGREGATING"


#: Entry of a value/reducing/aggregating state, of a list state, of a map state: how a
#: key's entry of each kind is held (in a working copy, a snapshot, a changelog replay).
Entry = bytes | list[bytes] | dict[bytes, bytes]


__all__ = ["Entry", "StateKind"]
