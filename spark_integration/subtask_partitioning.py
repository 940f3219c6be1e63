"""One Spark partition per subtask, so that subtasks run in parallel.

``groupBy(subtask)`` hash-partitions over ``spark.sql.shuffle.partitions`` and lets
adaptive execution coalesce partitions: subtasks 0 and 1 of parallelism 2 both land
in partition 1 (``pmod(hash(0), 2) == pmod(hash(1), 2)``), so one worker runs every
subtask. Instead each row gets a *slot*: a small int chosen so that Spark's hash
partitioning sends it to the partition numbered like its subtask. A
``repartition(parallelism, slot)`` (a shuffle of explicit size, which adaptive
execution never coalesces) then gives partition ``i`` exactly subtask ``i``'s rows.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kafka_changelog.murmur3 import spark_hash_int

SLOT_COLUMN = "__kc_slot"


@lru_cache(maxsize=64)
def subtask_slots(parallelism: int) -> tuple[int, ...]:
    """For subtask ``i``, the smallest int ``s >= 0`` with ``pmod(hash(s), parallelism) == i``.

    ``hash`` is Spark SQL's (Murmur3, seed 42), which is what ``repartition(n, col)``
    partitions an ``int`` column by.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, got {parallelism}")
    slots: list[int | None] = [None] * parallelism
    missing, candidate = parallelism, 0
    while missing:
        partition = spark_hash_int(candidate) % parallelism
        if slots[partition] is None:
            slots[partition] = candidate
            missing -= 1
        candidate += 1
    return tuple(s for s in slots if s is not None)


def partition_by_subtask(df: Any, subtask_column: str, parallelism: int) -> Any:
    """``df`` in ``parallelism`` partitions, partition ``i`` holding the rows whose
    ``subtask_column`` is ``i`` (values outside ``0..parallelism-1`` are an error)."""
    from pyspark.sql import functions as F

    slots = F.array(*[F.lit(s) for s in subtask_slots(parallelism)])
    # element_at is 1-based and fails on an index out of range (ANSI), as it should.
    slot = F.element_at(slots, F.col(subtask_column) + 1)
    return df.withColumn(SLOT_COLUMN, slot).repartition(parallelism, SLOT_COLUMN).drop(
        SLOT_COLUMN)
