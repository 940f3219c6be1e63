"""The fork's rules without Kafka: what NEW's checkpoint holds, the refusals, an interrupted
fork finished, a fork whose source was subsumed meanwhile, and two applications sharing
chunks through garbage collection (in-memory stores)."""

from __future__ import annotations

import re

import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.gc_types import LogFloor
from kafka_changelog.memory import InMemoryChangelogStorage
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.history.fork import (
    FORK_APPLICATION,
    FORK_CHECKPOINT,
    ForkError,
    ForkOutcome,
    ForkRequest,
    check_source_retained,
    fork_origin,
    plan_fork,
)
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .state_helpers import COUNT, MAX_P

WHERE = "cps"
RANGE = KeyGroupRange(0, MAX_P - 1)
USERS = [f"user-{i}".encode() for i in range(12)]


def no_offsets(topics: frozenset[str]) -> dict[str, dict[int, int]]:
    return {}


class App:
    """One application on shared in-memory stores: one subtask with every key group."""

    def __init__(self, name: str, checkpoints: InMemoryCheckpointStore,
                 snapshots: InMemorySnapshotStore, storage: InMemoryChangelogStorage) -> None:
        self.coordinator = CheckpointCoordinator(name, checkpoints, snapshots, storage, MAX_P)
        self.model: dict[bytes, int] = {}

    def batch(self, checkpoint_id: int, updates: dict[bytes, int]) -> CompletedCheckpoint:
        """Restore the latest checkpoint, materialize what changed since, update, commit."""
        latest = self.coordinator.checkpoint()
        backend = self.coordinator.restore_keyed("op", RANGE, latest)
        try:
            backend.materialize_now()
            for user, value in updates.items():
                backend.set_current_key(user)
                backend.state(COUNT).update(value)
                self.model[user] = value
            handle = backend.snapshot(checkpoint_id).result(10)
            checkpoint = self.coordinator.complete(
                checkpoint_id, [SubtaskState("op", 0, 1, handle, None)], 1000 + checkpoint_id,
                properties={"spark.batch_id": str(checkpoint_id)})
            backend.notify_checkpoint_complete(checkpoint_id)
            return checkpoint
        finally:
            backend.close()

    def state(self) -> dict[bytes, int]:
        """The latest checkpoint restored from the stores."""
        backend = self.coordinator.restore_keyed("op", RANGE, self.coordinator.checkpoint())
        try:
            found = {}
            for user in USERS:
                backend.set_current_key(user)
                value = backend.state(COUNT).value()
                if value is not None:
                    found[user] = value
            return found
        finally:
            backend.close()


def fork_now(checkpoints: InMemoryCheckpointStore, request: ForkRequest) -> CompletedCheckpoint:
    """The fork's steps on an in-memory store (the CLI writes the same records)."""
    plan = plan_fork(checkpoints, request, WHERE,
                     lambda topics: {"log": {0: 70, 1: 30}})
    for record in plan.checkpoint_records:
        checkpoints.apply_record(record.key, record.value, "test")
    check_source_retained(checkpoints, plan)
    for record in plan.pointer_records:
        checkpoints.apply_record(record.key, record.value, "test")
    return plan.forked


def test_forks_share_chunks_and_each_restores_exactly_through_both_gcs() -> None:
    checkpoints = InMemoryCheckpointStore(retain=2)
    snapshots, storage = InMemorySnapshotStore(), InMemoryChangelogStorage()
    blue = App("blue", checkpoints, snapshots, storage)
    blue.batch(1, {u: 1 for u in USERS})
    source = blue.batch(2, {USERS[0]: 2})  # names checkpoint 1's materialization
    forked = fork_now(checkpoints, ForkRequest("blue", "green"))
    assert forked.application == "green" and forked.checkpoint_id == 2
    assert fork_origin(forked) == ("blue", 2)
    assert forked.properties == {"spark.batch_id": "2", FORK_APPLICATION: "blue",
                                 FORK_CHECKPOINT: "2"}
    (mine,), (theirs,) = (s.keyed for s in forked.subtasks), (s.keyed for s in source.subtasks)
    assert mine is not None and theirs is not None
    assert (mine.snapshot, mine.changelog, mine.materialization_id) == (
        theirs.snapshot, theirs.changelog, theirs.materialization_id)
    assert re.fullmatch(r"op-[0-9a-f]{12}", mine.backend_id)
    assert mine.backend_id != theirs.backend_id
    green = App("green", checkpoints, snapshots, storage)
    green.model = dict(blue.model)
    # Both continue, interleaved; retention 2 subsumes the forked checkpoint on both sides.
    for checkpoint_id in (3, 4, 5):
        blue.batch(checkpoint_id, {USERS[1]: 10 * checkpoint_id})
        green.batch(checkpoint_id, {USERS[2]: 100 * checkpoint_id})
        assert blue.coordinator.last_garbage.error is None
        assert green.coordinator.last_garbage.error is None
    assert green.coordinator.last_garbage.discarded_checkpoints == [3]
    # Green's own backend wrote every key group whole at its first materialization: none
    # of its chunks is under blue's backend id, and none of its snapshots reuses blue's.
    latest_green = checkpoints.latest("green")
    assert latest_green is not None
    (green_handle,) = (s.keyed for s in latest_green.subtasks)
    assert green_handle is not None and green_handle.snapshot is not None
    assert green_handle.snapshot.backend_id == mine.backend_id
    assert blue.state() == blue.model and green.state() == green.model
    assert blue.model != green.model


