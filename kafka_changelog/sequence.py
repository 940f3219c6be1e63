"""Sequence numbers: the logical, per-writer order of change sets."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ChangelogError


class SequenceNumberOutOfRangeError(ChangelogError, ValueError):
    """A sequence number lies outside what the writer can persist or truncate."""

    def __init__(
        self,
        requested: SequenceNumber,
        lowest: SequenceNumber,
        highest: SequenceNumber,
        operation: str = "persist",
    ) -> None:
        self.requested = requested
        self.lowest = lowest
        self.highest = highest
        super().__init__(
            f"cannot {operation} from sequence number {requested}: the writer holds "
            f"sequence numbers {lowest} (inclusive, truncation point) to {highest} (inclusive)"
        )


class SequenceNumberOverflowError(ChangelogError, OverflowError):
    """A sequence number would pass its maximum value."""


#: Largest sequence number; the Avro and Kafka header encodings use signed 64 bit.
MAX_SEQUENCE_NUMBER = 2**63 - 1


@dataclass(frozen=True, order=True, slots=True)
class SequenceNumber:
    """A totally ordered, immutable position in one writer's log.

    Sequence numbers are logical: they order change sets of one writer. The
    durable address of persisted changes is kept by the storage (for Kafka a
    topic-partition offset range), never derived from the sequence number.
    """

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            raise TypeError(f"sequence number must be an int, got {type(self.value).__name__}")
        if not 0 <= self.value <= MAX_SEQUENCE_NUMBER:
            raise ValueError(
                f"sequence number {self.value} outside [0, {MAX_SEQUENCE_NUMBER}]"
            )

    @classmethod
    def initial(cls) -> SequenceNumber:
        """The first sequence number of every writer."""
        return cls(0)

    def next(self) -> SequenceNumber:
        """The following sequence number; raises past the maximum."""
        if self.value == MAX_SEQUENCE_NUMBER:
            raise SequenceNumberOverflowError(
                f"sequence number {self.value} is the maximum; there is no next"
            )
        return SequenceNumber(self.value + 1)

    def __str__(self) -> str:
        return f"#{self.value}"
