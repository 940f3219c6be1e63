"""``bench_streaming_overhead``'s input-offsets side: what the driver's check of a batch's
input against the state's (docs/exactly-once.md, "Input offsets") costs in a real streaming
query.

A Kafka-sourced query (Spark's connector, ``local[2]``, 8 input partitions,
``maxOffsetsPerTrigger`` of :data:`EVENTS_PER_BATCH` events, ``availableNow``) runs the
clickstream function with state over :data:`BATCHES` micro-batches. Each batch's
``BatchReport.input_check_s`` is the time the driver took to read the batch's input from
the running query (py4j) and compare it with the base checkpoint's; the batch's wall time
(``seconds``) varies from batch to batch by its noise, measured as the median absolute
deviation (MAD) of the batch times after the first (warm-up) batch. The target: the
check's median is within that noise (check median <= batch MAD), i.e. no run could tell
a batch with the check from one without it.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from statistics import median
from typing import Any

from confluent_kafka import Producer

from benchmarks.common import Broker, scaled, unique_topic
from examples.clickstream import EVENT_SCHEMA, OUTPUT_SCHEMA, update_user
from examples.events import events

#: Micro-batches of the query (the first is a warm-up, not measured).
BATCHES = 12
#: Events per micro-batch at BENCH_SCALE=1.
EVENTS_PER_BATCH = 2_000
INPUT_PARTITIONS = 8


def _produce(broker: Broker, topic: str, rows: list[dict[str, Any]]) -> None:
    producer = Producer(dict(broker.client_config))
    for row in rows:
        producer.produce(topic, key=row["user"].encode(), value=json.dumps(row).encode(),
                         partition=row["seq"] % INPUT_PARTITIONS)
    producer.flush(60)


def input_check_case(broker: Broker, spark: Any, config: Any) -> dict[str, Any]:
    """Run the query (``config``: a fresh application) and return the figures."""
    from pyspark.sql import functions as F

    from spark_integration.streaming import stateful_foreach_batch

    per_batch = int(scaled(EVENTS_PER_BATCH, 200))
    topic = broker.create_topic(unique_topic("input-check-in"), INPUT_PARTITIONS)
    _produce(broker, topic, list(events(per_batch * BATCHES, max(100, per_batch // 5))))
    processor = stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                       order_by=["seq"])
    rows = (spark.readStream.format("kafka").options(**config.spark_kafka_options())
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", per_batch).load()
            .select(F.from_json(F.col("value").cast("string"),
                                f"user string, {EVENT_SCHEMA}").alias("e"))
            .select("e.*"))
    location = tempfile.mkdtemp(prefix=f"bench-input-check-{uuid.uuid4().hex[:6]}-")
    query = (rows.writeStream.foreachBatch(processor).option("checkpointLocation", location)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(900)
        if query.exception() is not None:
            raise RuntimeError(f"the input-check query failed: {query.exception()}")
    finally:
        query.stop()
        processor.close()
    measured = list(processor.reports)[1:]
    checks = [r.input_check_s for r in measured]
    seconds = [r.seconds for r in measured]
    typical = median(seconds)
    noise = median(abs(s - typical) for s in seconds)
    return {"events_per_batch": per_batch, "batches": len(measured),
            "input_partitions": INPUT_PARTITIONS,
            "check_median_s": median(checks), "check_max_s": max(checks),
            "batch_median_s": typical, "batch_mad_s": noise,
            "check_share_of_batch": median(checks) / typical,
            "within_noise": median(checks) <= noise}


__all__ = ["BATCHES", "EVENTS_PER_BATCH", "input_check_case"]
