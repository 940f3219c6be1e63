"""The streaming layer on a single broker in a container, ``docker kill``-ed mid-batch.

While a task of a batch is inside the user's function, the only broker's container gets
SIGKILL (``docker kill``); the batch is released while no broker runs, and the container
is started again a few seconds later on the same data volume. Every topic of the job
(input, output, changelog, snapshots, checkpoints, transaction state) lives on that one
broker. The job runs to its end: the state and the outputs come out exactly once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from examples.clickstream import expected_state, output_problems, produce_events, read_outputs
from examples.events import events
from kafka_changelog.testing.container import ContainerKafkaCluster
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Job, stalled_mid_batch, state_of

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.container]

EVENT_COUNT = 1200
USERS = 30
#: How long no broker runs (the released batch tries to commit meanwhile).
OUTAGE_S = 6.0


def test_the_broker_container_killed_mid_batch_loses_and_repeats_nothing(
    container_kafka_cluster: ContainerKafkaCluster, tmp_path: Path
) -> None:
    cluster = container_kafka_cluster
    settings = cluster.client_config()
    job = Job(f"docker-kill-{uuid.uuid4().hex[:8]}", cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", EVENT_COUNT, per_batch=200,
              materialization_s=0.5)
    produce_events(settings, job.input_topic, EVENT_COUNT, USERS)
    config = job.config()
    killed = False
    try:
        with stalled_mid_batch(job, tmp_path) as stalled:
            # The batch is inside the user's function now: nothing is committing.
            at_kill = max(stalled.checkpoint_ids())
            cluster.kill()
            killed = True
            assert cluster.status() == "exited"
            stalled.release()
            time.sleep(OUTAGE_S)
            assert stalled.proc.poll() is None, stalled.error_tail()
            cluster.restart()
            killed = False
            assert stalled.proc.wait(600) == 0, stalled.error_tail()
            checkpoint_ids = stalled.checkpoint_ids()
    finally:
        if killed:
            cluster.restart()

    # Checkpoints went on after the broker came back.
    assert max(checkpoint_ids) > at_kill
    expected = expected_state(events(EVENT_COUNT, USERS))
    assert state_of(config, sorted(expected)) == expected
    outputs = read_outputs(settings, job.output_topic)
    assert output_problems(outputs, expected) == []
    WorkerResources.release(config)
