"""Spark's own Kafka connector (``format("kafka")``) around the stateful layer.

Our output topic is written in Kafka transactions (each batch's outputs with its
checkpoint). A second streaming query that consumes it with ``format("kafka")`` and
``kafka.isolation.level=read_committed`` sees every batch's outputs exactly once:
not those of an aborted transaction (as a driver killed while committing leaves),
not twice for a batch Spark ran again. Spark's default, ``read_uncommitted``, would
return the aborted ones too.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import Producer

from examples.clickstream import (
    OUTPUT_SCHEMA,
    ensure_topic,
    expected_state,
    output_problems,
    outputs_with_spark,
    read_committed,
    read_outputs,
    update_user,
)
from examples.events import events
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.kafka_sink import CHECKPOINT_HEADER, KafkaOutputSink

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_a_second_query_reads_each_batch_once_with_read_committed(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"conn-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    servers = kafka_cluster.bootstrap_servers
    output_topic = f"{prefix}-totals"
    ensure_topic(settings, output_topic, partitions=3)
    config = StreamingStateConfig(
        application=prefix, operator_id="user-sessions", bootstrap_servers=servers,
        parallelism=2, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)
    all_events = list(events(300, 12))
    chunks = [all_events[:100], all_events[100:200], all_events[100:200], all_events[200:]]
    with stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                sink=KafkaOutputSink(output_topic, key_column="user"),
                                order_by=["seq"]) as processor:
        # Batch 1 twice: Spark running a committed batch again after a crash.
        for batch_id, chunk in zip([0, 1, 1, 2], chunks, strict=True):
            processor(spark.createDataFrame(pd.DataFrame(chunk)), batch_id)
    assert [(r.batch_id, r.checkpoint_id, r.committed) for r in processor.reports] == [
        (0, 1, True), (1, 2, True), (1, 2, False), (2, 3, True)]
    # A transaction a crashed committer left behind, aborted by its successor.
    ghost = Producer({**settings, "transactional.id": f"{prefix}-ghost"})
    ghost.init_transactions(30)
    ghost.begin_transaction()
    for user in ("ghost-1", "ghost-2"):
        ghost.produce(output_topic, key=user.encode(),
                      value=b'{"user":"%s","events":1,"spent":0.0}' % user.encode(),
                      headers=[(CHECKPOINT_HEADER, b"99")])
    ghost.flush(30)
    ghost.abort_transaction(30)

    seen: list[tuple[Any, ...]] = []
    query = (outputs_with_spark(spark, config.spark_kafka_options(), output_topic,
                                streaming=True)
             .writeStream.foreachBatch(lambda df, _: seen.extend(tuple(r) for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "consumer"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the consuming query did not finish"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()

    committed = read_outputs(settings, output_topic)
    assert sorted(seen) == sorted(committed)
    assert output_problems(seen, expected_state(iter(all_events))) == []
    assert sorted({checkpoint for checkpoint, *_ in seen}) == [1, 2, 3]
    # Per batch, the users of that batch once each.
    for checkpoint, chunk in zip([1, 2, 3], [chunks[0], chunks[1], chunks[3]], strict=True):
        assert sorted(user for c, user, *_ in seen if c == checkpoint) == sorted(
            {e["user"] for e in chunk})
    uncommitted = [tuple(r) for r in outputs_with_spark(
        spark, config.spark_kafka_options(), output_topic, committed=False).collect()]
    assert sorted(uncommitted) == sorted(
        [*committed, (99, "ghost-1", 1, 0.0), (99, "ghost-2", 1, 0.0)])


def test_a_timestamp_output_column_reaches_the_topic_in_utc(
    spark: Any, kafka_cluster: Any
) -> None:
    """Outputs are cast to the output schema with Spark's Arrow schema in UTC (PySpark 4.2
    refused a timestamp column without a time zone: the task failed)."""
    import datetime as dt

    prefix = f"ts-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    output_topic = f"{prefix}-last-seen"
    ensure_topic(settings, output_topic, partitions=1)
    config = StreamingStateConfig(
        application=prefix, operator_id="last-seen",
        bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=2,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=2, materialization_interval_s=None)

    def last_seen(key: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
        return [{"user": key, "seen": rows["ts"].max().to_pydatetime()}]

    at = dt.datetime(2026, 11, 29, 7, 30, tzinfo=dt.timezone.utc)
    rows = [("a", at), ("a", at - dt.timedelta(minutes=5)), ("b", at + dt.timedelta(seconds=1))]
    with stateful_foreach_batch(config, last_seen, "user", "user string, seen timestamp",
                                sink=KafkaOutputSink(output_topic, key_column="user")
                                ) as processor:
        processor(spark.createDataFrame(rows, "user string, ts timestamp"), 0)
    assert [r.rows_out for r in processor.reports] == [2]
    values = sorted((v for _, v in read_committed(settings, output_topic)),
                    key=lambda value: value["user"])
    assert values == [{"user": "a", "seen": "2026-11-29 07:30:00+00:00"},
                      {"user": "b", "seen": "2026-11-29 07:30:01+00:00"}]

