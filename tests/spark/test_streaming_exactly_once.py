"""Exactly-once state and outputs for a streaming query whose driver is killed -9.

The clickstream query runs as its own process (Spark driver + JVM). It is killed with
SIGKILL after our checkpoint commit but before Spark's, between batches (after
Spark's commit), inside the Kafka transaction that commits a checkpoint with its
outputs, and before our commit, and restarted at other parallelisms. In the end
every user's state equals the state computed directly from all input events, and
the output topic holds every batch's outputs exactly once: nothing lost, nothing
counted or written twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_changelog import key_group_range_for_operator
from spark_integration.clickstream import (
    EVENTS,
    KINDS,
    LAST_PAGES,
    SPENT,
    events,
    expected_state,
    output_problems,
    produce_events,
    read_outputs,
)
from spark_integration.streaming import StreamingStateConfig, _Process

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 1600
USERS = 40


REPO = Path(__file__).resolve().parents[2]


def run_job(cluster: Any, prefix: str, checkpoint_dir: Path, parallelism: int,
            crash_at: str | None) -> subprocess.CompletedProcess[str]:
    """The clickstream job in a child process, killed -9 at ``crash_at`` (event:batch)."""
    job = (["-m", "tests.spark.crashing_clickstream", crash_at] if crash_at
           else ["-m", "spark_integration.clickstream"])
    return subprocess.run(
        [sys.executable, *job,
         "--bootstrap-servers", cluster.bootstrap_servers, "--application", prefix,
         "--input-topic", f"{prefix}-clicks", "--output-topic", f"{prefix}-totals",
         "--topic-prefix", prefix, "--checkpoint-dir", str(checkpoint_dir),
         "--parallelism", str(parallelism), "--expected-events", str(EVENT_COUNT),
         "--max-per-batch", "400", "--materialization-interval", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )


def record_count(cluster: Any, topic: str) -> int:
    """Records between log start and end, over all partitions of ``topic``."""
    consumer = Consumer({**cluster.client_config(), "group.id": "record-count"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        total = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


def test_state_is_exactly_once_across_kills_and_rescaling(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"cs-{uuid.uuid4().hex[:8]}"
    produce_events(kafka_cluster.client_config(), f"{prefix}-clicks", EVENT_COUNT, USERS)
    checkpoint_dir = tmp_path / "spark-checkpoint"
    for parallelism, crash_at in [(2, "after_commit:1"), (3, "batch_start:2"),
                                  (3, "in_transaction:2"), (2, "before_commit:3"), (1, None)]:
        done = run_job(kafka_cluster, prefix, checkpoint_dir, parallelism, crash_at)
        if crash_at:
            assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        else:
            assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # The last run restored its single subtask from Kafka (another parallelism wrote it).
    assert summary["restore_s"] is not None and summary["restore_s"] > 0, summary
    config = StreamingStateConfig(
        application=prefix, operator_id="user-sessions",
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=8)
    coordinator = _Process.coordinator(config)
    latest = coordinator.checkpoint()
    assert latest is not None and latest.checkpoint_id >= 4
    # Materialization and garbage collection ran inside the job: snapshot chunks were
    # written, and retention left only the newest checkpoints.
    assert record_count(kafka_cluster, f"{prefix}-snapshots") > 0
    assert len(coordinator.checkpoints.checkpoint_ids(prefix)) <= config.retain
    expected = expected_state(events(EVENT_COUNT, USERS))
    backend = coordinator.restore_keyed(
        "user-sessions", key_group_range_for_operator(128, 1, 0), latest, config.changelog())
    for user, want in expected.items():
        backend.set_current_key(user.encode())
        got = {"events": backend.state(EVENTS).value(), "spent": backend.state(SPENT).get(),
               "kinds": dict(backend.state(KINDS).items()),
               "last_pages": backend.state(LAST_PAGES).get()}
        assert got == want, user
    backend.close()
    _Process.release(config)
    outputs = read_outputs(kafka_cluster.client_config(), f"{prefix}-totals")
    assert output_problems(outputs, expected) == []
    assert len({batch for batch, *_ in outputs}) >= 4
