"""A single state change as the changelog sees it: opaque bytes for a key group."""

from __future__ import annotations

from typing import NamedTuple

#: Key group of meta changes (state registration and the like), which belong to no key group.
META_KEY_GROUP = -1


class _StateChangeFields(NamedTuple):
    key_group: int
    payload: bytes


class StateChange(_StateChangeFields):
    """An opaque state change for one key group, or a meta change (``key_group == -1``).

    Immutable (a named tuple: cheap to create on the append hot path).
    """

    __slots__ = ()

    def __new__(cls, key_group: int, payload: bytes) -> StateChange:
        if key_group < 0 and key_group != META_KEY_GROUP:
            raise ValueError(
                f"key group must be >= 0 (or {META_KEY_GROUP} for meta), got {key_group}"
            )
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        return tuple.__new__(cls, (key_group, payload))

    @classmethod
    def meta(cls, payload: bytes) -> StateChange:
        """A change that belongs to no key group (restored by every subtask)."""
        return cls(META_KEY_GROUP, payload)

    @property
    def is_meta(self) -> bool:
        """True for meta changes."""
        return self.key_group == META_KEY_GROUP

    def __repr__(self) -> str:
        return f"StateChange(key_group={self.key_group}, payload={self.payload!r})"


#: ``tuple.__new__``: builds a StateChange (or another tuple type) from parts already
#: checked, without ``__new__``'s checks, on hot paths: ``new_unchecked(StateChange, (kg,
#: payload))``. One C call instead of a Python one.
new_unchecked = tuple.__new__
