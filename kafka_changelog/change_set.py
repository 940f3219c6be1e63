"""A change set: the changes appended between two sequence-number rollovers."""

from __future__ import annotations

from dataclasses import dataclass, field

from .change import StateChange
from .keygroups import KeyGroupRange
from .sequence import SequenceNumber


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Changes of one writer sharing one sequence number, in append order."""

    sequence_number: SequenceNumber
    changes: tuple[StateChange, ...]
    #: Total payload bytes: counted once (the writer knows it as it appends; -1: count
    #: them here), not on every look (pending bytes, upload sizes, handle sizes).
    size_bytes: int = field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            object.__setattr__(self, "size_bytes",
                               sum(len(change.payload) for change in self.changes))

    def restricted_to(self, key_group_range: KeyGroupRange) -> ChangeSet:
        """Only the changes of ``key_group_range``, plus every meta change."""
        kept = tuple(
            change
            for change in self.changes
            if change.is_meta or key_group_range.contains(change.key_group)
        )
        return ChangeSet(self.sequence_number, kept)
