"""The writer protocol: how an operator appends, persists and truncates its log."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from .errors import KeyGroupOutOfRangeError
from .keygroups import KeyGroupRange
from .sequence import SequenceNumber

H = TypeVar("H")
S = TypeVar("S", bound="StateChangelogWriter[Any]")


def check_change(key_group_range: KeyGroupRange, log_id: str, key_group: int,
                 payload: object) -> None:
    """Refuse a change a writer of ``key_group_range`` must not append: a key group
    outside its range, or a payload that is not ``bytes``."""
    if not key_group_range.start <= key_group <= key_group_range.end:
        raise KeyGroupOutOfRangeError(key_group, key_group_range, log_id)
    if type(payload) is not bytes:
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")


@dataclass(frozen=True)
class SnapshotResult(Generic[H]):
    """What a snapshot produced: the durable handle and, optionally, a task-local copy.

    ``job_owned`` is what checkpoints store and any process can restore from.
    ``task_local``, when set, describes the same state kept on this task's local disk
    (Flink's local recovery); restoring from it is faster, never different. Changelog
    writers keep no local copies, so their ``persist`` results have ``task_local=None``;
    the keyed state backend keeps them (from its journal and its materializations) and
    sets it in ``ChangelogKeyedStateBackend.snapshot_result`` (a
    ``LocalKeyedStateHandle``; see ``docs/state.md``).
    """

    job_owned: H | None
    task_local: H | None = None

    @classmethod
    def empty(cls) -> SnapshotResult[H]:
        """A result with nothing persisted."""
        return cls(None, None)


class StateChangelogWriter(ABC, Generic[H]):
    """Appends state changes of one operator's key-group range and persists them.

    Not thread-safe: one operator thread calls it. Sequence numbers order change
    sets: ``next_sequence_number`` closes the current set (if it holds changes)
    and returns the number of the next one. ``persist(from)`` makes everything
    from ``from`` on durable and returns a handle; afterwards ``confirm`` (the
    checkpoint completed), ``reset`` (it was aborted) or ``truncate`` (the state
    was materialized) tells the writer who owns what was persisted.
    """

    @property
    @abstractmethod
    def log_id(self) -> str:
        """Unique id of this writer's log."""

    @property
    @abstractmethod
    def key_group_range(self) -> KeyGroupRange:
        """Key groups this writer may append to."""

    @abstractmethod
    def append(self, key_group: int, payload: bytes) -> None:
        """Add a change for ``key_group`` to the current change set (not yet durable)."""

    def append_all(self, key_groups: Sequence[int], payloads: Sequence[bytes]) -> None:
        """Add ``payloads[i]`` for ``key_groups[i]``, in order: the same as :meth:`append`
        of each, except that every key group and payload is checked before any is added
        (bad input adds nothing). Writers may do it faster than one call per change."""
        if len(key_groups) != len(payloads):
            raise ValueError(f"append_all: {len(key_groups)} key groups but "
                             f"{len(payloads)} payloads")
        for key_group, payload in zip(key_groups, payloads, strict=True):
            check_change(self.key_group_range, self.log_id, key_group, payload)
        for key_group, payload in zip(key_groups, payloads, strict=True):
            self.append(key_group, payload)

    @abstractmethod
    def append_meta(self, payload: bytes) -> None:
        """Add a change that belongs to no key group (e.g. a state registration)."""

    @abstractmethod
    def initial_sequence_number(self) -> SequenceNumber:
        """The sequence number of the first change set."""

    @abstractmethod
    def next_sequence_number(self) -> SequenceNumber:
        """Close the current change set if it has changes; return the next set's number."""

    @abstractmethod
    def persist(self, from_sqn: SequenceNumber, checkpoint_id: int) -> Future[SnapshotResult[H]]:
        """Make every change from ``from_sqn`` (inclusive) durable.

        The future completes once all of them are durable, with a handle of
        exactly those changes, or fails with the cause.
        """

    @abstractmethod
    def confirm(self, from_sqn: SequenceNumber, to_sqn: SequenceNumber, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: it now holds ``[from_sqn, to_sqn)``."""

    @abstractmethod
    def reset(self, from_sqn: SequenceNumber, to_sqn: SequenceNumber, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: it holds nothing of ``[from_sqn, to_sqn)``."""

    @abstractmethod
    def truncate(self, to_sqn: SequenceNumber) -> None:
        """Drop changes before ``to_sqn`` (exclusive); persisting below it becomes an error."""

    @abstractmethod
    def truncate_and_close(self, from_sqn: SequenceNumber) -> None:
        """Drop changes from ``from_sqn`` on (no checkpoint uses them) and close."""

    @abstractmethod
    def close(self) -> None:
        """Close; appended but unpersisted changes are lost. Closing twice is a no-op."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once closed."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
