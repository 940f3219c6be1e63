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

from .jobs import Job, state_of
from .test_streaming_exactly_once import wait_for

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
    checkpoints = WorkerResources.coordinator(config).checkpoints
    stall = tmp_path / "stall"
    stall.mkdir()
    log = tmp_path / "job.log"
    proc = job.start(2, stall, log)
    killed = False
    try:
        wait_for("a first checkpoint", lambda: checkpoints.checkpoint_ids(job.prefix) or None,
                 proc, log)
        (stall / "arm").touch()
        wait_for("a stalled task", lambda: (stall / "stalled").exists() or None, proc, log)
        # The batch is inside the user's function now: nothing is committing.
        at_kill = max(checkpoints.checkpoint_ids(job.prefix))
        cluster.kill()
        killed = True
        assert cluster.status() == "exited"
        (stall / "release").touch()
        time.sleep(OUTAGE_S)
        assert proc.poll() is None, Path(f"{log}.err").read_text()[-3000:]
        cluster.restart()
        killed = False
        assert proc.wait(600) == 0, Path(f"{log}.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if killed:
            cluster.restart()

    # Checkpoints went on after the broker came back.
    assert max(checkpoints.checkpoint_ids(job.prefix)) > at_kill
    expected = expected_state(events(EVENT_COUNT, USERS))
    assert state_of(config, sorted(expected)) == expected
    outputs = read_outputs(settings, job.output_topic)
    assert output_problems(outputs, expected) == []
    WorkerResources.release(config)
