"""One Spark partition per subtask, so that subtasks run in parallel.

``groupBy(subtask)`` hash-partitions over ``spark.sql.shuffle.partitions`` and lets
adaptive execution coalesce partitions: subtasks 0 and 1 of parallelism 2 both land
in partition 1 (``pmod(hash(0), 2) == pmod(hash(1), 2)``), so one worker runs every
subtask. Instead each row gets a *slot*: a small int chosen so that Spark's hash
partitioning sends it to the partition numbered like its subtask. A
``repartition(parallelism, slot)`` (a shuffle of explicit size, which adaptive
execution never coalesces) then gives partition ``i`` exactly subtask ``i``'s rows.

Where a subtask's task runs: Spark gives the task of a shuffled partition to any free
executor, so a subtask would move between hosts from batch to batch, away from its
host-local store. A *placement* keeps it: a cached DataFrame with one marker row per
subtask, partitioned the same way (:func:`subtask_placement`). The batch's rows are a
union of the placement (twice) and the repartitioned rows; Spark unions children of the
same hash partitioning partition by partition (a narrow dependency on each), and such a
partition prefers the host most of its parents' partitions prefer: the host that caches
the placement's partition ``i``, which is where subtask ``i``'s task first ran. Spark's
delay scheduling (``spark.locality.wait``) then runs the task there whenever that host
frees a core in time. A lost executor loses its cached partitions, and the next batch
places those subtasks anew. When executors join (a host back, a worker added), the
driver drops the placement (:func:`executor_ids`), so that the next batch spreads the
subtasks over every executor again. Plain DataFrame operations: the same in classic
Spark and under Spark Connect (where the driver sees no executors, and joins are not
noticed).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from kafka_changelog.murmur3 import spark_hash_int

from ..sessions.connect import is_connect
from ..sessions.spark_versions import SparkFeature, supports

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


def _slotted(df: Any, subtask_column: str, parallelism: int,
             partition_of: Sequence[int] | None = None) -> Any:
    """``df`` repartitioned by subtask, keeping the slot column (its partitioning); the
    rows of subtask ``s`` in partition ``partition_of[s]`` (default ``s``)."""
    from pyspark.sql import functions as F

    slots_by_partition = subtask_slots(parallelism)
    order = partition_of if partition_of is not None else range(parallelism)
    slots = F.array(*[F.lit(slots_by_partition[partition]) for partition in order])
    # element_at is 1-based and fails on an index out of range (ANSI), as it should.
    slot = F.element_at(slots, F.col(subtask_column) + 1)
    return df.withColumn(SLOT_COLUMN, slot).repartition(parallelism, SLOT_COLUMN)


#: Spark settings under which a union keeps its children's partitioning, with the values
#: it needs (and their defaults): otherwise a placement cannot be used.
PLACEMENT_SETTINGS = {"spark.sql.unionOutputPartitioning": "true",
                      "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "false"}


def placement_possible(spark: Any) -> bool:
    """Whether ``spark``'s release and settings let a union keep its children's
    partitioning (see :data:`PLACEMENT_SETTINGS`; PySpark 4.0 has no such union)."""
    if not supports(SparkFeature.SUBTASK_PLACEMENT):
        return False
    return all(str(spark.conf.get(key, default)).lower() == default
               for key, default in PLACEMENT_SETTINGS.items())


def executor_ids(spark: Any) -> frozenset[str] | None:
    """The executors ``spark``'s scheduler knows (empty in local mode; None where the
    session has no SparkContext: Spark Connect).

    Identities, not a count: executor ids are never reused, so an executor that joined
    is seen even when another left at the same time (a host back while another is lost:
    a count stays the same). The scheduler's list, not the block managers': it runs
    tasks on an executor as soon as it registers, before its block manager does."""
    if is_connect(spark):
        return None
    try:
        known = spark.sparkContext._jsc.sc().getExecutorIds()
        return frozenset(str(known.apply(i)) for i in range(int(known.size())))
    except (AttributeError, NotImplementedError):  # Connect's NotImplementedError
        return None


def subtask_markers(spark: Any, subtask_column: str, marker_column: str,
                    parallelism: int) -> Any:
    """One row per subtask: ``subtask_column`` and ``marker_column`` (true), in
    ``parallelism`` input partitions whatever the cores of the cluster: the plan (and
    with it the cached placement it is found by) must not change when hosts leave or join
    (``spark.range(n)`` splits by the cores registered at the call)."""
    from pyspark.sql import functions as F

    return spark.range(0, parallelism, 1, parallelism).select(
        F.col("id").cast("int").alias(subtask_column), F.lit(True).alias(marker_column))


#: How long each marker task of a placement waits on a cluster (paid when a placement is
#: computed: the first batch, hosts joining or lost).
MARKER_WAIT_MS = 300


def _on_cluster(spark: Any) -> bool:
    """Whether ``spark`` runs on a cluster (not ``local[...]``; the same for the whole
    application, so the placement's plan never changes with it)."""
    try:
        return not str(spark.sparkContext.master).startswith("local")
    except Exception:  # Spark Connect: no SparkContext; the server's tasks go as they go
        return False


def subtask_placement(spark: Any, subtask_column: str, marker_column: str,
                      parallelism: int) -> Any:
    """The placement of ``parallelism`` subtasks (module docstring): the
    :func:`subtask_markers`, partitioned like :func:`partition_by_subtask`'s rows, cached
    (by the first call: a later call, of any session of the application, gets the same
    cached partitions). ``unpersist()`` it when the subtasks change. Only where
    :func:`placement_possible`."""
    from pyspark.storagelevel import StorageLevel

    markers = subtask_markers(spark, subtask_column, marker_column, parallelism)
    if _on_cluster(spark):
        # Each cached partition's task runs where its marker's task ran (its shuffle input
        # is all there), so the markers' tasks must take an executor each: a task done at
        # once lets its executor take the next marker before an idle one is offered it
        # (seen: a host left without a subtask). Waiting a moment, they start together.
        markers = markers.where(
            f"reflect('java.lang.Thread', 'sleep', CAST({MARKER_WAIT_MS} AS BIGINT)) IS NULL")
    placement = _slotted(markers, subtask_column, parallelism)
    # The same rows make the same plan: cached once, found again by later batches.
    if placement.storageLevel == StorageLevel.NONE:
        placement = placement.cache()
    return placement


def partition_by_subtask(df: Any, subtask_column: str, parallelism: int,
                         placement: Any = None,
                         partition_of: Sequence[int] | None = None) -> Any:
    """``df`` in ``parallelism`` partitions, partition ``partition_of[i]`` (default
    ``i``: a permutation) holding the rows whose ``subtask_column`` is ``i`` (values
    outside ``0..parallelism-1`` are an error).

    ``placement``: a :func:`subtask_placement` of the same parallelism, whose rows (two
    per subtask) are added to their subtask's partition, and which keeps each partition's
    task on the host where it ran before (module docstring). The rows then keep
    :data:`SLOT_COLUMN`: the partitioning refers to it, and a plan that drops it before
    the partitions are used loses the partitioning (the union would append the
    placement's partitions instead of adding them partition by partition)."""
    slotted = _slotted(df, subtask_column, parallelism, partition_of)
    if placement is None:
        return slotted.drop(SLOT_COLUMN)
    # Twice: the placement's host then outvotes any host the shuffled rows prefer.
    return slotted.unionByName(placement, allowMissingColumns=True).unionByName(
        placement, allowMissingColumns=True)
