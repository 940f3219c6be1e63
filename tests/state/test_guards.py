"""Changelog guards (an application's offsets before its first checkpoint) end: at the
first commit, after their lifetime, and a process writes one, not one per batch."""

from __future__ import annotations

import time

import pytest

from kafka_changelog.gc_types import LogFloor
from kafka_changelog.memory import InMemoryChangelogStorage
from kafka_changelog.state.checkpoints import checkpoint_store as store_module
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

FLOOR = LogFloor("changelog", 0, 42)


def test_a_guard_counts_for_its_lifetime_only(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryCheckpointStore(guard_lifetime_s=3600)
    forever = InMemoryCheckpointStore(guard_lifetime_s=None)
    now = time.time()
    monkeypatch.setattr(store_module.time, "time", lambda: now)
    store.guard("abandoned", [FLOOR])
    forever.guard("abandoned", [FLOOR])
    monkeypatch.setattr(store_module.time, "time", lambda: now + 3599)
    assert store.log_floors() == [FLOOR]
    monkeypatch.setattr(store_module.time, "time", lambda: now + 3601)
    assert store.log_floors() == []  # no longer pins the shared changelog
    assert forever.log_floors() == [FLOOR]
    assert [g.guard_id for g in store.guards("abandoned")]  # still listed (for reset)


@pytest.mark.parametrize("lifetime", [0, -1.0])
def test_a_guard_lifetime_that_is_not_positive_is_refused(lifetime: float) -> None:
    with pytest.raises(ValueError, match=f"guard_lifetime_s must be None or positive, got "
                                         f"{lifetime}"):
        InMemoryCheckpointStore(guard_lifetime_s=lifetime)


class FloorsStorage(InMemoryChangelogStorage):
    """The in-memory storage, with the offsets a Kafka storage would tell."""

    def uncommitted_floors(self) -> list[LogFloor]:
        return [FLOOR]


def test_a_coordinator_guards_once_until_its_first_commit() -> None:
    checkpoints = InMemoryCheckpointStore()
    coordinator = CheckpointCoordinator("app", checkpoints, InMemorySnapshotStore(),
                                        FloorsStorage())
    for _ in range(5):  # five batches before the first commit
        coordinator.guard_first_writes()
    assert len(checkpoints.guards("app")) == 1
