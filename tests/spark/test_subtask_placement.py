"""On a cluster of two hosts, each subtask's task stays on the host of its store, and
goes back to it when the host was lost and is back.

The clickstream query runs on the standalone cluster whose two workers are hosts of
their own (own loopback address, own host-local state directory). Spark would give a
subtask's task to either executor from batch to batch; the driver's subtask placement
keeps it where it ran first, so after the first batch no subtask reads its state from
Kafka (neither a restore nor a catch-up) until a host is lost, and the state and outputs
are exact.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import produce_events
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Engine, Job, cluster_engine, wait_for
from .test_streaming_exactly_once import assert_exactly_once

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.spark_cluster]

#: The input written at first (10 batches: the loss after the third, three on one host,
#: the rest while the lost host comes back) and once the host runs an executor again (6
#: batches, the first ones while the executor registers with the driver): the query
#: waits for it without a batch, however long the host takes to come back.
FIRST_EVENTS = 1000
LATER_EVENTS = 600
USERS = 30


def test_a_host_lost_and_back_gets_its_subtask_back_which_catches_up(
    kafka_cluster: Any, spark: Any, spark_cluster: Any, tmp_path: Path
) -> None:
    """The second host's worker is killed -9 mid-run: its subtask restores on the first
    host. When the worker is back, the driver places the subtasks anew and the subtask
    goes back to the host of its older store, which it catches up from: the rest of the
    run reattaches, and the state and outputs are exact."""
    base = cluster_engine(spark_cluster)
    engine = Engine(base.name, base.master, {
        **base.spark_config, "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.locality.wait": "30s"})
    # No materialization while the subtask is away: its store's changelog is the start of
    # the checkpoint it comes back to.
    job = Job(f"back-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "checkpoint", FIRST_EVENTS + LATER_EVENTS, engine, per_batch=100,
              materialization_s=3600)
    produce_events(kafka_cluster.client_config(), job.input_topic,
                   FIRST_EVENTS + LATER_EVENTS, USERS, end=FIRST_EVENTS)
    checkpoints = WorkerResources.coordinator(job.config()).checkpoints
    log = tmp_path / "job.log"
    proc = job.start(2, None, log)
    lost = False
    try:
        def latest() -> int:
            return max(checkpoints.checkpoint_ids(job.prefix), default=0)

        def checkpointed(count: int) -> Callable[[], bool | None]:
            return lambda: latest() >= count or None

        wait_for("checkpoint 3", checkpointed(3), proc, log)
        spark_cluster.kill_worker(1)
        lost = True
        wait_for("3 checkpoints on one host", checkpointed(latest() + 3), proc, log)
        spark_cluster.restart_worker(1)
        lost = False
        spark_cluster.wait_for_executor(1)
        produce_events(kafka_cluster.client_config(), job.input_topic,
                       FIRST_EVENTS + LATER_EVENTS, USERS, start=FIRST_EVENTS)
        assert proc.wait(600) == 0, Path(f"{log}.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if lost:
            spark_cluster.restart_worker(1)  # the next tests share the cluster
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    batches = [summary["state_sources"][b] for b in sorted(summary["state_sources"], key=int)]
    assert set(batches[0].values()) == {"fresh"}, batches
    # Until the loss each subtask stays with its store: neither a restore nor a catch-up.
    loss = next(i for i, batch in enumerate(batches) if "restored" in batch.values())
    assert loss >= 3, batches
    for sources_before in batches[1:loss]:
        assert set(sources_before.values()) <= {"reattached", "reattached-local"}, batches
    sources = [s for batch in batches[1:] for s in batch.values()]
    assert sources.count("restored") == 1, batches  # the lost host's subtask, once
    assert sources.count("caught-up") == 1, batches  # and back on its host, once
    moved = next(s for batch in batches for s, source in batch.items() if source == "restored")
    back = next(s for batch in batches for s, source in batch.items() if source == "caught-up")
    assert moved == back, batches
    # (A stage re-run after the loss may roll back a store that went past its base.)
    assert set(sources) <= {"reattached", "reattached-local", "rolled-back", "restored",
                            "caught-up"}
    assert_exactly_once(job, kafka_cluster, spark, USERS, materialized=False)
