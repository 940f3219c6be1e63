"""Exactly once whatever the checkpointLocation: the state's checkpoint owns its input
offsets (spark_integration/streaming/input_check.py).

Each test runs an application over Spark's Kafka source (or the file source), then a
query that does not continue the state's input exactly: a second deployment, a fresh
checkpointLocation, the old one after a rewind, one copied from another query, a topic
created again. Each is refused before anything is written, or continues exactly once:
the state and the ``read_committed`` outputs equal a model that applied every event once.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from examples.clickstream import (
    EVENT_SCHEMA,
    OUTPUT_SCHEMA,
    ensure_topic,
    expected_state,
    read_outputs,
    update_user,
)
from examples.events import events
from kafka_changelog.state.checkpoints.input_progress import SOURCE_FILES_PROPERTY, SOURCES_PROPERTY
from kafka_changelog.state.checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from kafka_changelog.state.history.rewind import execute_rewind, plan_rewind
from spark_integration import starting_offsets
from spark_integration.streaming import BatchReport, StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.kafka_sink import KafkaOutputSink
from spark_integration.streaming.worker_resources import WorkerResources

from ..cli.cli_helpers import cli
from .file_batches import write_batches
from .kafka_queries import BATCH_ROWS, produce, run_kafka, run_to_end, state_of

pytestmark = [pytest.mark.broker, pytest.mark.spark]

def app_config(kafka_cluster: Any, prefix: str, **overrides: Any) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="user-sessions",
        bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=2,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=2,
        materialization_interval_s=None, **overrides)


def run_files(spark: Any, config: StreamingStateConfig, output_topic: str, directory: Path,
              location: Path) -> tuple[list[BatchReport], Any]:
    """Process the files of ``directory`` (one per batch) and stop."""
    processor = stateful_foreach_batch(
        config, update_user, "user", OUTPUT_SCHEMA,
        sink=KafkaOutputSink(output_topic, key_column="user"), order_by=["seq"])
    rows = (spark.readStream.schema(f"user string, {EVENT_SCHEMA}")
            .option("maxFilesPerTrigger", 1).json(str(directory)))
    return run_to_end(rows, processor, location)


def checkpoint_ids(config: StreamingStateConfig) -> list[int]:
    return WorkerResources.coordinator(config).checkpoints.checkpoint_ids(config.application)


def assert_exactly_once(config: StreamingStateConfig, settings: dict[str, Any],
                        output_topic: str, applied: list[dict[str, Any]]) -> None:
    """The state and the committed outputs are a model's that applied ``applied`` once."""
    expected = expected_state(iter(applied))
    users = sorted(expected)
    assert state_of(config, users) == {u: (s["events"], s["spent"])
                                       for u, s in expected.items()}
    # Every batch's outputs once, and each user's last totals the model's (batches whose
    # rows were all dropped commit checkpoints without outputs: ids may leave gaps).
    outputs = read_outputs(settings, output_topic)
    pairs = [(checkpoint, user) for checkpoint, user, _, _ in outputs]
    assert len(pairs) == len(set(pairs))
    last = {user: (count, spent) for _, user, count, spent in sorted(outputs)}
    assert last == {u: (s["events"], s["spent"]) for u, s in expected.items()}


def refused(error: Any, *parts: str) -> None:
    """The query failed with ``InputOffsetsError`` whose message has every one of
    ``parts``."""
    assert error is not None, "the query was not refused"
    text = str(error)
    assert "InputOffsetsError" in text, text
    for part in parts:
        assert part in text, f"{part!r} not in {text}"


def an_application(kafka_cluster: Any, name: str, partitions: int) -> Any:
    """A new application's config, client settings, input and output topics (``partitions``
    each); released when the test ends."""
    prefix = f"{name}-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    config = app_config(kafka_cluster, prefix)
    ensure_topic(settings, f"{prefix}-in", partitions=partitions)
    ensure_topic(settings, f"{prefix}-out", partitions=partitions)
    yield config, settings, f"{prefix}-in", f"{prefix}-out"
    WorkerResources.release(config)


@pytest.fixture
def app(spark: Any, kafka_cluster: Any) -> Any:
    yield from an_application(kafka_cluster, "in", partitions=2)


@pytest.fixture
def one_partition_app(spark: Any, kafka_cluster: Any) -> Any:
    """Like ``app``, over one-partition input and output topics (offsets = event order)."""
    yield from an_application(kafka_cluster, "in1", partitions=1)


