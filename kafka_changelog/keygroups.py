"""Key groups: the unit of state redistribution, and their assignment to operators.

State is partitioned into ``max_parallelism`` key groups. A key always maps to the
same key group, in every process and in Spark SQL (``pmod(hash(key), max_parallelism)``),
and an operator instance owns a contiguous, inclusive range of key groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .murmur3 import spark_hash_bytes, spark_hash_many

#: Highest max parallelism accepted (Flink's bound too: key groups fit in 15 bits).
UPPER_BOUND_MAX_PARALLELISM = 1 << 15


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups; ``end == start - 1`` is empty."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"key-group range start must be >= 0, got {self.start}")
        if self.end < self.start - 1:
            raise ValueError(f"key-group range end {self.end} is below start {self.start} - 1")

    @classmethod
    def of(cls, start: int, end: int) -> KeyGroupRange:
        """The inclusive range [start, end]."""
        return cls(start, end)

    @classmethod
    def empty(cls) -> KeyGroupRange:
        """The canonical empty range."""
        return cls(0, -1)

    @property
    def is_empty(self) -> bool:
        """True when the range holds no key group."""
        return self.end < self.start

    def contains(self, key_group: int) -> bool:
        """True when ``key_group`` lies in the range."""
        return self.start <= key_group <= self.end

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.contains(key_group)

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (the empty range when they do not overlap)."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __str__(self) -> str:
        return "[]" if self.is_empty else f"[{self.start}, {self.end}]"


def check_parallelism(max_parallelism: int, parallelism: int | None = None) -> None:
    """Raise ``ValueError`` naming the bad value unless the parallelisms are usable."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(
            f"max parallelism must be in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {max_parallelism}"
        )
    if parallelism is not None and not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in [1, max parallelism {max_parallelism}], got {parallelism}"
        )


def key_group_for_key(key: bytes, max_parallelism: int) -> int:
    """The key group of ``key``: ``pmod(murmur3_spark(key, seed=42), max_parallelism)``.

    Identical in every Python process (unlike ``hash()``) and equal to Spark SQL's
    ``pmod(hash(key), max_parallelism)`` for a binary or string column, so
    DataFrames can be partitioned by key group without a Python UDF.
    """
    check_parallelism(max_parallelism)
    return spark_hash_bytes(key) % max_parallelism


def key_groups_for_keys(offsets: np.ndarray, data: np.ndarray, max_parallelism: int
                        ) -> np.ndarray:
    """:func:`key_group_for_key` of many keys at once (``int64``): key ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``, as an Arrow binary array lays its values out."""
    check_parallelism(max_parallelism)
    return np.mod(spark_hash_many(offsets, data).astype(np.int64), max_parallelism)


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """The key groups owned by operator instance ``operator_index`` of ``parallelism``.

    Instance i owns ``[ceil(i * maxP / p), ceil((i + 1) * maxP / p) - 1]``: contiguous,
    disjoint, covering all key groups, sizes differing by at most one.
    """
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= operator_index < parallelism:
        raise ValueError(
            f"operator index must be in [0, {parallelism}), got {operator_index}"
        )
    start = -(-operator_index * max_parallelism // parallelism)
    end = -(-(operator_index + 1) * max_parallelism // parallelism) - 1
    return KeyGroupRange(start, end)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The operator instance that owns ``key_group`` (inverse of the range formula)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group must be in [0, {max_parallelism}), got {key_group}")
    return key_group * parallelism // max_parallelism


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
