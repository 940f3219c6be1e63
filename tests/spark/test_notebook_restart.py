"""A notebook habit: stop a running query (``query.stop()`` while batches run), never
close its processor, build a new processor with the same settings and start the query
again on the same checkpointLocation in the same Spark session, then do it once more
with a different parallelism. The state and the outputs must come out exactly once, as
if the query had never stopped; the old processor's cached stores and locks must not
block or corrupt the new one."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import (
    OUTPUT_SCHEMA,
    _processed_offsets,
    ensure_topic,
    expected_state,
    kafka_input,
    output_problems,
    produce_events,
    read_outputs,
    update_user,
)
from examples.events import events
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.kafka_sink import KafkaOutputSink
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import state_of

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 1800
USERS = 40


def start(spark: Any, config: StreamingStateConfig, servers: str, input_topic: str,
          output_topic: str, checkpoint: Path) -> tuple[Any, Any]:
    processor = stateful_foreach_batch(
        config, update_user, "user", OUTPUT_SCHEMA,
        sink=KafkaOutputSink(output_topic, key_column="user"), order_by=["seq"])
    query = (kafka_input(spark, config.spark_kafka_options(), input_topic, max_per_batch=200)
             .writeStream.foreachBatch(processor)
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="200 milliseconds").start())
    return processor, query


def wait_for_batches(query: Any, processor: Any, count: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while processor.batches_run < count:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{processor.batches_run} batches in {timeout_s} s"
        time.sleep(0.1)


def test_stopping_and_restarting_a_query_without_closing_its_processor(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"nb-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    servers = kafka_cluster.bootstrap_servers
    input_topic, output_topic = f"{prefix}-clicks", f"{prefix}-totals"
    produce_events(settings, input_topic, EVENT_COUNT, USERS)
    ensure_topic(settings, output_topic)
    base = dict(application=prefix, operator_id="user-sessions", bootstrap_servers=servers,
                changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
                checkpoint_topic=f"{prefix}-checkpoints", partitions=4,
                materialization_interval_s=1.0)
    checkpoint = tmp_path / "chk"
    processors = []
    try:
        # Stopped twice mid-stream (the second time after a parallelism change), never closed.
        for parallelism in (2, 3):
            processor, query = start(spark, StreamingStateConfig(parallelism=parallelism, **base),
                                     servers, input_topic, output_topic, checkpoint)
            processors.append(processor)
            wait_for_batches(query, processor, 3)
            query.stop()
        config = StreamingStateConfig(parallelism=2, **base)
        processor, query = start(spark, config, servers, input_topic, output_topic, checkpoint)
        processors.append(processor)
        try:
            deadline = time.monotonic() + 300
            while _processed_offsets(query) < EVENT_COUNT:
                assert query.exception() is None, query.exception()
                assert time.monotonic() < deadline, "the restarted query did not catch up"
                time.sleep(0.2)
            query.processAllAvailable()
        finally:
            query.stop()
        # A query stopped between our commit and Spark's runs that batch again first: a
        # re-run, which commits nothing (its outputs and state were committed). Every other
        # batch commits.
        first, *rest = processor.reports
        assert first.committed or first.kind == "rerun", first
        assert all(r.committed for r in rest), [r for r in rest if not r.committed]
    finally:
        for p in processors:
            p.close()

    expected = expected_state(events(EVENT_COUNT, USERS))
    outputs = read_outputs(settings, output_topic)
    assert output_problems(outputs, expected) == []
    try:
        assert state_of(config, sorted(expected)) == expected
    finally:
        WorkerResources.release(config)
