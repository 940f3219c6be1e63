"""Rescalable operator state: the seed FLIP's Kafka source example."""

from __future__ import annotations

import pytest

from kafka_changelog.state.backend.operator_state import OperatorStateBackend, redistribute
from kafka_changelog.state.checkpoints.checkpoint import OperatorStateHandle
from kafka_changelog.state.schema.serializers import JSON

OFFSETS = "partition-offsets"
ASSIGNMENT = "all-partitions"


def source_subtasks() -> list[OperatorStateHandle]:
    """Two source subtasks reading Kafka partitions KP1..KP4, two each, with offsets."""
    handles = []
    for index, partitions in enumerate([("KP1", "KP2"), ("KP3", "KP4")]):
        backend = OperatorStateBackend("kafka-source", index)
        offsets = backend.list_state(OFFSETS, JSON)
        for n, partition in enumerate(partitions):
            offsets.add({"partition": partition, "offset": 100 * (index + 1) + n})
        backend.union_list_state(ASSIGNMENT, JSON).add({"owner": index, "of": list(partitions)})
        handles.append(backend.snapshot())
    return handles


def restored_offsets(handles: list[OperatorStateHandle]) -> list[list[str]]:
    return [
        [e["partition"] for e in OperatorStateBackend("kafka-source", h.subtask_index, h)
         .list_state(OFFSETS, JSON).get()]
        for h in handles
    ]


@pytest.mark.parametrize(("parallelism", "expected"), [
    (1, [["KP1", "KP2", "KP3", "KP4"]]),
    (2, [["KP1", "KP2"], ["KP3", "KP4"]]),
    (4, [["KP1"], ["KP2"], ["KP3"], ["KP4"]]),
    (3, [["KP1"], ["KP2"], ["KP3", "KP4"]]),
])
def test_list_state_is_split_and_merged_none_lost_none_doubled(
    parallelism: int, expected: list[list[str]]
) -> None:
    new = redistribute(source_subtasks(), parallelism)
    assert [h.subtask_index for h in new] == list(range(parallelism))
    assert restored_offsets(new) == expected
    offsets = [e for h in new for e in OperatorStateBackend("kafka-source", 0, h)
               .list_state(OFFSETS, JSON).get()]
    assert sorted((e["partition"], e["offset"]) for e in offsets) == [
        ("KP1", 100), ("KP2", 101), ("KP3", 200), ("KP4", 201)]


@pytest.mark.parametrize("parallelism", [1, 4])
def test_union_state_gives_every_subtask_everything(parallelism: int) -> None:
    for handle in redistribute(source_subtasks(), parallelism):
        union = OperatorStateBackend("kafka-source", handle.subtask_index, handle) \
            .union_list_state(ASSIGNMENT, JSON).get()
        assert union == [{"owner": 0, "of": ["KP1", "KP2"]}, {"owner": 1, "of": ["KP3", "KP4"]}]


def test_scale_up_then_down_round_trips() -> None:
    four = redistribute(source_subtasks(), 4)
    back = redistribute(four, 2)
    assert restored_offsets(back) == [["KP1", "KP2"], ["KP3", "KP4"]]


def test_a_name_is_either_list_or_union() -> None:
    backend = OperatorStateBackend("op", 0)
    backend.list_state("s")
    with pytest.raises(ValueError, match="already registered as list state"):
        backend.union_list_state("s")


def test_the_coordinator_restores_nothing_as_empty_operator_state() -> None:
    from kafka_changelog import InMemoryChangelogStorage
    from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
    from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
    from kafka_changelog.state.history.coordinator import CheckpointCoordinator
    from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

    with InMemoryChangelogStorage() as storage:
        coordinator = CheckpointCoordinator("app", InMemoryCheckpointStore(),
                                            InMemorySnapshotStore(), storage)
        empty = coordinator.restore_operator_state("kafka-source", 1, 2, None)
        assert (empty.subtask_index, empty.list_state(OFFSETS, JSON).get()) == (1, [])
        # A checkpoint with only keyed (here: no) state for the operator restores empty too.
        keyed_only = coordinator.complete(1, [SubtaskState("kafka-source", 0, 1, None, None)])
        restored = coordinator.restore_operator_state("kafka-source", 0, 3, keyed_only)
        assert restored.union_list_state(ASSIGNMENT, JSON).get() == []


def test_a_checkpoint_is_restored_only_with_the_max_parallelism_it_was_written_with() -> None:
    from kafka_changelog import InMemoryChangelogStorage, key_group_for_key
    from kafka_changelog.keygroups import KeyGroupRange
    from kafka_changelog.state import INT64, MaxParallelismMismatchError, value_state
    from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
    from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
    from kafka_changelog.state.history.coordinator import CheckpointCoordinator
    from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

    count = value_state("count", INT64)
    checkpoints, snapshots = InMemoryCheckpointStore(), InMemorySnapshotStore()
    with InMemoryChangelogStorage() as storage:
        written = CheckpointCoordinator("app", checkpoints, snapshots, storage, 128)
        backend = written.restore_keyed("op", KeyGroupRange.of(0, 127), None)
        backend.set_current_key(b"user-1")
        backend.state(count).update(7)
        checkpoint = written.complete(
            1, [SubtaskState("op", 0, 1, backend.snapshot(1).result(), None)])
        backend.close()

        for other in (64, 256):
            coordinator = CheckpointCoordinator("app", checkpoints, snapshots, storage, other)
            with pytest.raises(MaxParallelismMismatchError) as caught:
                coordinator.restore_keyed("op", KeyGroupRange.of(0, other - 1), checkpoint)
            assert str(caught.value) == (
                f"application 'app': checkpoint 1 was written with max parallelism 128, not "
                f"{other}: keys would move to other key groups and lose their state. Keep "
                "max_parallelism=128 (any parallelism up to it restores the checkpoint), or "
                "start a new application.")
        key_group = key_group_for_key(b"user-1", 128)
        restored = written.restore_keyed("op", KeyGroupRange.of(key_group, key_group),
                                         checkpoint)
        restored.set_current_key(b"user-1")
        assert restored.state(count).value() == 7
        restored.close()