def test_a_second_deployment_is_refused_and_continues_from_the_states_offsets(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(3 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:2 * BATCH_ROWS])
    first, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    assert [r.checkpoint_id for r in first] == [1, 2]
    held = starting_offsets(config)
    assert sum(json.loads(held)[input_topic].values()) == 2 * BATCH_ROWS

    # Another deployment with its own checkpointLocation, reading from the beginning.
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "b")
    refused(error, f"application '{config.application}': batch 0 of Spark query",
            "would apply input again that the state (checkpoint 2) already holds: source "
            f"KafkaV2[Subscribe[{input_topic}]]: topic {input_topic} partition 0: the batch "
            "starts at 0, the state holds up to "
            f"{json.loads(held)[input_topic]['0']}",
            "a second deployment of the application, a fresh or copied checkpointLocation",
            "Nothing was written", f"(here: {held})", "skip_applied_input=True")
    assert not reports and checkpoint_ids(config) == [1, 2]

    # The one-call fix: a fresh checkpointLocation starting at the state's offsets.
    produce(settings, input_topic, all_events[2 * BATCH_ROWS:])
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "c",
                               start=starting_offsets(config, topics=[input_topic]))
    assert error is None, error
    assert [(r.checkpoint_id, r.kind) for r in reports] == [(3, "new-query")]
    assert_exactly_once(config, settings, output_topic, all_events)
    latest = WorkerResources.coordinator(config).checkpoint()
    assert latest is not None
    recorded = json.loads(latest.properties[SOURCE_OFFSETS_PROPERTY])
    assert sorted(recorded[input_topic]) == ["0", "1"]
    assert sum(recorded[input_topic].values()) == 3 * BATCH_ROWS
    assert json.loads(latest.properties[SOURCES_PROPERTY]) == [
        f"KafkaV2[Subscribe[{input_topic}]]"]


def test_a_fresh_checkpoint_location_with_skip_applied_input_continues_by_itself(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(3 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:2 * BATCH_ROWS])
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error

    produce(settings, input_topic, all_events[2 * BATCH_ROWS:])
    skipping = app_config_like(config, skip_applied_input=True)
    # Without the Kafka columns the rows cannot be told apart: refused, naming them.
    _, error = run_kafka(spark, skipping, input_topic, output_topic, tmp_path / "b")
    refused(error, "skip_applied_input drops the Kafka rows the state already holds by "
            "their topic, partition, offset columns, but the batch's rows have no column(s) "
            "['topic', 'partition', 'offset']")
    assert checkpoint_ids(config) == [1, 2]
    # A fresh location read from the earliest offsets: the rows the state holds dropped.
    reports, error = run_kafka(spark, skipping, input_topic, output_topic, tmp_path / "c",
                               kafka_columns=True)
    assert error is None, error
    assert [r.checkpoint_id for r in reports] == [3, 4, 5]
    assert_exactly_once(config, settings, output_topic, all_events)


def app_config_like(config: StreamingStateConfig, **changes: Any) -> StreamingStateConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


def test_the_old_location_after_a_rewind_is_refused_at_any_later_time(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(4 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:2 * BATCH_ROWS])
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "old")
    assert error is None, error
    coordinator = WorkerResources.coordinator(config)
    store = coordinator.checkpoints
    execute_rewind(store, plan_rewind(store, config.application, 1), lambda chunks: None)
    # The new query continues from the rewound state, and commits once.
    produce(settings, input_topic, all_events[2 * BATCH_ROWS:3 * BATCH_ROWS])
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "new",
                               start=starting_offsets(config))
    assert error is None, error
    assert [r.checkpoint_id for r in reports] == [5, 6]
    expected = expected_state(iter(all_events[:3 * BATCH_ROWS]))
    assert state_of(config, sorted(expected)) == {u: (s["events"], s["spent"])
                                                  for u, s in expected.items()}
    before = checkpoint_ids(config)
    # Later, the old checkpointLocation is started again (it goes on after checkpoint
    # 2's input): no longer the latest checkpoint's query, it is still refused.
    produce(settings, input_topic, all_events[3 * BATCH_ROWS:])
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "old")
    refused(error, "batch 2 of Spark query", "(checkpoint 6)",
            "That checkpoint was committed by another query")
    assert not reports and checkpoint_ids(config) == before


