"""The in-memory writer: persisting is immediate and the location is the change set."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from ..buffering_writer import BufferingChangelogWriter
from ..change_set import ChangeSet
from ..sequence import SequenceNumber
from .handle import InMemoryChangelogHandle


class InMemoryChangelogWriter(BufferingChangelogWriter[InMemoryChangelogHandle, ChangeSet]):
    """Reference semantics of a writer, with nothing leaving the process."""

    def _upload(self, change_sets: Sequence[ChangeSet]) -> list[Future[ChangeSet]]:
        futures: list[Future[ChangeSet]] = []
        for change_set in change_sets:
            future: Future[ChangeSet] = Future()
            future.set_result(change_set)
            futures.append(future)
        return futures

    def _make_handle(
        self, parts: Sequence[tuple[SequenceNumber, ChangeSet]], checkpoint_id: int
    ) -> InMemoryChangelogHandle:
        return InMemoryChangelogHandle(
            self.log_id, self.key_group_range, [cs for _, cs in parts], checkpoint_id
        )
