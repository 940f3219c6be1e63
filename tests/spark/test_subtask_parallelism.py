"""Every subtask of a micro-batch gets a Spark partition of its own (so they run in parallel)."""

from __future__ import annotations

import uuid
from typing import Any

import pandas as pd
import pytest
from pyspark.storagelevel import StorageLevel

from examples.clickstream import OUTPUT_SCHEMA, expected_state, update_user
from examples.events import events
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.subtask_partitioning import (
    SLOT_COLUMN,
    partition_by_subtask,
    placement_possible,
    subtask_markers,
    subtask_placement,
)

pytestmark = [pytest.mark.spark]


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_partition_i_holds_exactly_subtask_i(spark: Any, parallelism: int) -> None:
    from pyspark.sql import functions as F

    df = spark.range(200).select((F.col("id") % parallelism).cast("int").alias("subtask"))
    parted = partition_by_subtask(df, "subtask", parallelism)
    assert parted.rdd.getNumPartitions() == parallelism
    rows = parted.select("subtask", F.spark_partition_id().alias("partition")).collect()
    assert len(rows) == 200
    assert {(r["subtask"], r["partition"]) for r in rows} == {
        (i, i) for i in range(parallelism)}


@pytest.mark.parametrize("parallelism", [1, 3])
def test_with_a_placement_partition_i_holds_subtask_i_and_its_two_markers(
        spark: Any, parallelism: int) -> None:
    from pyspark.sql import functions as F

    assert placement_possible(spark)
    placement = subtask_placement(spark, "subtask", "marker", parallelism)
    try:
        df = spark.range(60).select((F.col("id") % parallelism).cast("int").alias("subtask"))
        parted = partition_by_subtask(df, "subtask", parallelism, placement)
        # Added partition by partition, not appended: still one partition per subtask.
        assert parted.rdd.getNumPartitions() == parallelism
        # (A projection without the slot column would lose the partitioning.)
        rows = parted.select("subtask", "marker", SLOT_COLUMN,
                             F.spark_partition_id().alias("p")).collect()
        assert sorted((r["p"], r["subtask"], bool(r["marker"])) for r in rows) == sorted(
            [(i % parallelism, i % parallelism, False) for i in range(60)]
            + [(i, i, True) for i in range(parallelism)] * 2)
    finally:
        placement.unpersist()


@pytest.mark.parametrize("parallelism", [1, 3, 5])
def test_the_placements_plan_does_not_follow_the_cores(spark: Any, parallelism: int) -> None:
    # The session has 2 cores; a cluster that loses or gains a host has another count.
    # A plan that followed it would miss the cached placement and move every subtask.
    assert spark.sparkContext.defaultParallelism == 2
    markers = subtask_markers(spark, "subtask", "marker", parallelism)
    assert markers.rdd.getNumPartitions() == parallelism
    placement = subtask_placement(spark, "subtask", "marker", parallelism)
    try:
        assert subtask_placement(spark, "subtask", "marker", parallelism).storageLevel == (
            placement.storageLevel) != StorageLevel.NONE
    finally:
        placement.unpersist()


def test_settings_that_lose_a_unions_partitioning_rule_the_placement_out(spark: Any) -> None:
    spark.conf.set("spark.sql.unionOutputPartitioning", "false")
    try:
        assert not placement_possible(spark)
    finally:
        spark.conf.unset("spark.sql.unionOutputPartitioning")
    assert placement_possible(spark)


@pytest.mark.broker
def test_stateful_batches_run_one_partition_per_subtask(spark: Any, kafka_cluster: Any) -> None:
    prefix = f"par-{uuid.uuid4().hex[:8]}"
    config = StreamingStateConfig(
        application=prefix, operator_id="user-sessions",
        bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=3,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=4,
        materialization_interval_s=None)
    outputs: dict[int, pd.DataFrame] = {}

    def capture(frame: Any, batch_id: int) -> None:
        outputs[batch_id] = frame.toPandas()

    all_events = list(events(600, 30))
    with stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                sink=capture, order_by=["seq"]) as processor:
        for batch_id, chunk in enumerate([all_events[:350], all_events[350:]]):
            processor(spark.createDataFrame(pd.DataFrame(chunk)), batch_id)
    assert [r.subtask_partitions for r in processor.reports] == [{0: 0, 1: 1, 2: 2}] * 2
    assert [r.restored_from for r in processor.reports] == [None, 1]
    # Users of the second batch: their totals cover both batches.
    want = expected_state(iter(all_events))
    got = {row.user: (row.events, row.spent) for row in outputs[1].itertuples()}
    assert got == {u: (want[u]["events"], want[u]["spent"])
                   for u in {e["user"] for e in all_events[350:]}}


@pytest.mark.broker
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_rescaling_beyond_the_changelog_partitions_keeps_state_exact(
    spark: Any, kafka_cluster: Any, backend: str, tmp_path: Any
) -> None:
    """A changelog topic of 2 partitions, parallelism 2 -> 5 -> 3: more subtasks than
    partitions write and restore through shared partitions; every batch's totals cover
    every event before it."""
    prefix = f"beyond-{uuid.uuid4().hex[:8]}"
    all_events = list(events(900, 40))
    chunks = [all_events[i:i + 150] for i in range(0, 900, 150)]
    outputs: dict[int, pd.DataFrame] = {}
    batch_id = 0
    for parallelism, count in [(2, 2), (5, 2), (3, 2)]:
        config = StreamingStateConfig(
            application=prefix, operator_id="user-sessions",
            bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=parallelism,
            changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
            checkpoint_topic=f"{prefix}-checkpoints", partitions=2,
            materialization_interval_s=0.0 if parallelism == 5 else None,
            state_backend=backend, local_state_dir=str(tmp_path))
        with stateful_foreach_batch(
                config, update_user, "user", OUTPUT_SCHEMA, order_by=["seq"],
                sink=lambda frame, b: outputs.__setitem__(b, frame.toPandas())) as processor:
            for _ in range(count):
                processor(spark.createDataFrame(pd.DataFrame(chunks[batch_id])), batch_id)
                batch_id += 1
        assert [len(r.subtask_partitions) for r in processor.reports] == [parallelism] * count
    for b, chunk in enumerate(chunks):
        want = expected_state(iter(all_events[:150 * (b + 1)]))
        got = {row.user: (row.events, row.spent) for row in outputs[b].itertuples()}
        assert got == {u: (want[u]["events"], want[u]["spent"])
                       for u in {e["user"] for e in chunk}}, f"batch {b}"
