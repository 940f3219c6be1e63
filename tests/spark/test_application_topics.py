"""Each application has its own changelog and snapshot topics unless told to share.

A stopped application that was never reset keeps what its checkpoints need: with topics of
its own, no other application's log grows for it. The reader and the command line read an
application's state without being told its topics (each handle names its topic).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka.admin import AdminClient

from kafka_changelog.kafka.topic_owners import SharedTopicError
from kafka_changelog.kafka.topics import application_topics
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.worker_resources import WorkerResources

REPO = Path(__file__).resolve().parents[2]
COUNT = value_state("count", INT64)


def test_an_applications_topics_are_its_own_and_valid_kafka_names() -> None:
    assert application_topics("orders") == ("kafka-changelog-orders-changelog",
                                             "kafka-changelog-orders-snapshots")
    config = StreamingStateConfig("orders", "op", "127.0.0.1:9092")
    assert (config.changelog_topic, config.snapshot_topic, config.checkpoint_topic) == (
        "kafka-changelog-orders-changelog", "kafka-changelog-orders-snapshots",
        "kafka-changelog-checkpoints")
    # Named topics are kept: applications share them when told to.
    shared = StreamingStateConfig("orders", "op", "127.0.0.1:9092", changelog_topic="log",
                                  snapshot_topic="snaps")
    assert (shared.changelog_topic, shared.snapshot_topic) == ("log", "snaps")
    # Names Kafka refuses become valid ones; two names never map to the same topics.
    slash, space = application_topics("team/orders"), application_topics("team orders")
    assert slash != space
    for changelog, snapshots in (slash, space, application_topics("x" * 400)):
        for topic in (changelog, snapshots):
            assert len(topic) <= 249 and all(c.isalnum() or c in "._-" for c in topic), topic
    assert slash[0].startswith("kafka-changelog-team-orders-")


@pytest.mark.broker
@pytest.mark.spark
def test_default_topics_are_read_by_the_reader_and_the_cli_without_naming_them(
        spark: Any, kafka_cluster: Any) -> None:
    app = f"own-topics-{uuid.uuid4().hex[:8]}"
    config = StreamingStateConfig(app, "op", kafka_cluster.bootstrap_servers, partitions=2,
                                  materialization_interval_s=0.001)

    def count_rows(key: str, rows: pd.DataFrame, state: Any) -> None:
        count = state(COUNT)
        count.update((count.value() or 0) + len(rows))

    with stateful_foreach_batch(config, count_rows, "user", "user string") as processor:
        frame = spark.createDataFrame([("ann", 1), ("bob", 2), ("ann", 3)],
                                      "user string, seq long")
        processor(frame, 0)
        processor(frame, 1)
    WorkerResources.release(config)
    topics = set(AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
                 .list_topics(timeout=30).topics)
    assert {f"kafka-changelog-{app}-changelog", f"kafka-changelog-{app}-snapshots"} <= topics
    from spark_integration import register

    register(spark)
    state = (spark.read.format("kafka-changelog")
             .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
             .option("application", app).option("mode", "state").load()
             .where("state = 'count'").collect())
    assert {r["key_decoded"]: int(r["value_decoded"]) for r in state} == {"ann": 4, "bob": 2}
    shown = subprocess.run(
        [sys.executable, "-m", "kafka_changelog.cli", "state", app, "--key", "ann",
         "--operator", "op", "--bootstrap-servers", kafka_cluster.bootstrap_servers, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert found["found"] and {s["state"]: s["value"] for s in found["states"]} == {"count": 4}


@pytest.mark.broker
def test_a_driver_sharing_topics_under_another_checkpoint_topic_is_refused(
        kafka_cluster: Any) -> None:
    prefix = f"shared-{uuid.uuid4().hex[:8]}"
    first = StreamingStateConfig(f"{prefix}-a", "op", kafka_cluster.bootstrap_servers,
                                 changelog_topic=f"{prefix}-log", snapshot_topic=f"{prefix}-snap",
                                 checkpoint_topic=f"{prefix}-checkpoints", partitions=2)
    coordinator = WorkerResources.coordinator(first)
    coordinator.guard_first_writes()  # a guard names the changelog topic
    other = StreamingStateConfig(f"{prefix}-b", "op", kafka_cluster.bootstrap_servers,
                                 changelog_topic=f"{prefix}-log", snapshot_topic=f"{prefix}-snap",
                                 checkpoint_topic=f"{prefix}-elsewhere", partitions=2)
    try:
        with pytest.raises(SharedTopicError) as refused:
            WorkerResources.coordinator(other)
        assert (f"changelog topic '{prefix}-log' is used by applications whose checkpoint "
                f"topic is '{prefix}-checkpoints', not '{prefix}-elsewhere'") in str(refused.value)
        # Sharing the checkpoint topic too is fine.
        together = dataclasses.replace(other, checkpoint_topic=f"{prefix}-checkpoints")
        WorkerResources.coordinator(together)
        WorkerResources.release(together)
    finally:
        WorkerResources.release(first)