def test_a_location_copied_from_another_query_is_refused(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(3 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:BATCH_ROWS])
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    # Batch 1 of the query reads the half batch there is.
    produce(settings, input_topic, all_events[BATCH_ROWS:3 * BATCH_ROWS // 2])
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    assert checkpoint_ids(config) == [1, 2]
    produce(settings, input_topic, all_events[3 * BATCH_ROWS // 2:])
    # The copy is the same query, one batch behind: its batch 1 has the id of the one that
    # committed checkpoint 2, but Spark plans it anew over more input (a full batch).
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "copy")
    refused(error, "batch 1 of Spark query", "runs again the batch that committed "
            f"checkpoint 2, but not over the same input: topic {input_topic} partition 0: "
            "this run reads up to 20, the committed batch read up to 15",
            "Nothing was written")
    assert checkpoint_ids(config) == [1, 2]
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    assert [r.checkpoint_id for r in reports] == [3, 4]
    assert_exactly_once(config, settings, output_topic, all_events)


def test_a_gap_is_refused_unless_allowed(
    spark: Any, one_partition_app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = one_partition_app
    all_events = list(events(2 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:BATCH_ROWS], partitions=1)
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    produce(settings, input_topic, all_events[BATCH_ROWS:], partitions=1)
    later = json.dumps({input_topic: {"0": BATCH_ROWS + 5}})
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "b",
                         start=later)
    refused(error, "would skip input the state (checkpoint 1) never saw: source "
            f"KafkaV2[Subscribe[{input_topic}]]: topic {input_topic} partition 0: the "
            f"batch starts at {BATCH_ROWS + 5}, the state holds up to {BATCH_ROWS}",
            "allow_input_gaps=True")
    assert checkpoint_ids(config) == [1]
    allowing = app_config_like(config, allow_input_gaps=True)
    reports, error = run_kafka(spark, allowing, input_topic, output_topic,
                               tmp_path / "c", start=later)
    assert error is None, error
    assert [r.checkpoint_id for r in reports] == [2]
    applied = all_events[:BATCH_ROWS] + all_events[BATCH_ROWS + 5:]
    assert_exactly_once(config, settings, output_topic, applied)


def test_a_topic_created_again_is_refused_until_its_offsets_are_forgotten(
    spark: Any, one_partition_app: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = one_partition_app
    all_events = list(events(2 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:BATCH_ROWS], partitions=1)
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "a")
    assert error is None, error
    admin = AdminClient(settings)
    admin.delete_topics([input_topic])[input_topic].result()
    _recreate(settings, input_topic)
    produce(settings, input_topic, all_events[BATCH_ROWS:], partitions=1)
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "b")
    refused(error, f"topic {input_topic} partition 0: the batch starts at 0, the state "
            f"holds up to {BATCH_ROWS}", f"kafka-changelog input-offsets "
            f"{config.application} --forget {input_topic} --yes")
    topics = ["-b", kafka_cluster.bootstrap_servers,
              "--checkpoint-topic", config.checkpoint_topic]
    shown = cli(*topics, "input-offsets", config.application)
    assert shown.returncode == 0, shown.stderr
    assert f'{{"{input_topic}":{{"0":{BATCH_ROWS}}}}}' in shown.stdout
    forgotten = cli(*topics, "input-offsets", config.application, "--forget",
                    input_topic, "--yes")
    assert forgotten.returncode == 0, forgotten.stderr
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "c")
    assert error is None, error
    assert [r.checkpoint_id for r in reports] == [4]
    assert_exactly_once(config, settings, output_topic, all_events)


def _recreate(settings: dict[str, Any], topic: str) -> None:
    """Create ``topic`` again once its deletion is through."""
    import time

    deadline = time.monotonic() + 60
    while True:
        try:
            ensure_topic(settings, topic, partitions=1)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_file_source_refuses_files_the_state_holds(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"files-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    config = app_config(kafka_cluster, prefix)
    output_topic = f"{prefix}-out"
    ensure_topic(settings, output_topic, partitions=1)
    all_events = list(events(90, 6))
    chunks = [all_events[:30], all_events[30:60], all_events[60:]]
    try:
        write_batches(tmp_path / "in", chunks[:2])
        reports, error = run_files(spark, config, output_topic, tmp_path / "in",
                                   tmp_path / "a")
        assert error is None, error
        assert [r.checkpoint_id for r in reports] == [1, 2]
        latest = WorkerResources.coordinator(config).checkpoint()
        assert latest is not None
        marks = json.loads(latest.properties[SOURCE_FILES_PROPERTY])
        assert [Path(f).name for mark in marks.values() for f in mark["files"]] == [
            "part-001.json"]
        third = tmp_path / "in" / "part-002.json"  # a third file arrives
        third.write_text("".join(json.dumps(row) + "\n" for row in chunks[2]))
        # A fresh checkpointLocation over the same directory starts at its first file.
        reports, error = run_files(spark, config, output_topic, tmp_path / "in",
                                   tmp_path / "b")
        refused(error, "would apply files again that the state (checkpoint 2) already "
                "holds:", "part-000.json", "skip_applied_input=True) to drop the rows of the "
                "files the state holds, or give this query only the files that came after")
        assert not reports and checkpoint_ids(config) == [1, 2]
        # With skip_applied_input, a fresh location drops the files the state holds.
        skipping = app_config_like(config, skip_applied_input=True)
        reports, error = run_files(spark, skipping, output_topic, tmp_path / "in",
                                   tmp_path / "c")
        assert error is None, error
        assert [(r.checkpoint_id, r.rows_out) for r in reports] == [
            (3, 0), (4, 0), (5, len({e["user"] for e in chunks[2]}))]
        assert_exactly_once(config, settings, output_topic, all_events)
        # The location that committed checkpoints 1 and 2 would now read the third file
        # again: the state (committed by the new query) holds it.
        reports, error = run_files(spark, config, output_topic, tmp_path / "in",
                                   tmp_path / "a")
        refused(error, "would apply files again that the state (checkpoint 5) already "
                "holds:", "part-002.json")
        assert not reports and checkpoint_ids(config)[-1] == 5
    finally:
        WorkerResources.release(config)
