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


__all__ = ["StateKind"]
