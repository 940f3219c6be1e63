"""Who still needs a persisted change set: the writer, checkpoints, or nobody.

Follows the DSTL's ownership rules. A change set persisted by a writer is held
by that writer until it is truncated (or the writer closes). ``confirm`` adds a
hold for the completed checkpoint, which the checkpoint store releases when the
checkpoint is subsumed; ``reset`` (checkpoint aborted) removes that checkpoint's
hold. A change set with no holder left is discardable: the storage may free it
(for Kafka: delete the records below the lowest offset still needed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .sequence import SequenceNumber

#: The hold a writer keeps on what it persisted until it truncates it.
WRITER_HOLD = "writer"

L = TypeVar("L")


def checkpoint_hold(checkpoint_id: int) -> str:
    """The hold name of a completed checkpoint."""
    return f"checkpoint:{checkpoint_id}"


@dataclass
class RegistryEntry(Generic[L]):
    """A persisted change set, where it lives, and who holds it."""

    log_id: str
    sequence_number: SequenceNumber
    location: L
    holders: set[str] = field(default_factory=set)


class ChangelogRegistry(Generic[L]):
    """Thread-safe table of persisted change sets and their holders.

    ``on_discard`` is called (outside the lock) with every entry whose last
    holder went away.
    """

    def __init__(self, on_discard: Callable[[RegistryEntry[L]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, SequenceNumber], RegistryEntry[L]] = {}
        self._on_discard = on_discard

    def register(self, log_id: str, sqn: SequenceNumber, location: L) -> None:
        """Record a freshly persisted change set, held by its writer."""
        with self._lock:
            self._entries[(log_id, sqn)] = RegistryEntry(log_id, sqn, location, {WRITER_HOLD})

    def add_hold(
        self, log_id: str, lo: SequenceNumber, hi: SequenceNumber | None, holder: str
    ) -> None:
        """Add ``holder`` to the change sets of ``log_id`` with ``lo <= sqn < hi``."""
        with self._lock:
            for entry in self._select(log_id, lo, hi):
                entry.holders.add(holder)

    def release(
        self, log_id: str, lo: SequenceNumber | None, hi: SequenceNumber | None, holder: str
    ) -> None:
        """Drop ``holder`` from the change sets of ``log_id`` with ``lo <= sqn < hi``."""
        self._discard(self._release_where(lambda e: e.log_id == log_id and _within(e, lo, hi),
                                          holder))

    def release_everywhere(self, holder: str) -> None:
        """Drop ``holder`` from every entry (e.g. a subsumed checkpoint)."""
        self._discard(self._release_where(lambda e: True, holder))

    def holders(self, log_id: str, sqn: SequenceNumber) -> frozenset[str]:
        """Who holds a change set (empty once discarded or never persisted)."""
        with self._lock:
            entry = self._entries.get((log_id, sqn))
            return frozenset(entry.holders) if entry else frozenset()

    def live_entries(self) -> list[RegistryEntry[L]]:
        """A snapshot of every entry still held by someone."""
        with self._lock:
            return list(self._entries.values())

    def _select(
        self, log_id: str, lo: SequenceNumber | None, hi: SequenceNumber | None
    ) -> Iterator[RegistryEntry[L]]:
        for entry in self._entries.values():
            if entry.log_id == log_id and _within(entry, lo, hi):
                yield entry

    def _release_where(
        self, predicate: Callable[[RegistryEntry[L]], bool], holder: str
    ) -> list[RegistryEntry[L]]:
        freed: list[RegistryEntry[L]] = []
        with self._lock:
            for key, entry in list(self._entries.items()):
                if holder in entry.holders and predicate(entry):
                    entry.holders.discard(holder)
                    if not entry.holders:
                        del self._entries[key]
                        freed.append(entry)
        return freed

    def _discard(self, freed: list[RegistryEntry[L]]) -> None:
        if self._on_discard is not None:
            for entry in freed:
                self._on_discard(entry)


def _within(entry: RegistryEntry[L], lo: SequenceNumber | None, hi: SequenceNumber | None) -> bool:
    sqn = entry.sequence_number
    return (lo is None or sqn >= lo) and (hi is None or sqn < hi)
