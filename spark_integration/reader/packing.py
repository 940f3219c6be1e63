"""Mode ``changes``: offset slices packed into as many input partitions as Spark has cores.

Each Spark task of a Python data source costs tens of milliseconds whatever it reads
(a worker round trip, a Kafka consumer, its first fetch), so one task per slice made
a checkpoint of many small ranges cost more in tasks than in reading. The slices are
packed into ``k`` groups of about equal bytes (the handles record each range's
bytes), ``k`` a multiple of the minimum number of partitions (the session's
parallelism by default) so that every core gets the same share, and large enough
that no group holds much more than :data:`MAX_PARTITION_BYTES`. A group never
holds two slices of one changelog partition whose offsets overlap, and reads its
slices ordered by (topic, partition, start offset): rows of one changelog partition
still come in offset order within an input partition. Pure Python, no pyspark.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .planning import ChangesTask

#: Bytes an input partition should not exceed much (Spark's maxPartitionBytes).
MAX_PARTITION_BYTES = 128 << 20

#: What opening a slice is worth in bytes: small slices still spread over groups.
OPEN_COST_BYTES = 1 << 20


@dataclass(frozen=True)
class ChangesGroup:
    """Slices one Spark task reads one after another (in this order)."""

    tasks: tuple[ChangesTask, ...]

    @property
    def estimated_bytes(self) -> int:
        return sum(t.estimated_bytes for t in self.tasks)


def _order(task: ChangesTask) -> tuple[str, int, int, str]:
    s = task.slice
    return s.topic, s.partition, s.start_offset, s.log_id


def _overlaps(group: list[ChangesTask], task: ChangesTask) -> bool:
    s = task.slice
    return any(o.slice.topic == s.topic and o.slice.partition == s.partition
               and o.slice.start_offset < s.end_offset and s.start_offset < o.slice.end_offset
               for o in group)


def pack_changes(tasks: Sequence[ChangesTask], min_partitions: int,
                 max_bytes: int = MAX_PARTITION_BYTES,
                 open_cost: int = OPEN_COST_BYTES) -> list[ChangesGroup]:
    """``tasks`` in groups of about equal cost (bytes plus ``open_cost`` each): a
    multiple of ``min_partitions`` groups (fewer only with fewer tasks), each at most
    about ``max_bytes``; largest first onto the least loaded group (deterministic)."""
    if min_partitions < 1:
        raise ValueError(f"min_partitions must be >= 1, got {min_partitions}")
    if not tasks:
        return []
    costs = [t.estimated_bytes + open_cost for t in tasks]
    rounds = max(1, math.ceil(sum(costs) / (min_partitions * max_bytes)))
    count = min(len(tasks), min_partitions * rounds)
    groups: list[list[ChangesTask]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(tasks)), key=lambda i: (-costs[i], _order(tasks[i]))):
        task = tasks[index]
        free = [g for g in range(len(groups)) if not _overlaps(groups[g], task)]
        if not free:  # overlaps everywhere: a group of its own
            groups.append([])
            loads.append(0)
            free = [len(groups) - 1]
        target = min(free, key=lambda g: (loads[g], g))
        groups[target].append(task)
        loads[target] += costs[index]
    return [ChangesGroup(tuple(sorted(g, key=_order))) for g in groups if g]


__all__ = ["MAX_PARTITION_BYTES", "OPEN_COST_BYTES", "ChangesGroup", "pack_changes"]
