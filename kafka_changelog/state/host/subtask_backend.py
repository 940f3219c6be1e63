"""What a stateful task holds: which subtask it runs, how it got its backend, and the
backend a process keeps for the subtask's next task.

Shared by :mod:`~kafka_changelog.state.host.acquire` (the one way a task gets its backend)
and :mod:`~kafka_changelog.state.host.host_store` (host-local RocksDB stores), which import
it and not one another's types.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...enums import StrEnum
from ...keygroups import KeyGroupRange, key_group_range_for_operator
from ..backend.keyed_backend import ChangelogKeyedStateBackend
from ..tables.protocol import HostStoreTable


class StateSource(StrEnum):
    """How a task got its subtask's backend at the base checkpoint (a ``str``: metrics
    and reports carry the value)."""

    #: The backend this process kept after the subtask's previous task, exactly at the
    #: base (its host-local store reopened in place).
    REATTACHED = "reattached"
    #: The host-local store another process (or an earlier backend) left exactly at the
    #: base: a backend built on it as it is; no Kafka read.
    REATTACHED_LOCAL = "reattached-local"
    #: The host-local store went past the base (a batch whose checkpoint never completed)
    #: and became its copy kept at the base, then reattached.
    ROLLED_BACK = "rolled-back"
    #: The host-local store another process left at an older checkpoint of the same
    #: subtask, whose state the base continues (same snapshot, its changelog a prefix of
    #: the base's): only the base's newer changelog was read from Kafka and replayed.
    CAUGHT_UP = "caught-up"
    #: Read from Kafka (snapshot, then the changelog tail).
    RESTORED = "restored"
    #: No checkpoint yet: empty.
    FRESH = "fresh"


@dataclass(frozen=True)
class SubtaskPlacement:
    """One subtask of an operator at a parallelism: whose state a task works on."""

    application: str
    operator_id: str
    subtask: int
    parallelism: int
    #: Key groups in all (fixed for the life of the application).
    max_parallelism: int

    @property
    def key_groups(self) -> KeyGroupRange:
        """The subtask's key-group range (Flink's assignment of ranges to subtasks)."""
        return key_group_range_for_operator(self.max_parallelism, self.parallelism,
                                            self.subtask)


@dataclass
class CachedBackend:
    """A backend a process keeps between a subtask's tasks."""

    backend: ChangelogKeyedStateBackend
    #: The checkpoint it is exactly at.
    checkpoint_id: int
    #: For a host-local store: the token of the manifest it wrote ("" in memory).
    owner: str = ""
    #: For a host-local store: its table, closed until a task reopens it.
    table: HostStoreTable | None = None


__all__ = ["CachedBackend", "StateSource", "SubtaskPlacement"]
