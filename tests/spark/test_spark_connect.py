"""A stateful query and the reader from Spark Connect clients, against a local Connect
server (``local[2]``, real broker).

The clickstream job (``examples.clickstream``, the exactly-once ``KafkaOutputSink``) runs
from a Connect client process: its ``foreachBatch`` driver runs in a Python process of
the server, with the client's Connect session. Half of the input is there at first. The
first client is killed -9 after the first checkpoint: the query outlives it on the server
and reads the whole first half. A second client starts the query again (same
``checkpointLocation``: Spark stops the first run), the second half arrives, its driver
stalls once with every subtask's outputs committed and the checkpoint record not
written, and the whole server (JVM, Python workers, the ``foreachBatch`` process) is
killed -9 there, with the client. A new server and a third client finish the input. In
the end every user's state is the one the events give and the output topic holds every
batch's outputs exactly once (``read_committed``, with librdkafka and Spark's connector):
the third client's first batch reused the stalled batch's committed outputs.

The reader (``format("kafka-changelog")``, both modes) from a Connect client returns
exactly what a classic session returns for the same checkpoint.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import expected_state, produce_events
from examples.events import events
from kafka_changelog.local_kafka.process import die_with_parent
from spark_integration.streaming.worker_resources import WorkerResources

from .cluster_read import plain
from .connect_server import LocalConnectServer
from .jobs import REPO, Engine, Job, wait_for
from .test_streaming_exactly_once import USERS, assert_exactly_once

pytestmark = [pytest.mark.broker, pytest.mark.spark]

EVENT_COUNT = 1600
PER_BATCH = 200


def connect_engine(server: LocalConnectServer) -> Engine:
    """The clickstream's engine for a Connect client of ``server``: its URL as the master
    (session settings only: the server's JVM is running already)."""
    return Engine("connect", server.url)


@dataclass(frozen=True)
class ConnectRun:
    """The application the Connect clients ran, and what the test saw on the way."""

    job: Job
    #: Checkpoints when the first client was killed, and once the query went on without it.
    at_client_kill: list[int]
    after_client_kill: list[int]
    #: The last client's summary line.
    summary: dict[str, Any]


def start_client(job: Job, log: Path, stall: Path | None = None) -> subprocess.Popen[str]:
    """A Connect client running the clickstream (its driver stalled once at
    ``before_commit`` once ``stall/arm`` exists, if ``stall``)."""
    faults = ["--stall-dir", str(stall), "--stall-at", "before_commit"] if stall else []
    command = [sys.executable, "-m", "tests.spark.connect_clickstream", *faults, "--",
               *job.command(2)[3:]]  # the clickstream's arguments (after "-m module")
    with open(log, "w") as out, open(f"{log}.err", "w") as err:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, text=True,
                                preexec_fn=die_with_parent())


def committed_input(job: Job) -> int:
    """Input records the query's batches committed in Spark's ``checkpointLocation``
    read (the input topic starts at offset 0): the offsets of its last committed batch."""
    commits = [int(p.name) for p in (job.checkpoint_dir / "commits").glob("[0-9]*")]
    if not commits:
        return 0
    offsets = (job.checkpoint_dir / "offsets" / str(max(commits))).read_text()
    return sum(json.loads(offsets.strip().splitlines()[-1])[job.input_topic].values())


def kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def connect_server() -> Iterator[LocalConnectServer]:
    """One Connect server for the module (restarted by the server kill)."""
    with LocalConnectServer() as server:
        yield server


