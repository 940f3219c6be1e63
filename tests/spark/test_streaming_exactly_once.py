"""Exactly-once state and outputs for a streaming query whose driver or tasks are killed -9.

The clickstream query (input through Spark's ``format("kafka")``) runs as its own
process (Spark driver + JVM), in ``local[n]`` and on the standalone cluster (master +
2 workers: the tasks run in executor JVMs with their own Python workers). Every task
commits its outputs with its part of the checkpoint in a Kafka transaction of its own.
The driver is killed with SIGKILL before the batch's first task (locally) and after
every subtask committed its outputs but before the checkpoint record (the next run
reuses those commits, at their parallelism), and the runs go on at other
parallelisms (a kill after our checkpoint commit but before Spark's is in
``tests/spark/test_timers_exactly_once.py``). In ``local[n]`` (one broker)
the last run also kills two tasks' Python workers: one inside its transaction (its
retry fences and aborts it) and one just after its commit (its retry finds the commit
and reuses it). On the cluster (three brokers) every worker is a host of its own (own
loopback address, own host-local state directory); the runs go on two hosts, then a
third host joins for the last run, which loses a worker (killed -9 with its executor and
Python workers) while a task it runs has committed its outputs and not yet reported to
the driver; Spark runs the task again on another host, which reuses the commit. In the
end every user's state equals the state computed directly from all input events, and
the output topic holds every batch's outputs exactly once, read both with librdkafka and
with Spark's connector (``read_committed``): nothing lost, nothing counted or written
twice. Locally, the runs switch between the per-key function over the in-memory working
copy and the vectorised function (``update_users``) over the RocksDB backend, as a redeploy
may: the last run (vectorised, RocksDB) restores from Kafka and rolls back the store of the
task killed in its transaction.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import (
    expected_state,
    output_problems,
    outputs_with_spark,
    produce_events,
    read_outputs,
)
from examples.events import events
from kafka_changelog.local_kafka.process import die_with_parent
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import (
    LOCAL,
    REPO,
    Engine,
    Job,
    cluster_engine,
    record_count,
    state_of,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 1600
USERS = 40
#: The two functions and working copies the local runs switch between (a redeploy may change
#: the function or the backend: the state in Kafka is the same).
PER_KEY = ()
VECTORIZED = ("--vectorized", "--state-backend", "rocksdb")
#: (parallelism, where the driver is killed, variant) of the local runs, in order; the last
#: one finishes.
RUNS = [(2, "batch_start:1", PER_KEY), (3, "before_commit:2", VECTORIZED),
        (1, None, VECTORIZED)]
#: Tasks the last local run kills (``TASK_EVENT:BATCH:SUBTASK``), once each; the run's
#: ``local[n, 4]`` master lets Spark run a failed task again.
TASK_KILLS = ("subtask_in_transaction:4:0", "subtask_committed:5:0")
PER_BATCH = 300
#: On the cluster (each run starts executors too): the kills that matter most, across
#: rescaling; the last run loses a worker instead.
CLUSTER_RUNS = [(3, "before_commit:2", PER_KEY), (2, None, PER_KEY)]


@pytest.fixture(params=["local", "cluster"])
def engine(request: pytest.FixtureRequest) -> Engine:
    if request.param == "local":
        return LOCAL
    request.applymarker(pytest.mark.spark_cluster)
    return cluster_engine(request.getfixturevalue("spark_cluster"))


def completed_apps(cluster: Any) -> int:
    return sum(app.get("name") == "clickstream" for app in cluster.status()["completedapps"])


def run_losing_a_worker(cluster: Any, job: Job, parallelism: int, tmp_path: Path) -> str:
    """Run the job to its end on ``cluster``, killing -9 the worker that runs a task which
    has just committed its outputs (before it reports to the driver); the job's
    output."""
    stall = tmp_path / "stall"
    stall.mkdir()
    (stall / "arm").touch()
    log = tmp_path / "last-run.log"
    proc = job.start(parallelism, stall, log, stall_at="subtask_committed")
    victim = None
    try:
        pid = int(wait_for("a stalled task", lambda: (
            (stall / "stalled").read_text() or None) if (stall / "stalled").exists() else None,
            proc, log))
        victim = cluster.worker_of(pid)
        assert victim is not None, f"the stalled task (pid {pid}) runs under no worker"
        cluster.kill_worker(victim)
        # The task's Python worker died with its worker (and was reaped).
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), f"the stalled task's process {pid} survived"
        assert proc.wait(600) == 0, Path(f"{log}.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if victim is not None:
            cluster.restart_worker(victim)  # the next tests share the cluster
    assert cluster.alive_workers() == cluster.worker_count
    return log.read_text()


def run_on_a_joined_host_losing_a_worker(cluster: Any, job: Job, parallelism: int,
                                        tmp_path: Path) -> str:
    """Add a host to ``cluster``, run the job to its end on every host while it loses a
    worker mid-batch (:func:`run_losing_a_worker`), then take the host away again; the
    job's output. Each host kept the subtask stores of the tasks it ran in a state
    directory of its own."""
    roots = [cluster.worker_temp_dir(i) / f"kafka-changelog-state-{os.getuid()}"
             for i in range(cluster.worker_count)]
    joined = cluster.add_worker()
    roots.append(cluster.worker_temp_dir(joined) / f"kafka-changelog-state-{os.getuid()}")
    engine = job.engine
    on_every_host = replace(job, engine=Engine(engine.name, engine.master, {
        **engine.spark_config, "spark.cores.max": str(cluster.cores)}))
    try:
        output = run_losing_a_worker(cluster, on_every_host, parallelism, tmp_path)
    finally:
        cluster.remove_worker()
    hosts_with_stores = [root for root in roots if (root / job.prefix).is_dir()]
    assert len(hosts_with_stores) >= 2, f"the stores of {job.prefix} are on {hosts_with_stores}"
    return output


def test_state_is_exactly_once_across_kills_and_rescaling(
    kafka_cluster: Any, spark: Any, engine: Engine, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    cluster = request.getfixturevalue("spark_cluster") if engine.master else None
    if cluster is not None:
        # On the cluster, against three brokers (topics replicated 3 times).
        kafka_cluster = request.getfixturevalue("kafka_cluster_3")
    apps_before = completed_apps(cluster) if cluster else 0
    job = Job(f"cs-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", EVENT_COUNT, engine, per_batch=PER_BATCH)
    # Locally the RocksDB stores of every run share one directory; on the cluster each
    # host keeps them in its own.
    local_state = () if cluster else ("--local-state-dir", str(tmp_path / "local-state"))
    settings = kafka_cluster.client_config()
    produce_events(settings, job.input_topic, EVENT_COUNT, USERS)
    runs = RUNS if cluster is None else CLUSTER_RUNS
    for parallelism, crash_at, variant in runs[:-1]:
        done = replace(job, options=(*variant, *local_state)).run(parallelism, crash_at)
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    parallelism, _, variant = runs[-1]
    last = replace(job, options=(*variant, *local_state))
    if cluster is None:
        faults = tmp_path / "faults"
        faults.mkdir()
        done = last.run(parallelism, task_kills=TASK_KILLS, fault_dir=faults,
                        master=f"local[{max(2, parallelism)},4]")
        assert done.returncode == 0, done.stderr[-3000:]
        # Both tasks were killed (and ran again).
        assert sorted(p.name for p in faults.iterdir()) == sorted(
            "killed-" + point.replace(":", "-") for point in TASK_KILLS)
        output = done.stdout
    else:
        output = run_on_a_joined_host_losing_a_worker(cluster, last, parallelism, tmp_path)
    summary = json.loads(output.strip().splitlines()[-1])
    # The last run restored its subtasks from Kafka (another parallelism wrote them).
    assert summary["restore_s"] is not None and summary["restore_s"] > 0, summary
    if cluster is None:
        # Batch 3 restored the subtask; the task killed in batch 4's transaction had
        # released its store at a checkpoint that never completed: its retry rolled the
        # store back to the copy kept at its base.
        assert summary["state_sources"]["4"]["0"] == "rolled-back", summary["state_sources"]
    else:
        # Every run was an application of the cluster (its tasks ran in the executors).
        assert completed_apps(cluster) - apps_before == len(CLUSTER_RUNS)
    assert_exactly_once(job, kafka_cluster, spark)


def test_two_applications_at_once_on_one_host_sharing_topics_and_its_state_directory(
    kafka_cluster: Any, spark: Any, tmp_path: Path
) -> None:
    """Two applications run at the same time on one host (two ``local[2]`` drivers), with
    the RocksDB backend under one host-local state directory and one set of state topics,
    over the same user names (so the same key groups and changelog partitions): each
    ends with exactly its own state and outputs. (On a cluster every application's
    stores are in its executors' host directories the same way; the cluster tests above
    and ``tests/spark/test_subtask_placement.py`` run one application at a time.)"""
    engine = LOCAL
    shared = f"two-{uuid.uuid4().hex[:8]}"
    local_state = tmp_path / "local-state"
    jobs = [Job(f"{shared}-{name}", kafka_cluster.bootstrap_servers,
                tmp_path / f"chk-{name}", count, engine, per_batch=PER_BATCH,
                options=("--state-backend", "rocksdb", "--local-state-dir", str(local_state)),
                topic_prefix=shared)
            for name, count in (("a", 1200), ("b", EVENT_COUNT))]
    settings = kafka_cluster.client_config()
    for job, users in zip(jobs, (30, USERS), strict=True):
        produce_events(settings, job.input_topic, job.events, users)
    running = [subprocess.Popen(job.command(2), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent()) for job in jobs]
    outcomes = [proc.communicate(timeout=600) for proc in running]
    for proc, (_, err) in zip(running, outcomes, strict=True):
        assert proc.returncode == 0, err[-3000:]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outcomes]
    # They ran at the same time: each one's query started before the other's ended.
    spans = [summary["span_s"] for summary in summaries]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    # Each started empty and then found its subtasks' stores on the host, kept by the same
    # Python worker or left by another: nothing was restored from Kafka.
    for summary in summaries:
        sources = [s for batch in summary["state_sources"].values() for s in batch.values()]
        assert set(sources[:2]) == {"fresh"}, summary["state_sources"]
        assert set(sources[2:]) <= {"reattached", "reattached-local"}, summary["state_sources"]
    for job, users in zip(jobs, (30, USERS), strict=True):
        assert_exactly_once(job, kafka_cluster, spark, users)


def assert_exactly_once(job: Job, kafka_cluster: Any, spark: Any, users: int = USERS,
                        materialized: bool = True) -> None:
    """The job's final state, outputs (ours and through Spark's connector), materialization
    (unless not ``materialized``: a job that never materializes) and garbage collection
    are what the events give, each batch's outputs once."""
    settings = kafka_cluster.client_config()
    config = job.config()
    coordinator = WorkerResources.coordinator(config)
    latest = coordinator.checkpoint()
    assert latest is not None and latest.checkpoint_id >= 4
    # Materialization and garbage collection ran inside the job: snapshot chunks were
    # written, and retention left only the newest checkpoints.
    assert (record_count(settings, f"{job.topics}-snapshots") > 0) == materialized
    assert len(coordinator.checkpoints.checkpoint_ids(job.prefix)) <= config.retain
    expected = expected_state(events(job.events, users))
    assert state_of(config, sorted(expected)) == expected
    WorkerResources.release(config)
    outputs = read_outputs(settings, job.output_topic)
    assert output_problems(outputs, expected) == []
    assert len({batch for batch, *_ in outputs}) >= 4
    # Spark's own connector, read_committed, sees exactly the same outputs.
    with_spark = outputs_with_spark(spark, {"kafka.bootstrap.servers":
                                            kafka_cluster.bootstrap_servers}, job.output_topic)
    assert sorted(tuple(row) for row in with_spark.collect()) == sorted(outputs)
