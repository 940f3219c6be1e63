"""Two drivers of one application at once: one wins, nothing is visible twice.

Real Spark drivers (child processes) and a real broker. A zombie: the driver of a query
stalls inside a batch, and the same query is started again from its checkpointLocation
(a failover that left the old driver running); the new driver takes over at once, reuses
what the old one's subtasks committed and finishes the job, and when the zombie wakes
up its task refuses to commit, naming the new holder. A double deploy: two drivers of
one application with checkpointLocations of their own start together; the second to
claim waits for the holder's lease and gives up naming it. Both times the outputs are
exactly once, the state is exact, and every checkpoint id was committed once.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from examples.clickstream import expected_state, output_problems, produce_events, read_outputs
from examples.events import events
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Job, state_of, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 600
USERS = 20


def checkpoint_commits(settings: dict[str, Any], topic: str, application: str
                       ) -> Counter[str]:
    """How many times each checkpoint record key of ``application`` was committed (with a
    value) in the checkpoint topic."""
    consumer = Consumer({**settings, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    prefix = f"{application}/checkpoint/".encode()
    found: Counter[str] = Counter()
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while True:
            message = consumer.poll(10)
            assert message is not None, f"no end of {topic} within 10 s"
            if message.error():
                return found
            key = message.key() or b""
            if key.startswith(prefix) and message.value() is not None:
                found[key.decode()] += 1
    finally:
        consumer.close()


def check_exactly_once(job: Job, settings: dict[str, Any]) -> None:
    expected = expected_state(events(EVENT_COUNT, USERS))
    config = job.config()
    try:
        assert state_of(config, sorted(expected)) == expected
    finally:
        WorkerResources.release(config)
    assert output_problems(read_outputs(settings, job.output_topic), expected) == []
    commits = checkpoint_commits(settings, config.checkpoint_topic, job.prefix)
    assert commits and set(commits.values()) == {1}, commits


def a_job(kafka_cluster: Any, name: str, checkpoint_dir: Path, *options: str) -> Job:
    """A clickstream application named after ``name``, its input written."""
    job = Job(f"{name}-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              checkpoint_dir, EVENT_COUNT, per_batch=200, options=options)
    produce_events(kafka_cluster.client_config(), job.input_topic, EVENT_COUNT, USERS)
    return job


def test_a_zombie_driver_commits_nothing_once_the_same_query_restarted(
        kafka_cluster: Any, tmp_path: Path) -> None:
    settings = kafka_cluster.client_config()
    # In memory: with "rocksdb" the zombie's stalled task would hold its subtask's store on
    # this host, and the new driver's task would wait for the store's lock.
    job = a_job(kafka_cluster, "zombie", tmp_path / "spark-checkpoint",
                "--state-backend", "memory")
    checkpoints = WorkerResources.coordinator(job.config()).checkpoints
    stall = tmp_path / "stall"
    stall.mkdir()
    log = tmp_path / "zombie.log"
    zombie = job.start(2, stall, log)
    try:
        wait_for("a first checkpoint",
                 lambda: checkpoints.checkpoint_ids(job.prefix) or None, zombie, log)
        (stall / "arm").touch()
        wait_for("a stalled task", lambda: (stall / "stalled").exists() or None, zombie, log)
        # The zombie is inside a batch; the same query starts again and runs to the end.
        rerun = job.run(2)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        (stall / "release").touch()
        assert zombie.wait(300) != 0
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    error = Path(f"{log}.err").read_text()
    assert "DriverFencedError" in error, error[-3000:]
    assert f"application '{job.prefix}' is now held by driver" in error
    assert "that driver is a zombie, nothing of its batch is committed" in error
    check_exactly_once(job, settings)


def test_of_two_drivers_started_together_one_runs_and_the_other_is_refused(
        kafka_cluster: Any, tmp_path: Path) -> None:
    settings = kafka_cluster.client_config()
    first = a_job(kafka_cluster, "double", tmp_path / "checkpoint-1", "--driver-lease", "10")
    second = dataclasses.replace(first, checkpoint_dir=tmp_path / "checkpoint-2")
    # Whichever driver holds the application stalls in its first task, so the other one
    # meets a live holder.
    stall = tmp_path / "stall"
    stall.mkdir()
    (stall / "arm").touch()
    drivers = [job.start(2, stall, tmp_path / f"driver-{i}.log")
               for i, job in enumerate((first, second))]
    try:
        deadline = time.monotonic() + 300
        while all(d.poll() is None for d in drivers):
            assert time.monotonic() < deadline, "neither driver gave up within 300 s"
            time.sleep(0.5)
        loser = next(i for i, d in enumerate(drivers) if d.poll() is not None)
        winner = 1 - loser
        assert drivers[loser].returncode != 0
        wait_for("the holder's stalled task", lambda: (stall / "stalled").exists() or None,
                 drivers[winner], tmp_path / f"driver-{winner}.log")
        (stall / "release").touch()
        assert drivers[winner].wait(300) == 0, Path(
            tmp_path / f"driver-{winner}.log.err").read_text()[-3000:]
    finally:
        for driver in drivers:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    error = (tmp_path / f"driver-{loser}.log.err").read_text()
    assert "ApplicationHeldError" in error, error[-3000:]
    assert f"application '{first.prefix}' is held by driver" in error
    assert "a live driver of another Spark query: a second driver would process the input " \
           "twice" in error
    check_exactly_once(first, settings)
