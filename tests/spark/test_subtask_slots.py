"""Slots: the ints whose Spark hash partition is their subtask."""

from __future__ import annotations

import pytest

from kafka_changelog.murmur3 import spark_hash_int
from spark_integration.streaming.subtask_partitioning import subtask_slots


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4, 7, 16, 128])
def test_each_slot_hashes_to_its_subtask_and_is_the_smallest(parallelism: int) -> None:
    slots = subtask_slots(parallelism)
    assert len(slots) == parallelism
    for subtask, slot in enumerate(slots):
        assert spark_hash_int(slot) % parallelism == subtask
        assert all(spark_hash_int(s) % parallelism != subtask for s in range(slot))


def test_parallelism_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="parallelism must be at least 1, got 0"):
        subtask_slots(0)