def test_refusals_name_what_is_wrong() -> None:
    checkpoints = InMemoryCheckpointStore(retain=2)
    blue = App("blue", checkpoints, InMemorySnapshotStore(), InMemoryChangelogStorage())
    for checkpoint_id in (1, 2, 3):
        blue.batch(checkpoint_id, {USERS[0]: checkpoint_id})
    checkpoints.guard("pending", [LogFloor("log", 0, 5)])

    def refused(request: ForkRequest) -> str:
        with pytest.raises(ForkError) as error:
            plan_fork(checkpoints, request, WHERE, no_offsets)
        return str(error.value)

    assert refused(ForkRequest("blue", "blue")) == (
        "cannot fork application 'blue' onto itself: name a new application to fork it to")
    assert refused(ForkRequest("nobody", "new")) == (
        "application 'nobody' is unknown in checkpoint topic cps; applications there: blue, "
        "pending")
    assert refused(ForkRequest("pending", "new")) == (
        "application 'pending' has no completed checkpoint in checkpoint topic cps yet: "
        "there is no state to fork")
    # Checkpoint 1 is still stored (retain 3 would keep it), but blue keeps 2.
    assert refused(ForkRequest("blue", "new", 1, retain=2)) == (
        "checkpoint 1 of application 'blue' is not retained (retained, with retain=2: 2, "
        "3): its data may be garbage collected already; fork from a retained checkpoint")
    assert refused(ForkRequest("blue", "pending")) == (
        "application 'pending' exists already in checkpoint topic cps (1 changelog "
        "guard(s)): a fork starts a new application; choose another name, or delete it "
        "first with 'kafka-changelog reset pending --yes'")
    with pytest.raises(ForkError, match="retain must be at least 2"):
        ForkRequest("blue", "new", retain=1)
    # A fork that ran: NEW exists.
    fork_now(checkpoints, ForkRequest("blue", "green"))
    assert refused(ForkRequest("blue", "green", 2)) == (
        "application 'green' exists already in checkpoint topic cps (checkpoints 3): a "
        "fork starts a new application; choose another name, or delete it first with "
        "'kafka-changelog reset green --yes'")


def test_an_interrupted_fork_is_finished_by_the_next_run_and_a_complete_one_is_left() -> None:
    checkpoints = InMemoryCheckpointStore(retain=2)
    blue = App("blue", checkpoints, InMemorySnapshotStore(), InMemoryChangelogStorage())
    blue.batch(1, {USERS[0]: 1})
    blue.batch(2, {USERS[0]: 2})
    first = plan_fork(checkpoints, ForkRequest("blue", "green"), WHERE, no_offsets)
    for record in first.checkpoint_records:  # then the process died
        checkpoints.apply_record(record.key, record.value, "test")
    assert not checkpoints.has_pointer("green")
    again = plan_fork(checkpoints, ForkRequest("blue", "green"), WHERE, no_offsets)
    assert again.outcome is ForkOutcome.COMPLETED and again.forked == first.forked
    assert [r.key for r in again.pointer_records] == [b"green/latest"]
    for record in again.pointer_records:
        checkpoints.apply_record(record.key, record.value, "test")
    done = plan_fork(checkpoints, ForkRequest("blue", "green"), WHERE, no_offsets)
    assert done.outcome is ForkOutcome.ALREADY_FORKED
    assert done.checkpoint_records == [] and done.pointer_records == []


def test_a_source_subsumed_while_forking_undoes_the_fork() -> None:
    checkpoints = InMemoryCheckpointStore(retain=2)
    blue = App("blue", checkpoints, InMemorySnapshotStore(), InMemoryChangelogStorage())
    blue.batch(1, {USERS[0]: 1})
    blue.batch(2, {USERS[0]: 2})
    plan = plan_fork(checkpoints, ForkRequest("blue", "green", 1), WHERE, no_offsets)
    blue.batch(3, {USERS[0]: 3})  # commits and subsumes checkpoint 1 meanwhile
    with pytest.raises(ForkError) as error:
        check_source_retained(checkpoints, plan)
    assert str(error.value) == (
        "checkpoint 1 of application 'blue' was subsumed while it was forked to 'green' "
        "(retained now: 2, 3): its data may be garbage collected, so the fork was undone; "
        "fork again from a retained checkpoint")
    assert [r.key for r in plan.undo_records] == [
        b"green/latest", b"green/checkpoint/00000000000000000001"]
    assert all(r.value is None for r in plan.undo_records)


def test_log_floors_are_the_end_offsets_lowered_to_the_sources() -> None:
    checkpoints = InMemoryCheckpointStore()
    source = CompletedCheckpoint("blue", 7, 1, MAX_P, (), (LogFloor("log", 0, 50),
                                                           LogFloor("log", 1, 40)))
    checkpoints.commit(source)
    forked = fork_now(checkpoints, ForkRequest("blue", "green"))
    assert forked.log_floors == (LogFloor("log", 0, 50), LogFloor("log", 1, 30))
