"""A change set: the changes appended between two sequence-number rollovers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .change import META_KEY_GROUP, StateChange, new_unchecked
from .keygroups import KeyGroupRange
from .sequence import SequenceNumber


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Changes of one writer sharing one sequence number, in append order, as two columns.

    Change ``i`` is ``(key_groups[i], payloads[i])`` (key group ``-1``: a meta change).
    Columns, not one object per change: a writer's hot path only extends two lists, and
    a storage encodes them column by column. Both columns have the same length; nobody
    mutates them once the set is built.
    """

    sequence_number: SequenceNumber
    key_groups: Sequence[int]
    payloads: Sequence[bytes]
    #: Total payload bytes: counted once (the writer knows it as it appends; -1: count
    #: them here), not on every look (pending bytes, upload sizes, handle sizes).
    size_bytes: int = field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if len(self.key_groups) != len(self.payloads):
            raise ValueError(f"change set {self.sequence_number}: {len(self.key_groups)} key "
                             f"groups but {len(self.payloads)} payloads")
        if self.size_bytes < 0:
            object.__setattr__(self, "size_bytes", sum(map(len, self.payloads)))

    @classmethod
    def of(cls, sequence_number: SequenceNumber, changes: Iterable[StateChange]) -> ChangeSet:
        """The set of ``changes`` (in this order)."""
        listed = list(changes)
        return cls(sequence_number, [c.key_group for c in listed], [c.payload for c in listed])

    @property
    def changes(self) -> tuple[StateChange, ...]:
        """The changes as :class:`StateChange` objects (built on each look)."""
        return tuple(
            new_unchecked(StateChange, pair)
            for pair in zip(self.key_groups, self.payloads, strict=True)
        )

    def __len__(self) -> int:
        return len(self.payloads)

    def __hash__(self) -> int:
        # The columns are lists (unhashable): the sequence number and size identify enough.
        return hash((self.sequence_number, len(self.payloads), self.size_bytes))

    def restricted_to(self, key_group_range: KeyGroupRange) -> ChangeSet:
        """Only the changes of ``key_group_range``, plus every meta change."""
        start, end = key_group_range.start, key_group_range.end
        kept = [
            i for i, kg in enumerate(self.key_groups)
            if kg == META_KEY_GROUP or start <= kg <= end
        ]
        return ChangeSet(self.sequence_number, [self.key_groups[i] for i in kept],
                         [self.payloads[i] for i in kept])
