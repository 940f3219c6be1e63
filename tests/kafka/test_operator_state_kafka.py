"""Operator state (list and union-list) through the coordinator, on real topics.

A source-like operator keeps its partition offsets as list state and per-subtask
watermarks as union-list state, next to keyed state, in the same checkpoints. It
runs at parallelism 2, is restored at 3 (by a coordinator that reads the
checkpoint back from the checkpoint topic), checkpoints again and is restored at 1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore
from kafka_changelog.state.backend.operator_state import OperatorStateBackend
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.schema.serializers import JSON
from tests.kafka.test_state_kafka import USERS, Job
from tests.state.state_helpers import (
    MAX_P,
    apply_event,
    expected_for,
    model_apply,
    ranges,
    read_user,
    users_in,
)

pytestmark = pytest.mark.broker

OP = "source"
OFFSETS = "partition-offsets"
WATERMARKS = "watermarks"


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def fresh_coordinator(job: Job) -> tuple[CheckpointCoordinator, KafkaCheckpointStore]:
    """A coordinator that knows the checkpoints only from the checkpoint topic."""
    store = KafkaCheckpointStore(job.checkpoints.config)
    return CheckpointCoordinator("app", store, job.snapshots, job.storage, MAX_P), store


def offsets_of(backend: OperatorStateBackend) -> list[tuple[str, int]]:
    return [(e["partition"], e["offset"]) for e in backend.list_state(OFFSETS, JSON).get()]


def run(job: Job, coordinator: CheckpointCoordinator, checkpoint: CompletedCheckpoint | None,
        parallelism: int, checkpoint_id: int, model: dict[bytes, Any],
        expected_offsets: list[list[tuple[str, int]]], expected_watermarks: list[Any],
        step: Any) -> CompletedCheckpoint:
    """Restore every subtask (operator and keyed state), check it exactly, let ``step``
    change the operator state, process events, checkpoint."""
    rng = random.Random(checkpoint_id)
    subtasks = []
    for index, key_groups in enumerate(ranges(parallelism)):
        operator = coordinator.restore_operator_state(OP, index, parallelism, checkpoint)
        assert operator.subtask_index == index
        assert offsets_of(operator) == expected_offsets[index]
        assert operator.union_list_state(WATERMARKS, JSON).get() == expected_watermarks
        keyed = coordinator.restore_keyed(OP, key_groups, checkpoint, job.changelog)
        mine = users_in(USERS, key_groups)
        assert {u: read_user(keyed, u) for u in mine} == expected_for(model, mine)
        step(index, operator)
        for _ in range(40):
            user, page, amount = rng.choice(mine), rng.choice(["a", "b"]), rng.choice([2, 13])
            apply_event(keyed, user, page, amount)
            model_apply(model, user, page, amount)
        if index % 2 == 0:
            keyed.materialize_now()
        subtasks.append(SubtaskState(OP, index, parallelism, keyed.snapshot(checkpoint_id)
                                     .result(60), operator.snapshot()))
        keyed.close()
    return coordinator.complete(checkpoint_id, subtasks)


def test_list_and_union_state_rescale_2_to_3_to_1_with_keyed_state(job: Job) -> None:
    model: dict[bytes, Any] = {}
    partitions = [["P0", "P1", "P2"], ["P3", "P4", "P5", "P6"]]

    def first(index: int, operator: OperatorStateBackend) -> None:
        offsets = operator.list_state(OFFSETS, JSON)
        for n, partition in enumerate(partitions[index]):
            offsets.add({"partition": partition, "offset": 100 * (index + 1) + n})
        operator.union_list_state(WATERMARKS, JSON).add({"subtask": index, "wm": 10 * (index + 1)})

    run(job, job.coordinator, None, 2, 1, model, [[], []], [], first)

    # Parallelism 3: the 7 offsets in subtask order, split into contiguous parts of 2, 2, 3;
    # every subtask gets both watermarks, then keeps only its own.
    def second(index: int, operator: OperatorStateBackend) -> None:
        offsets = operator.list_state(OFFSETS, JSON)
        offsets.update([{**e, "offset": e["offset"] + 5} for e in offsets.get()])
        if index == 2:
            offsets.add({"partition": "P7", "offset": 0})  # a newly discovered partition
        operator.union_list_state(WATERMARKS, JSON).update([{"subtask": index,
                                                            "wm": 100 + index}])

    coordinator, store = fresh_coordinator(job)
    try:
        one = coordinator.checkpoint()
        assert one is not None and one.checkpoint_id == 1
        run(job, coordinator, one, 3, 2, model,
            [[("P0", 100), ("P1", 101)], [("P2", 102), ("P3", 200)],
             [("P4", 201), ("P5", 202), ("P6", 203)]],
            [{"subtask": 0, "wm": 10}, {"subtask": 1, "wm": 20}], second)
    finally:
        store.close()

    # Parallelism 1: everything, each element once, in subtask order.
    coordinator, store = fresh_coordinator(job)
    try:
        two = coordinator.checkpoint()
        assert two is not None and two.checkpoint_id == 2
        assert [s.operator.subtask_index for s in two.subtasks_of(OP)
                if s.operator is not None] == [0, 1, 2]
        expected = [("P0", 105), ("P1", 106), ("P2", 107), ("P3", 205), ("P4", 206),
                    ("P5", 207), ("P6", 208), ("P7", 0)]
        run(job, coordinator, two, 1, 3, model, [expected],
            [{"subtask": 0, "wm": 100}, {"subtask": 1, "wm": 101}, {"subtask": 2, "wm": 102}],
            lambda index, operator: None)
        # And back up to 2 from the checkpoint taken at 1: 8 elements split 4 and 4.
        three = coordinator.checkpoint()
        assert three is not None
        split = [coordinator.restore_operator_state(OP, i, 2, three) for i in range(2)]
        assert [offsets_of(b) for b in split] == [expected[:4], expected[4:]]
    finally:
        store.close()
