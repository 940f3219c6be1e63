"""The read side of a storage: a read-only view that gives a handle's changes.

Flink's ``StateChangelogStorageView``: restoring needs no writer, no producer and no
write access, only a way to read what handles name. Each storage provides a reader
for its handles (:meth:`StateChangelogStorage.reader`); a handle never reads itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from .change import StateChange
from .change_columns import DecodedChanges
from .errors import ChangelogError
from .handle import ChangelogHandle

H = TypeVar("H", bound=ChangelogHandle)
R = TypeVar("R", bound="StateChangelogReader[Any]")


class StateChangelogReader(ABC, Generic[H]):
    """Reads the changes of a storage's handles (close it, or use it as a context manager)."""

    @abstractmethod
    def read(self, handle: H) -> Iterator[StateChange]:
        """The handle's changes in sequence order (append order within a change set).

        A piece of log that is gone is an error naming where (never fewer changes).
        """

    def read_columns(self, handles: Sequence[H]) -> DecodedChanges | None:
        """The changes of ``handles`` (consecutive pieces of one log, oldest first) as
        :meth:`read` of each in turn gives them, decoded column-wise (no object per
        change), or None: this reader does not decode column-wise, or leaves these handles
        to :meth:`read` (pieces it does not read together, more than fits its memory
        budget at once, an encoding only the per-change decoder reads or one it refuses,
        naming what is wrong). Raises what :meth:`read` raises for a piece of log that is
        gone."""
        return None

    def close(self) -> None:
        """Release clients (idempotent)."""

    def __enter__(self: R) -> R:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wrong_handle(reader: object, handle: ChangelogHandle) -> ChangelogError:
    """The error for a handle of another storage kind."""
    return ChangelogError(
        f"{type(reader).__name__} cannot read a {handle.kind} handle (log {handle.log_id}): "
        "read it with the reader of the storage that wrote it")
