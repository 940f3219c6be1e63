"""Key groups to topic partitions, in contiguous blocks."""

from __future__ import annotations

from ..keygroups import KeyGroupRange


def partition_for_key_group(key_group: int, partitions: int, max_parallelism: int) -> int:
    """``key_group * partitions // max_parallelism``: contiguous blocks of key groups.

    Neighbouring key groups share a partition, so a writer (which owns a
    contiguous key-group range) touches few partitions, and a rescaled writer
    reads mostly the partitions its predecessors wrote.
    """
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group must be in [0, {max_parallelism}), got {key_group}")
    return key_group * partitions // max_parallelism


def key_groups_of_partition(
    partition: int, partitions: int, max_parallelism: int
) -> KeyGroupRange:
    """The key groups that map to ``partition`` (empty when there are more partitions)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition must be in [0, {partitions}), got {partition}")
    # Smallest kg with kg * P // maxP >= partition is ceil(partition * maxP / P).
    start = -(-partition * max_parallelism // partitions)
    end = -(-(partition + 1) * max_parallelism // partitions) - 1
    return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()
