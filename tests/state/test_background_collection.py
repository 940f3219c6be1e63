"""Garbage collection off the batch's path (``collect_in_background``): a commit returns
once its checkpoint is durable; the collection runs in a thread of the coordinator, one at
a time, and a commit during one is collected by the next round."""

from __future__ import annotations

import threading
import time

from kafka_changelog.memory import InMemoryChangelogStorage
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .state_helpers import MAX_P


class SlowDiscards(InMemoryCheckpointStore):
    """Discards wait until :attr:`go` is set (at most 10 s)."""

    def __init__(self) -> None:
        super().__init__(retain=2)
        self.go = threading.Event()
        self.discarding = threading.Event()

    def discard(self, application: str, checkpoint_id: int) -> None:
        self.discarding.set()
        self.go.wait(10)
        super().discard(application, checkpoint_id)


def coordinator(store: InMemoryCheckpointStore, background: bool) -> CheckpointCoordinator:
    return CheckpointCoordinator("app", store, InMemorySnapshotStore(),
                                 InMemoryChangelogStorage(), MAX_P,
                                 collect_in_background=background)


def test_a_commit_returns_before_its_collection_and_a_later_round_collects_the_rest() -> None:
    store = SlowDiscards()
    gc = coordinator(store, background=True)
    for checkpoint_id in (1, 2, 3):  # 3 subsumes 1: its collection waits in discard
        gc.complete(checkpoint_id, [])
    assert store.discarding.wait(10)
    started = time.monotonic()
    gc.complete(4, [])  # subsumes 1 (not yet discarded) and 2: left to the next round
    assert time.monotonic() - started < 5, "the commit waited for the collection"
    assert not gc.wait_for_collection(0.1)
    assert store.checkpoint_ids("app") == [1, 2, 3, 4]
    store.go.set()
    assert gc.wait_for_collection(10)
    assert store.checkpoint_ids("app") == [3, 4]
    assert gc.last_garbage.error is None
    assert gc.last_garbage.discarded_checkpoints == [2]


def test_by_default_a_commit_collects_before_it_returns() -> None:
    store = InMemoryCheckpointStore(retain=2)
    gc = coordinator(store, background=False)
    for checkpoint_id in (1, 2, 3, 4):
        gc.complete(checkpoint_id, [])
        assert store.checkpoint_ids("app") == list(range(max(1, checkpoint_id - 1),
                                                         checkpoint_id + 1))
    assert gc.last_garbage.discarded_checkpoints == [2]
    assert gc.wait_for_collection(0)
