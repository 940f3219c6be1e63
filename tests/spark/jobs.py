"""The clickstream job as a child process of a test, and the checks of its results.

Shared by the streaming crash tests (``local[n]``, the standalone cluster, three
brokers): every job is ``python -m tests.spark.crashing_clickstream`` (or the plain
job), its own Spark driver, killed with the test if the test dies.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from examples.clickstream import EVENTS, KINDS, LAST_PAGES, SPENT
from kafka_changelog import key_group_range_for_operator
from kafka_changelog.kafka.offsets import watermarks as partition_watermarks
from kafka_changelog.local_kafka.process import die_with_parent
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.worker_resources import WorkerResources

REPO = Path(__file__).resolve().parents[2]
OPERATOR = "user-sessions"


@dataclass(frozen=True)
class Engine:
    """Where the job's Spark runs: ``local[n]`` (no master) or a cluster."""

    name: str
    master: str | None = None
    spark_config: dict[str, str] = field(default_factory=dict)

    def arguments(self) -> list[str]:
        """The clickstream arguments selecting this engine."""
        args = ["--master", self.master] if self.master else []
        for key, value in self.spark_config.items():
            args += ["--spark-conf", f"{key}={value}"]
        return args


#: Spark's interpreted expressions instead of Java code generated and compiled (Janino)
#: for every new plan: ~2.5 CPU-s less per test driver, same rows. The claims of the
#: tests' own drivers are about state and outputs, not Spark's code generation (the
#: in-process session, the demo and the README's examples run with it, as users do).
NO_CODEGEN = {"spark.sql.codegen.wholeStage": "false",
              "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
#: The driver JVM of a test job starts ~20% sooner with the C1 JIT and the serial
#: collector (test jobs are short and small).
FAST_DRIVER = {"spark.driver.extraJavaOptions":
               "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData", **NO_CODEGEN}
LOCAL = Engine("local", None, FAST_DRIVER)


def cluster_engine(cluster: Any) -> Engine:
    """The engine of a :class:`~tests.spark.standalone.LocalSparkCluster`."""
    return Engine("cluster", cluster.master_url, {**cluster.session_config(), **FAST_DRIVER})


@dataclass(frozen=True)
class Job:
    """One application of the clickstream job: its topics, input size and engine."""

    prefix: str
    bootstrap_servers: str
    checkpoint_dir: Path
    events: int
    engine: Engine = LOCAL
    per_batch: int = 400
    materialization_s: float = 2.0
    #: More clickstream arguments (e.g. ``("--vectorized", "--state-backend", "rocksdb")``).
    options: tuple[str, ...] = ()
    #: Prefix of the state topics (default: ``prefix``; applications may share them).
    topic_prefix: str | None = None
    #: librdkafka settings of every client (security), given to the job as ``-X``.
    client_config: tuple[tuple[str, str], ...] = ()

    @property
    def topics(self) -> str:
        """The prefix of the job's changelog, snapshot and checkpoint topics."""
        return self.topic_prefix or self.prefix

    def command(self, parallelism: int, kill_at: str | None = None,
                stall_dir: Path | None = None, stall_at: str | None = None,
                task_kills: tuple[str, ...] = (), fault_dir: Path | None = None,
                master: str | None = None, sink_dir: Path | None = None,
                kill_after_sink: int | None = None,
                initial_state: Path | None = None) -> list[str]:
        """The job's command line (with faults injected, if any; see
        ``tests.spark.crashing_clickstream``)."""
        faults = []
        if kill_at:
            faults += ["--kill-at", kill_at]
        if stall_dir:
            faults += ["--stall-dir", str(stall_dir)]
        if stall_at:
            faults += ["--stall-at", stall_at]
        for point in task_kills:
            faults += ["--kill-task-at", point]
        if fault_dir:
            faults += ["--fault-dir", str(fault_dir)]
        if sink_dir:
            faults += ["--sink-dir", str(sink_dir)]
        if kill_after_sink is not None:
            faults += ["--kill-after-sink", str(kill_after_sink)]
        if initial_state is not None:
            faults += ["--initial-state", str(initial_state)]
        module = (["-m", "tests.spark.crashing_clickstream", *faults, "--"] if faults
                  else ["-m", "examples.clickstream"])
        return [
            sys.executable, *module,
            "--bootstrap-servers", self.bootstrap_servers, "--application", self.prefix,
            "--input-topic", self.input_topic, "--output-topic", self.output_topic,
            "--topic-prefix", self.topics, "--checkpoint-dir", str(self.checkpoint_dir),
            "--parallelism", str(parallelism), "--expected-events", str(self.events),
            "--max-per-batch", str(self.per_batch),
            "--materialization-interval", str(self.materialization_s),
            *self.engine.arguments(), *(["--master", master] if master else []),
            *[arg for key, value in self.client_config for arg in ("-X", f"{key}={value}")],
            *self.options,
        ]

    @property
    def input_topic(self) -> str:
        return f"{self.prefix}-clicks"

    @property
    def output_topic(self) -> str:
        return f"{self.prefix}-totals"

    def run(self, parallelism: int, kill_at: str | None = None,
            timeout_s: float = 600, task_kills: tuple[str, ...] = (),
            fault_dir: Path | None = None, master: str | None = None,
            sink_dir: Path | None = None, kill_after_sink: int | None = None,
            initial_state: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the job to its end (or its kill)."""
        command = self.command(parallelism, kill_at, task_kills=task_kills,
                               fault_dir=fault_dir, master=master, sink_dir=sink_dir,
                               kill_after_sink=kill_after_sink, initial_state=initial_state)
        return subprocess.run(command, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=die_with_parent())

    def start(self, parallelism: int, stall_dir: Path | None, log: Path,
              stall_at: str | None = None) -> subprocess.Popen[str]:
        """Start the job (with a stalling task unless ``stall_dir`` is None: see
        ``crashing_clickstream``); its stdout goes to ``log``, its stderr to ``log`` +
        ``.err``."""
        command = self.command(parallelism, stall_dir=stall_dir, stall_at=stall_at)
        with open(log, "w") as out, open(f"{log}.err", "w") as err:
            return subprocess.Popen(command, cwd=REPO,
                                    stdout=out, stderr=err, text=True,
                                    preexec_fn=die_with_parent())

    def config(self) -> StreamingStateConfig:
        """The job's state configuration (as ``examples.clickstream.main``)."""
        return StreamingStateConfig(
            application=self.prefix, operator_id=OPERATOR,
            bootstrap_servers=self.bootstrap_servers,
            changelog_topic=f"{self.topics}-changelog",
            snapshot_topic=f"{self.topics}-snapshots",
            checkpoint_topic=f"{self.topics}-checkpoints", partitions=8,
            client_config=dict(self.client_config))


@contextmanager
def restored_backend(config: StreamingStateConfig) -> Iterator[ChangelogKeyedStateBackend]:
    """The latest checkpoint's keyed state of ``config``'s operator, restored from Kafka
    alone into one backend of every key group (closed afterwards)."""
    coordinator = WorkerResources.coordinator(config)
    latest = coordinator.checkpoint()
    assert latest is not None
    backend = coordinator.restore_keyed(config.operator_id, key_group_range_for_operator(
        config.max_parallelism, 1, 0), latest, config.changelog())
    try:
        yield backend
    finally:
        backend.close()


def state_of(config: StreamingStateConfig, users: list[str]) -> dict[str, dict[str, Any]]:
    """Every user's state at the latest checkpoint, restored in this process."""
    with restored_backend(config) as backend:
        found = {}
        for user in users:
            backend.set_current_key(user.encode())
            found[user] = {"events": backend.state(EVENTS).value(),
                           "spent": backend.state(SPENT).get(),
                           "kinds": dict(backend.state(KINDS).items()),
                           "last_pages": backend.state(LAST_PAGES).get()}
        return found


def watermarks(client_config: dict[str, Any], topic: str) -> dict[int, tuple[int, int]]:
    """(log start, log end) of every partition of ``topic`` (leader changes waited out:
    a fault a test injected may still be moving leaders)."""
    consumer = Consumer({**client_config, "group.id": "watermarks"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {p: partition_watermarks(consumer, topic, p, 60.0) for p in partitions}
    finally:
        consumer.close()


def record_count(client_config: dict[str, Any], topic: str) -> int:
    """Records between log start and end, over all partitions of ``topic``."""
    return sum(high - low for low, high in watermarks(client_config, topic).values())


def wait_for(what: str, found: Callable[[], Any], proc: subprocess.Popen[str], log: Path,
             timeout_s: float = 300) -> Any:
    """Poll ``found()`` until it returns something (the job must keep running)."""
    deadline = time.monotonic() + timeout_s
    while (value := found()) is None:
        assert proc.poll() is None, f"the job exited ({proc.returncode}) before {what}:\n" + (
            Path(f"{log}.err").read_text()[-3000:])
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.2)
    return value


@dataclass
class StalledJob:
    """A running job one of whose tasks stalls inside the user's function (see
    ``tests.spark.crashing_clickstream``): nothing commits until :meth:`release`."""

    proc: subprocess.Popen[str]
    log: Path
    stall: Path
    #: The application's checkpoint ids as the test's view sees them.
    checkpoint_ids: Callable[[], list[int]]

    def release(self) -> None:
        """Let the stalled task go on."""
        (self.stall / "release").touch()

    def error_tail(self) -> str:
        """The end of the job's stderr (for assertion messages)."""
        return Path(f"{self.log}.err").read_text()[-3000:]


@contextmanager
def stalled_mid_batch(job: Job, tmp_path: Path, parallelism: int = 2
                      ) -> Iterator[StalledJob]:
    """Start ``job``, wait for its first checkpoint, then until a task of a later batch is
    stalled inside the user's function; the job is killed on exit if it still runs."""
    checkpoints = WorkerResources.coordinator(job.config()).checkpoints
    stall = tmp_path / "stall"
    stall.mkdir()
    log = tmp_path / "job.log"
    proc = job.start(parallelism, stall, log)
    try:
        wait_for("a first checkpoint", lambda: checkpoints.checkpoint_ids(job.prefix) or None,
                 proc, log)
        (stall / "arm").touch()
        wait_for("a stalled task", lambda: (stall / "stalled").exists() or None, proc, log)
        yield StalledJob(proc, log, stall, lambda: checkpoints.checkpoint_ids(job.prefix))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
