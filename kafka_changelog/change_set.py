"""A change set: the changes appended between two sequence-number rollovers."""

from __future__ import annotations

from dataclasses import dataclass

from .change import StateChange
from .keygroups import KeyGroupRange
from .sequence import SequenceNumber


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Changes of one writer sharing one sequence number, in append order."""

    sequence_number: SequenceNumber
    changes: tuple[StateChange, ...]

    @property
    def size_bytes(self) -> int:
        """Total payload bytes."""
        return sum(len(change.payload) for change in self.changes)

    def restricted_to(self, key_group_range: KeyGroupRange) -> ChangeSet:
        """Only the changes of ``key_group_range``, plus every meta change."""
        kept = tuple(
            change
            for change in self.changes
            if change.is_meta or key_group_range.contains(change.key_group)
        )
        return ChangeSet(self.sequence_number, kept)
