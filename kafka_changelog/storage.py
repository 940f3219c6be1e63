"""Changelog storages and how they are found by name.

A storage creates writers and owns what they share (clients, buffers, the
ownership registry). Storages are plug-ins: a package registers a factory under
the entry-point group ``kafka_changelog.storages`` (the Python counterpart of
Java's service loader), and :func:`load_storage` finds it by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from importlib.metadata import entry_points
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

from .errors import StorageLoadError, UnknownStorageError
from .gc_types import GarbageCollectionResult, LogFloor, StillNeeded
from .keygroups import KeyGroupRange
from .reader import StateChangelogReader
from .registry import ChangelogRegistry, checkpoint_hold
from .writer import StateChangelogWriter

#: Entry-point group storages register under.
STORAGE_ENTRY_POINT_GROUP = "kafka_changelog.storages"

H = TypeVar("H")
S = TypeVar("S", bound="StateChangelogStorage[Any]")


class StateChangelogStorage(ABC, Generic[H]):
    """Creates writers for operators; one storage serves many writers of a process."""

    #: Name the storage is registered under.
    name: ClassVar[str]

    @property
    @abstractmethod
    def registry(self) -> ChangelogRegistry[Any]:
        """Which persisted change sets are still held, and by whom."""

    @abstractmethod
    def create_writer(
        self, operator_id: str, key_group_range: KeyGroupRange
    ) -> StateChangelogWriter[H]:
        """A new writer (with a fresh log id) for ``operator_id``'s ``key_group_range``."""

    @abstractmethod
    def reader(self) -> StateChangelogReader[Any]:
        """A read-only view that gives the changes of this storage's handles."""

    def collect_garbage(
        self, retained: Callable[[], StillNeeded]
    ) -> GarbageCollectionResult | None:
        """Free what no live writer of this process and nothing in ``retained()`` needs.

        ``retained`` returns the handles that must stay readable and the log floors
        of every application sharing the storage; it is asked only once the storage
        knows what was written so far. Storages that free nothing do nothing (None).
        """
        return None

    def uncommitted_floors(self) -> list[LogFloor]:
        """Where this process may still write records a later checkpoint uses (per topic
        partition the lowest such offset); empty for storages without offsets."""
        return []

    def release_checkpoint(self, checkpoint_id: int) -> None:
        """A checkpoint was subsumed: drop its holds on everything it confirmed."""
        self.registry.release_everywhere(checkpoint_hold(checkpoint_id))

    def close(self) -> None:
        """Release resources (clients, threads). Writers must not be used afterwards."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def available_storages() -> list[str]:
    """Names of every installed storage."""
    return sorted({ep.name for ep in entry_points(group=STORAGE_ENTRY_POINT_GROUP)})


def load_storage(name: str, **config: Any) -> StateChangelogStorage[Any]:
    """Build the storage registered as ``name`` with ``config`` as keyword arguments.

    Raises :class:`UnknownStorageError` listing the installed names when there is
    no such storage, and :class:`StorageLoadError` when its factory fails to import.
    """
    matches = [ep for ep in entry_points(group=STORAGE_ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise UnknownStorageError(name, available_storages())
    try:
        factory = matches[0].load()
    except Exception as exc:
        raise StorageLoadError(
            f"changelog storage {name!r} is registered as {matches[0].value!r} "
            f"but could not be imported: {exc}"
        ) from exc
    storage = factory(**config)
    if not isinstance(storage, StateChangelogStorage):
        raise StorageLoadError(
            f"changelog storage {name!r} ({matches[0].value}) built a "
            f"{type(storage).__name__}, not a StateChangelogStorage"
        )
    return storage
