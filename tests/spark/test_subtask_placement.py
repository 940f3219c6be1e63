"""On a cluster of three hosts, each subtask's task stays on the host of its store: when a
host is lost, only its own subtask moves (and restores from Kafka); when the host is
back, that subtask goes back to it and catches up from its older store.

The clickstream query runs at parallelism 3 on the standalone cluster, whose workers are
hosts of their own (own loopback address, own host-local state directory), one core
each. Spark would give a subtask's task to any executor from batch to batch; the driver's
subtask placement keeps it where it ran first. A loss changes the cluster's core count
(three, then two, then three again), which once changed the placement's plan: the
surviving subtasks then swapped hosts in about two runs of three. One run of the query
loses two hosts, one after the other (each killed -9 while the query runs, then
restarted), so that one run of the test is two trials of a random placement.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import DRIVER_LOG_ENV, produce_events
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import Engine, Job, cluster_engine, wait_for
from .test_streaming_exactly_once import assert_exactly_once

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.spark_cluster]

#: The input (100 events a batch): written before the query starts, then for each lost
#: host once it is lost (read on the hosts left) and once it is back (read on all three
#: again), so that batches run on three hosts, on two, and on three again, whatever the
#: time a host takes to come back.
FIRST, AWAY, BACK = 500, 300, 500
USERS = 30
#: The workers lost, one after the other (the third host is added by the test).
LOST = (1, 2)
SURVIVING_SOURCES = {"reattached", "reattached-local"}


def test_a_lost_host_moves_only_its_own_subtask_which_goes_back_when_the_host_is_back(
    kafka_cluster: Any, spark: Any, spark_cluster: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DRIVER_LOG_ENV, "INFO")  # the placement decisions, for a failure
    job_log = tmp_path / "job.log.err"
    joined = spark_cluster.add_worker()
    try:
        summary, job = _run_losing_hosts(kafka_cluster, spark_cluster, tmp_path)
    finally:
        spark_cluster.remove_worker()
    assert joined == 2
    batches = sorted(summary["state_sources"], key=int)
    sources = [summary["state_sources"][b] for b in batches]
    hosts = [summary["hosts"][b] for b in batches]
    try:
        _check_placement(sources, hosts)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_story(batches, sources, hosts, job_log)}") from None
    assert_exactly_once(job, kafka_cluster, spark, USERS, materialized=False)


def _check_placement(sources: list[dict[str, str]], hosts: list[dict[str, str]]) -> None:
    """Each loss moves only the lost host's subtask, which goes back when the host does."""
    assert set(sources[0].values()) == {"fresh"}, sources
    assert len(set(hosts[0].values())) == 3, hosts[0]  # one subtask per host
    losses = [i for i, batch in enumerate(sources) if "restored" in batch.values()]
    returns = [i for i, batch in enumerate(sources) if "caught-up" in batch.values()]
    # Each loss restores one subtask from Kafka, the lost host's, and nothing else
    # does: the surviving subtasks stay on their hosts (with their stores) throughout.
    assert len(losses) == len(LOST) and len(returns) == len(LOST), sources
    for loss, back in zip(losses, returns, strict=True):
        restored = [s for s, source in sources[loss].items() if source == "restored"]
        caught_up = [s for s, source in sources[back].items() if source == "caught-up"]
        assert len(restored) == 1 and len(caught_up) == 1, (loss, back, sources, hosts)
        moved, returned = restored[0], caught_up[0]
        assert moved == returned, (loss, back, sources)
        assert loss < back, sources
        # The subtask went back to the host it ran on before the loss.
        assert hosts[back][moved] == hosts[loss - 1][moved], (moved, hosts)
        for batch in range(loss, back):
            survivors = {s: h for s, h in hosts[batch].items() if s != moved}
            assert survivors == {s: h for s, h in hosts[loss - 1].items() if s != moved}, (
                batch, hosts)
    for i, batch in enumerate(sources[1:], start=1):
        others = {s: source for s, source in batch.items()
                  if not (i in losses and source == "restored")
                  and not (i in returns and source == "caught-up")}
        # (A stage run again after the loss may roll back a store that went past its base.)
        assert set(others.values()) <= SURVIVING_SOURCES | {"rolled-back"}, (i, sources)