@pytest.fixture(scope="module")
def connect_run(kafka_cluster: Any, connect_server: LocalConnectServer,
                tmp_path_factory: pytest.TempPathFactory) -> ConnectRun:
    """The clickstream from three Connect clients across a client kill and a server kill
    (module docstring)."""
    tmp = tmp_path_factory.mktemp("connect")
    job = Job(f"cc-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp / "spark-checkpoint", EVENT_COUNT, connect_engine(connect_server),
              per_batch=PER_BATCH)
    settings = kafka_cluster.client_config()
    # Half of the input first: the second half only once the second client's query runs,
    # so that its driver has a batch to stall in however fast the first run went.
    produce_events(settings, job.input_topic, EVENT_COUNT, USERS, end=EVENT_COUNT // 2)
    checkpoints = WorkerResources.coordinator(job.config()).checkpoints

    def ids() -> list[int]:
        return checkpoints.checkpoint_ids(job.prefix)

    first = start_client(job, tmp / "client-1.log")
    try:
        wait_for("a first checkpoint", lambda: ids() or None, first, tmp / "client-1.log")
    finally:
        kill(first)
    at_client_kill = ids()
    # The query runs on in the server without its client, through the first half.
    deadline = time.monotonic() + 300
    while committed_input(job) < EVENT_COUNT // 2:
        assert time.monotonic() < deadline, f"{committed_input(job)} events read after 300 s"
        time.sleep(0.2)
    after_client_kill = ids()

    stall = tmp / "stall"
    stall.mkdir()
    (stall / "arm").touch()
    log = tmp / "client-2.log"
    second = start_client(job, log, stall)
    try:
        # The client reports progress once its query started, i.e. once Spark stopped
        # the first run (same checkpointLocation).
        wait_for("the second client's query", lambda: "[job]" in log.read_text() or None,
                 second, log)
        produce_events(settings, job.input_topic, EVENT_COUNT, USERS,
                       start=EVENT_COUNT // 2)
        wait_for("a driver stalled before its checkpoint commit",
                 lambda: (stall / "stalled").exists() or None, second, log)
        connect_server.kill()
    finally:
        kill(second)

    connect_server.start()
    last = replace(job, engine=connect_engine(connect_server))
    log = tmp / "client-3.log"
    third = start_client(last, log)
    try:
        code = third.wait(600)
    finally:
        if third.poll() is None:
            kill(third)
    assert code == 0, Path(f"{log}.err").read_text()[-3000:]
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    return ConnectRun(job, at_client_kill, after_client_kill, summary)


def test_state_and_outputs_are_exactly_once_across_client_and_server_kills(
        connect_run: ConnectRun, kafka_cluster: Any, spark: Any) -> None:
    # The query outlived its first client: the server committed the checkpoints of the
    # first half of the input after it.
    assert max(connect_run.after_client_kill) > max(connect_run.at_client_kill), (
        connect_run.at_client_kill, connect_run.after_client_kill)
    # The client drove nothing itself: the driver's batches ran in the server's Python.
    assert connect_run.summary["batches"] == 0, connect_run.summary
    assert_exactly_once(connect_run.job, kafka_cluster, spark)


def test_reader_from_connect_returns_what_classic_returns(
        connect_run: ConnectRun, connect_server: LocalConnectServer, spark: Any,
        tmp_path: Path) -> None:
    config = connect_run.job.config()
    latest = WorkerResources.coordinator(config).checkpoint()
    assert latest is not None
    base = {"kafka.bootstrap.servers": config.bootstrap_servers,
            "application": config.application, "changelog.topic": config.changelog_topic,
            "snapshot.topic": config.snapshot_topic,
            "checkpoint.topic": config.checkpoint_topic,
            "checkpoint": str(latest.checkpoint_id)}
    reads = [{**base, "mode": "changes"}, {**base, "mode": "state"}]
    out = tmp_path / "rows.pickle"
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_read", connect_server.url,
         json.dumps(reads), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=die_with_parent())
    assert done.returncode == 0, done.stderr[-3000:]
    from_connect = pickle.loads(out.read_bytes())
    classic = [sorted((tuple(plain(v) for v in row)
                       for row in spark.read.format("kafka-changelog").options(**o).load()
                       .collect()), key=repr) for o in reads]
    changes, state = (sorted(rows, key=repr) for rows in from_connect)
    assert changes == classic[0]
    assert state == classic[1]
    # What the events give: each user's event count (state rows: state, key_decoded,
    # value_decoded), and changes after the checkpoint's materialization.
    expected = expected_state(events(EVENT_COUNT, USERS))
    assert {row[9]: int(row[8]) for row in state if row[2] == "events"} == {
        user: s["events"] for user, s in expected.items()}
    assert changes, "the latest checkpoint has no changelog tail"


def test_state_written_from_connect_is_the_next_checkpoint(
        connect_run: ConnectRun, connect_server: LocalConnectServer, spark: Any) -> None:
    # Last in the module: it moves the application on (a repair of one user's count). The
    # clickstream declares no states: its checkpoints record the states its tasks hold.
    config = connect_run.job.config()
    store = WorkerResources.coordinator(config).checkpoints
    latest = store.latest(config.application)
    assert latest is not None
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_write", connect_server.url,
         json.dumps(config.writer_options()), json.dumps([["events", "user-0000", "1000"]])],
        cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=die_with_parent())
    assert done.returncode == 0, done.stderr[-3000:]
    written = store.latest(config.application)
    assert written is not None and written.checkpoint_id == latest.checkpoint_id + 2
    state = (spark.read.format("kafka-changelog").options(**config.reader_options())
             .option("mode", "state").load().where("state = 'events'").collect())
    expected = {user: s["events"] for user, s in
                expected_state(events(EVENT_COUNT, USERS)).items()}
    assert {r.key_decoded: int(r.value_decoded) for r in state} == {
        **expected, "user-0000": 1000}
