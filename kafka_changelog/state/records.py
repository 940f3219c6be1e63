"""Records as the stores write and read them, independent of any client library."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from typing import NamedTuple


class OutRecord(NamedTuple):
    """A record to produce: ``value=None`` is a tombstone."""

    partition: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


class StoredRecord(NamedTuple):
    """A record as found at an offset: key, value (None: tombstone) and headers."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


class RecordSource(ABC):
    """Fetches single records of one topic by (partition, offset)."""

    @abstractmethod
    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        """The record at ``offset``, or a description of what is there instead."""

    def fetch_all(self, locations: Sequence[tuple[int, int]]
                  ) -> Generator[StoredRecord | str, None, None]:
        """What :meth:`fetch` gives for each (partition, offset), in order. A source may
        read ahead (the whole plan is known)."""
        for partition, offset in locations:
            yield self.fetch(partition, offset)

    @abstractmethod
    def close(self) -> None:
        """Release what the source holds."""


class RecordAppender(ABC):
    """Records appended one by one, durable together at :meth:`finish`."""

    @abstractmethod
    def produce(self, record: OutRecord) -> None:
        """Append ``record`` (it may be sent at once)."""

    @abstractmethod
    def finish(self) -> list[int]:
        """Wait until every record is durable; their offsets, in order."""