def _story(batches: list[str], sources: list[dict[str, str]], hosts: list[dict[str, str]],
           job_log: Path) -> str:
    """Every batch's subtasks (host, state source), and the driver's placement decisions."""
    names: dict[str, str] = {}
    lines = ["batch: subtask -> host, state source"]
    for batch, batch_sources, batch_hosts in zip(batches, sources, hosts, strict=True):
        where = {s: names.setdefault(h, f"host{len(names)}") for s, h in batch_hosts.items()}
        lines.append(f"  {batch}: " + ", ".join(
            f"{s} -> {where.get(s, '?')} {source}" for s, source in sorted(batch_sources.items())))
    lines.append("hosts: " + ", ".join(f"{n} = {h}" for h, n in names.items()))
    decisions = [line for line in job_log.read_text(errors="replace").splitlines()
                 if "spark_integration" in line] if job_log.exists() else []
    return "\n".join([*lines, "driver:", *decisions[-40:]])


def _joins_seen(log: Path) -> int:
    """How many times the job's driver logged executors joining (its placement made anew)."""
    err = Path(f"{log}.err")
    text = err.read_text(errors="replace") if err.exists() else ""
    return sum("subtasks are placed anew" in line for line in text.splitlines())


def _joined_since(log: Path, seen: int) -> Callable[[], bool | None]:
    """Whether the job's driver logged an executor joining since it had logged ``seen``."""
    return lambda: _joins_seen(log) > seen or None


def _run_losing_hosts(kafka_cluster: Any, spark_cluster: Any, tmp_path: Path
                      ) -> tuple[dict[str, Any], Job]:
    """Run the query on every host of ``spark_cluster``, losing each worker of
    :data:`LOST` in turn after a few batches and bringing it back once the query has run
    three batches without it (the next is lost once the driver has seen it join); the
    query's summary and the job."""
    base = cluster_engine(spark_cluster)
    engine = Engine(base.name, base.master, {
        **base.spark_config, "spark.cores.max": str(spark_cluster.cores),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.locality.wait": "30s"})
    total = FIRST + len(LOST) * (AWAY + BACK)
    # No materialization while a subtask is away: its store's changelog is the start of
    # the checkpoint it comes back to.
    job = Job(f"hosts-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "checkpoint", total, engine, per_batch=100, materialization_s=3600)
    settings = kafka_cluster.client_config()
    produce_events(settings, job.input_topic, total, USERS, end=FIRST)
    checkpoints = WorkerResources.coordinator(job.config()).checkpoints
    log = tmp_path / "job.log"
    proc = job.start(3, None, log)
    lost: int | None = None
    try:
        def latest() -> int:
            return max(checkpoints.checkpoint_ids(job.prefix), default=0)

        def checkpointed(count: int) -> Callable[[], bool | None]:
            return lambda: latest() >= count or None

        written = FIRST

        def produce(count: int) -> None:
            nonlocal written
            produce_events(settings, job.input_topic, total, USERS, start=written,
                           end=written + count)
            written += count

        for worker in LOST:
            wait_for("two batches on every host", checkpointed(latest() + 2), proc, log)
            spark_cluster.kill_worker(worker)
            lost = worker
            at_loss = latest()
            produce(AWAY)
            wait_for(f"three batches without worker {worker}", checkpointed(at_loss + 3),
                     proc, log)
            joins = _joins_seen(log)
            spark_cluster.restart_worker(worker)
            lost = None
            spark_cluster.wait_for_executor(worker)
            produce(BACK)
            # The executor may register with the driver batches after the master lists
            # it: the next host is lost only once the driver has seen this one join.
            wait_for(f"the driver seeing worker {worker}'s executor join",
                     _joined_since(log, joins), proc, log)
        assert proc.wait(600) == 0, Path(f"{log}.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if lost is not None:
            spark_cluster.restart_worker(lost)  # the next tests share the cluster
    return json.loads(log.read_text().strip().splitlines()[-1]), job
