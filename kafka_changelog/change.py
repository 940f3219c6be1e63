"""A single state change as the changelog sees it: opaque bytes for a key group."""

from __future__ import annotations

from dataclasses import dataclass

#: Key group of meta changes (state registration and the like), which belong to no key group.
META_KEY_GROUP = -1


@dataclass(frozen=True, slots=True)
class StateChange:
    """An opaque state change for one key group, or a meta change (``key_group == -1``)."""

    key_group: int
    payload: bytes

    def __post_init__(self) -> None:
        if self.key_group < 0 and self.key_group != META_KEY_GROUP:
            raise ValueError(
                f"key group must be >= 0 (or {META_KEY_GROUP} for meta), got {self.key_group}"
            )
        if not isinstance(self.payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(self.payload).__name__}")

    @classmethod
    def meta(cls, payload: bytes) -> StateChange:
        """A change that belongs to no key group (restored by every subtask)."""
        return cls(META_KEY_GROUP, payload)

    @property
    def is_meta(self) -> bool:
        """True for meta changes."""
        return self.key_group == META_KEY_GROUP
