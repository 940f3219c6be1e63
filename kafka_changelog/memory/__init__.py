"""The in-memory storage: the embedded default and the reference semantics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from ..change import StateChange
from ..change_set import ChangeSet
from ..keygroups import KeyGroupRange
from ..reader import StateChangelogReader, wrong_handle
from ..registry import ChangelogRegistry
from ..storage import StateChangelogStorage
from .handle import InMemoryChangelogHandle
from .writer import InMemoryChangelogWriter

__all__ = [
    "InMemoryChangelogHandle",
    "InMemoryChangelogReader",
    "InMemoryChangelogStorage",
    "InMemoryChangelogWriter",
]


class InMemoryChangelogReader(StateChangelogReader[InMemoryChangelogHandle]):
    """Reads in-memory handles (which carry their change sets)."""

    def read(self, handle: InMemoryChangelogHandle) -> Iterator[StateChange]:
        if not isinstance(handle, InMemoryChangelogHandle):
            raise wrong_handle(self, handle)
        for change_set in handle.change_sets:
            yield from change_set.changes


class InMemoryChangelogStorage(StateChangelogStorage[InMemoryChangelogHandle]):
    """Keeps persisted change sets in process memory until nobody holds them.

    Nothing survives the process: use it for tests, for the embedded default and
    as the model other storages are checked against.
    """

    name = "memory"

    def __init__(self, preemptive_persist_threshold_bytes: int | None = None) -> None:
        self._threshold = preemptive_persist_threshold_bytes
        self._registry: ChangelogRegistry[ChangeSet] = ChangelogRegistry()

    @property
    def registry(self) -> ChangelogRegistry[ChangeSet]:
        return self._registry

    def create_writer(
        self, operator_id: str, key_group_range: KeyGroupRange
    ) -> InMemoryChangelogWriter:
        log_id = f"{operator_id}-{uuid.uuid4().hex[:12]}"
        return InMemoryChangelogWriter(
            log_id, key_group_range, self._registry, self._threshold
        )

    def reader(self) -> InMemoryChangelogReader:
        """A reader for this storage's handles."""
        return InMemoryChangelogReader()
