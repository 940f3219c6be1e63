"""The streaming layer on three brokers, one of them killed -9 in the middle of a batch.

Every topic of the job (input, output, changelog, snapshots, checkpoints, and the
transaction state log) has replication factor 3 with ``min.insync.replicas=2``. While
a task of a batch is inside the user's function, the broker leading the checkpoint
topic is killed with SIGKILL; the batch goes on and commits with two brokers, and so
do the next ones; two checkpoints later the broker is restarted. The state and the
outputs come out exactly once, and materialization and garbage collection go on
during and after the outage.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource

from examples.clickstream import (
    expected_state,
    output_problems,
    outputs_with_spark,
    produce_events,
    read_outputs,
)
from examples.events import events
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Job, record_count, stalled_mid_batch, state_of, wait_for, watermarks

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.three_nodes]

EVENT_COUNT = 2000
USERS = 40


def replication(cluster: Any, topics: list[str]) -> dict[str, tuple[int, str]]:
    """Per topic: replicas of partition 0 and the topic's ``min.insync.replicas``."""
    admin = cluster.admin_client()
    metadata = admin.list_topics(timeout=30)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    found = {}
    for resource, future in admin.describe_configs(resources).items():
        config = future.result(30)
        found[resource.name] = (len(metadata.topics[resource.name].partitions[0].replicas),
                                config["min.insync.replicas"].value)
    return found


def test_a_broker_killed_mid_batch_loses_and_repeats_nothing(
    kafka_cluster_3: Any, spark: Any, tmp_path: Path
) -> None:
    cluster = kafka_cluster_3
    settings = cluster.client_config()
    job = Job(f"rf3-{uuid.uuid4().hex[:8]}", cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", EVENT_COUNT, per_batch=200,
              # A backend materializes once it lived this long in its Python worker
              # (Spark may hand a subtask to another worker, which restores it).
              materialization_s=0.5)
    produce_events(settings, job.input_topic, EVENT_COUNT, USERS)
    config = job.config()
    victim = None
    try:
        with stalled_mid_batch(job, tmp_path) as stalled:
            # The batch is inside the user's function now: nothing is committing.
            before = watermarks(settings, config.changelog_topic)
            snapshots_before = record_count(settings, config.snapshot_topic)
            at_kill = max(stalled.checkpoint_ids())
            victim = cluster.leader_of(config.checkpoint_topic, 0)
            killed_us = time.time_ns() // 1000
            cluster.kill_node(victim)
            stalled.release()
            wait_for("two checkpoints without the broker",
                     lambda: (max(stalled.checkpoint_ids()) >= at_kill + 2) or None,
                     stalled.proc, stalled.log)
            assert cluster.pid(victim) is None
            cluster.restart_node(victim)
            victim = None
            assert stalled.proc.wait(600) == 0, stalled.error_tail()
    finally:
        if victim is not None:
            cluster.restart_node(victim)

    topics = [job.input_topic, job.output_topic, config.changelog_topic,
              config.snapshot_topic, config.checkpoint_topic, "__transaction_state"]
    assert replication(cluster, topics) == dict.fromkeys(topics, (3, "2"))
    expected = expected_state(events(EVENT_COUNT, USERS))
    assert state_of(config, sorted(expected)) == expected
    outputs = read_outputs(settings, job.output_topic)
    assert output_problems(outputs, expected) == []
    with_spark = outputs_with_spark(spark, config.spark_kafka_options(), job.output_topic)
    assert sorted(tuple(row) for row in with_spark.collect()) == sorted(outputs)
    # Materialization went on: the latest checkpoint's snapshots were made after the kill.
    latest = WorkerResources.coordinator(config).checkpoint()
    assert latest is not None and latest.checkpoint_id > at_kill + 2
    made = [s.keyed.materialization_id for s in latest.subtasks
            if s.keyed is not None and s.keyed.snapshot is not None]
    assert any(made_at > killed_us for made_at in made), (made, killed_us)
    assert record_count(settings, config.snapshot_topic) > snapshots_before
    # And garbage collection: changelog records below what retained checkpoints need
    # were deleted after the kill, and only the newest checkpoints are retained.
    after = watermarks(settings, config.changelog_topic)
    assert any(after[p][0] > before[p][0] for p in before), (before, after)
    assert len(WorkerResources.coordinator(config).checkpoints.checkpoint_ids(job.prefix)) <= (
        config.retain)
    WorkerResources.release(config)
