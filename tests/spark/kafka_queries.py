"""Stateful clickstream queries over Spark's Kafka source, shared by the tests of input
offsets and of rewind: produce events, run a query to the end of its input, read the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from examples.clickstream import EVENT_SCHEMA, EVENTS, OUTPUT_SCHEMA, SPENT, update_user
from kafka_changelog import key_group_range_for_operator
from spark_integration.streaming import BatchReport, StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.kafka_sink import KafkaOutputSink
from spark_integration.streaming.worker_resources import WorkerResources

#: Records per micro-batch (``maxOffsetsPerTrigger``).
BATCH_ROWS = 20


def produce(settings: dict[str, Any], topic: str, rows: list[dict[str, Any]],
            partitions: int = 2) -> None:
    """``rows`` to ``topic``, spread evenly by ``seq`` over its partitions (so that each
    micro-batch of ``BATCH_ROWS`` records takes as many from each)."""
    producer = Producer(settings)
    for row in rows:
        producer.produce(topic, key=row["user"].encode(), value=json.dumps(row).encode(),
                         partition=row["seq"] % partitions)
    assert producer.flush(30) == 0


def run_kafka(spark: Any, config: StreamingStateConfig, input_topic: str, output_topic: str,
              location: Path, start: str = "earliest", kafka_columns: bool = False
              ) -> tuple[list[BatchReport], Any]:
    """Process ``input_topic`` from ``start`` in batches of ``BATCH_ROWS`` and stop; the
    reports and the query's exception (None: it finished)."""
    from pyspark.sql import functions as F

    processor = stateful_foreach_batch(
        config, update_user, "user", OUTPUT_SCHEMA,
        sink=KafkaOutputSink(output_topic, key_column="user"), order_by=["seq"])
    kept = ["topic", "partition", "offset"] if kafka_columns else []
    rows = (spark.readStream.format("kafka").options(**config.spark_kafka_options())
            .option("subscribe", input_topic).option("startingOffsets", start)
            .option("maxOffsetsPerTrigger", BATCH_ROWS).load()
            .select(*kept, F.from_json(F.col("value").cast("string"),
                                       f"user string, {EVENT_SCHEMA}").alias("e"))
            .select(*kept, "e.*"))
    return run_to_end(rows, processor, location)


def run_to_end(rows: Any, processor: Any, location: Path) -> tuple[list[BatchReport], Any]:
    query = (rows.writeStream.foreachBatch(processor)
             .option("checkpointLocation", str(location))
             .trigger(availableNow=True).start())
    try:
        try:
            query.awaitTermination(300)
        except Exception as exc:  # the query failed (raised again by awaitTermination)
            return processor.reports, exc
        return processor.reports, query.exception()
    finally:
        query.stop()
        processor.close()


def state_of(config: StreamingStateConfig, users: list[str]) -> dict[str, tuple[Any, Any]]:
    """Every user's (events, spent) at the application's latest checkpoint."""
    coordinator = WorkerResources.coordinator(config)
    backend = coordinator.restore_keyed("user-sessions", key_group_range_for_operator(128, 1, 0),
                                        coordinator.checkpoint(), config.changelog())
    try:
        found = {}
        for user in users:
            backend.set_current_key(user.encode())
            found[user] = (backend.state(EVENTS).value(), backend.state(SPENT).get())
        return found
    finally:
        backend.close()
