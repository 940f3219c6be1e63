"""A fresh Spark checkpointLocation for an existing application (a redeploy, a cleared
directory): Spark starts batch ids at 0 again, and the state must carry over from the
application's latest checkpoint, with every batch committed and its outputs written
exactly once (never taken for a re-run of an old batch and dropped)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import (
    EVENT_SCHEMA,
    EVENTS,
    OUTPUT_SCHEMA,
    SPENT,
    ensure_topic,
    expected_state,
    output_problems,
    read_outputs,
    update_user,
)
from examples.events import events
from kafka_changelog import key_group_range_for_operator
from kafka_changelog.keys import KeyTypeError
from kafka_changelog.state import MaxParallelismMismatchError
from spark_integration.streaming import (
    BatchReport,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.kafka_sink import KafkaOutputSink
from spark_integration.streaming.worker_resources import WorkerResources

from .file_batches import write_batches

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def run_query(spark: Any, config: StreamingStateConfig, output_topic: str, input_dir: Path,
              checkpoint_location: Path, sink: Any = None) -> list[BatchReport]:
    """Process every file of ``input_dir`` (one file per batch) and stop (outputs to
    ``output_topic``, or to ``sink``)."""
    processor = stateful_foreach_batch(
        config, update_user, "user", OUTPUT_SCHEMA,
        sink=sink or KafkaOutputSink(output_topic, key_column="user"), order_by=["seq"])
    query = (spark.readStream.schema(f"user string, {EVENT_SCHEMA}")
             .option("maxFilesPerTrigger", 1).json(str(input_dir))
             .writeStream.foreachBatch(processor)
             .option("checkpointLocation", str(checkpoint_location))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        processor.close()
    return processor.reports


def app_config(kafka_cluster: Any, prefix: str) -> StreamingStateConfig:
    """An application of its own topics, named ``prefix``."""
    return StreamingStateConfig(
        application=prefix, operator_id="user-sessions",
        bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=2,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=4,
        materialization_interval_s=None)


def test_a_fresh_checkpoint_location_continues_the_application(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"loc-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    output_topic = f"{prefix}-totals"
    ensure_topic(kafka_cluster.client_config(), output_topic)
    all_events = list(events(150, 12))
    write_batches(tmp_path / "in-1", [all_events[:50], all_events[50:100]])
    write_batches(tmp_path / "in-2", [all_events[100:]])

    first = run_query(spark, config, output_topic, tmp_path / "in-1", tmp_path / "chk-1")
    assert [(r.batch_id, r.checkpoint_id, r.committed) for r in first] == [(0, 1, True),
                                                                        (1, 2, True)]
    # The same application redeployed with a new checkpointLocation reading new input.
    second = run_query(spark, config, output_topic, tmp_path / "in-2", tmp_path / "chk-2")
    assert [(r.batch_id, r.checkpoint_id, r.restored_from, r.committed, r.kind)
            for r in second] == [(0, 3, 2, True, "new-query")]
    assert second[0].query_id and second[0].query_id != first[0].query_id

    expected = expected_state(iter(all_events))
    coordinator = WorkerResources.coordinator(config)
    backend = coordinator.restore_keyed("user-sessions", key_group_range_for_operator(128, 1, 0),
                                        coordinator.checkpoint(), config.changelog())
    try:
        for user, want in expected.items():
            backend.set_current_key(user.encode())
            assert (backend.state(EVENTS).value(), backend.state(SPENT).get()) == (
                want["events"], want["spent"]), user
    finally:
        backend.close()
        WorkerResources.release(config)
    outputs = read_outputs(kafka_cluster.client_config(), output_topic)
    assert output_problems(outputs, expected) == []
    assert sorted({checkpoint for checkpoint, *_ in outputs}) == [1, 2, 3]


def test_a_sink_function_is_given_checkpoint_ids_unique_across_checkpoint_locations(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    """Spark's batch ids start at 0 again with a new checkpointLocation; the checkpoint id
    a sink function asks for does not, so the sink can be idempotent per checkpoint."""
    config = app_config(kafka_cluster, f"sinkid-{uuid.uuid4().hex[:8]}")
    all_events = list(events(150, 12))
    write_batches(tmp_path / "in-1", [all_events[:50], all_events[50:100]])
    write_batches(tmp_path / "in-2", [all_events[100:]])
    given: list[tuple[int, int, int]] = []

    def sink(outputs: Any, batch_id: int, checkpoint_id: int) -> None:
        given.append((batch_id, checkpoint_id, outputs.count()))

    run_query(spark, config, "", tmp_path / "in-1", tmp_path / "chk-1", sink=sink)
    run_query(spark, config, "", tmp_path / "in-2", tmp_path / "chk-2", sink=sink)
    WorkerResources.release(config)
    users = [len({e["user"] for e in chunk})
             for chunk in (all_events[:50], all_events[50:100], all_events[100:])]
    assert given == [(0, 1, users[0]), (1, 2, users[1]), (0, 3, users[2])]


def one_committed_batch(spark: Any, kafka_cluster: Any, tmp_path: Path, prefix: str
                        ) -> tuple[StreamingStateConfig, str, list[dict[str, Any]]]:
    """An application with one committed checkpoint (string keys, max parallelism 128)."""
    config = app_config(kafka_cluster, prefix)
    output_topic = f"{prefix}-totals"
    ensure_topic(kafka_cluster.client_config(), output_topic)
    all_events = list(events(100, 12))
    write_batches(tmp_path / "in", [all_events])
    run_query(spark, config, output_topic, tmp_path / "in", tmp_path / "chk")
    return config, output_topic, all_events


def refused(spark: Any, config: StreamingStateConfig, output_topic: str, batch: Any,
            error: type[Exception], message: str) -> None:
    """A batch of ``config`` fails with ``error`` before any task and commits nothing."""
    with stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                sink=KafkaOutputSink(output_topic, key_column="user"),
                                order_by=["seq"]) as processor:
        with pytest.raises(error) as caught:
            processor(batch, 0)
        assert message in str(caught.value)
    assert not processor.reports
    coordinator = WorkerResources.coordinator(config)
    try:
        assert coordinator.checkpoints.checkpoint_ids(config.application) == [1]
    finally:
        WorkerResources.release(config)


def test_a_changed_max_parallelism_is_refused_before_any_task_runs(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"maxp-{uuid.uuid4().hex[:8]}"
    config, output_topic, all_events = one_committed_batch(spark, kafka_cluster, tmp_path,
                                                           prefix)
    refused(spark, dataclasses.replace(config, max_parallelism=256), output_topic,
            spark.createDataFrame(all_events[:10]), MaxParallelismMismatchError,
            f"application '{prefix}': checkpoint 1 was written with max parallelism 128, "
            "not 256: keys would move")


def test_a_key_column_of_another_type_is_refused_before_any_task_runs(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"ktype-{uuid.uuid4().hex[:8]}"
    config, output_topic, all_events = one_committed_batch(spark, kafka_cluster, tmp_path,
                                                           prefix)
    numbered = [{**e, "user": int(e["user"].removeprefix("user-"))} for e in all_events[:10]]
    refused(spark, config, output_topic, spark.createDataFrame(numbered), KeyTypeError,
            f"application '{prefix}': the key column(s) are of type(s) ['bigint'], but "
            "checkpoint 1 was written with ['string']")
