"""The seeded chaos soak: the clickstream job on the standalone Spark cluster and three
brokers, faults injected at random moments, state and outputs checked against the model
at every restart and at the end, resources measured at batch ``measure_at`` and at the
end.

Input is produced as the job goes, a few batches ahead of it, so that batches are full
and a fault lands in the middle of work. At every restart (the driver just killed), the
state at the latest checkpoint must be, for every user, the fold of its first events (a
checkpoint covers a prefix of every input partition), and the committed outputs must show
it. A fresh checkpointLocation continues the state's input offsets (the job starts its
query at ``starting_offsets``). Before a fresh checkpointLocation and at the end,
production pauses until the job caught up: state and outputs must then equal the model
of everything produced, each event applied once.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from examples.clickstream import ensure_topic, output_problems
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from spark_integration.streaming.worker_resources import WorkerResources
from tests.spark.jobs import Job, cluster_engine, state_of
from tests.spark.standalone import LocalSparkCluster

from . import checks
from .driver import Driver, SoakFailure
from .faults import FaultKind, PlannedFault, draw_schedule
from .model import InputModel, overcounted
from .processes import executors, kill_tree, python_workers
from .resources import Figures, directory_bytes, measure, tolerances, verdicts

#: The stateful function and state backend of a seed's job (drawn from the seed).
VARIANTS: dict[str, tuple[str, ...]] = {
    "per-key/memory": ("--state-backend", "memory"),
    "per-key/rocksdb": ("--state-backend", "rocksdb"),
    "vectorized/memory": ("--vectorized", "--state-backend", "memory"),
    "vectorized/rocksdb": ("--vectorized", "--state-backend", "rocksdb"),
}
#: The job never reaches this many events: the harness stops it.
ENDLESS = 10**9
#: Kafka topics of the soak's brokers roll segments at this size (Kafka's least) or after
#: a minute: deleted records free disk a whole segment at a time.
SEGMENT_BYTES = 1024 * 1024
#: Broker settings of the soak's cluster.
BROKER_OVERRIDES = {"log.segment.bytes": str(SEGMENT_BYTES), "log.roll.ms": "60000",
                    "log.retention.check.interval.ms": "10000",
                    "log.segment.delete.delay.ms": "1000",
                    "log.cleaner.backoff.ms": "1000"}
#: The job sweeps its snapshot topic every minute, and chunks of a backend no checkpoint
#: names go after two (the defaults, hours, would never sweep within a soak); a batch
#: takes seconds, so a materialization's checkpoint comes well within the grace.
SWEEP_INTERVAL_S = 60.0
SWEEP_GRACE_S = 120.0
#: Seconds a Python worker or executor kill waits for one to run.
PROCESS_WAIT_S = 120.0
#: A micro-batch reads up to this many batches' input: normal batches find only the few
#: produced ahead, and a restart behind the input catches up in a tenth of the batches.
READ_AHEAD = 10
#: The job's parallelism until a rescale.
FIRST_PARALLELISM = 2
#: ``reports_kept`` of the job's processor (the driver's default).
REPORTS_KEPT = 1000


@dataclass(frozen=True)
class SoakSettings:
    """One seed's run: how long, how many faults, how big."""

    seed: int
    batches: int
    faults: int
    per_batch: int = 20
    users: int = 40
    #: The first resource figures are taken once the latest checkpoint reaches this.
    measure_at: int = 50
    #: Input produced ahead of the latest checkpoint, in batches.
    lead: int = 3
    #: Seconds a catch-up may go without a new checkpoint (a new query may read the whole
    #: input again: it takes long, but it makes checkpoints).
    catch_up_s: float = 300.0
    #: Seconds without a new checkpoint before the soak gives up.
    stall_s: float = 300.0
    #: Wall-clock time (epoch seconds) after which no more faults are injected and the run
    #: ends as if it had reached ``batches`` (None: no deadline).
    deadline: float | None = None

    def command(self) -> str:
        """The command that reruns this seed's schedule."""
        return (f"python -m tests.soak.run --seed {self.seed} --batches {self.batches} "
                f"--faults {self.faults} --per-batch {self.per_batch} --users {self.users} "
                f"--measure-at {self.measure_at}")


@dataclass(frozen=True)
class Plan:
    """What a seed runs: the job's variant (a key of :data:`VARIANTS`) and the faults."""

    variant: str
    schedule: list[PlannedFault]


@dataclass
class Injected:
    """A fault as it was injected."""

    kind: FaultKind
    planned_batch: int
    #: The application's latest checkpoint id at the injection.
    batch: int
    #: Seconds since the seed's start.
    at_s: float
    detail: str
    #: Seconds from the restart to the first new checkpoint (faults that restart the
    #: driver).
    recovered_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The fault as JSON-compatible values."""
        return {**asdict(self), "kind": self.kind.value}


@dataclass
class SoakResult:
    """What one seed did and found."""

    settings: SoakSettings
    variant: str
    schedule: list[PlannedFault]
    injected: list[Injected] = field(default_factory=list)
    #: The variants the job ran, in order (the first, then one per restart).
    variants: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    batches: int = 0
    events_produced: int = 0
    seconds: float = 0.0
    first: Figures | None = None
    last: Figures | None = None
    #: Host-local state left after the driver stopped (bytes).
    local_state_after_stop: int | None = None
    #: Whether the deadline ended the run before its batches and faults.
    cut_short: bool = False

    @property
    def passed(self) -> bool:
        """No problem found."""
        return not self.problems

    def resource_verdicts(self) -> dict[str, dict[str, Any]]:
        """Per figure: first, last and whether it stayed flat (empty without both)."""
        if self.first is None or self.last is None:
            return {}
        return verdicts(self.first, self.last, tolerances(SEGMENT_BYTES, 8, 3, REPORTS_KEPT))

    def to_json(self) -> dict[str, Any]:
        """The result as JSON-compatible values."""
        return {"seed": self.settings.seed, "command": self.settings.command(),
                "settings": asdict(self.settings), "variants": self.variants,
                "passed": self.passed, "problems": self.problems, "batches": self.batches,
                "cut_short_by_deadline": self.cut_short,
                "events_produced": self.events_produced, "seconds": round(self.seconds, 1),
                "faults_planned": len(self.schedule),
                "faults_injected": [f.to_json() for f in self.injected],
                "fault_kinds": sorted({f.kind.value for f in self.injected}),
                "figures_first": self.first.to_json() if self.first else None,
                "figures_last": self.last.to_json() if self.last else None,
                "local_state_after_stop": self.local_state_after_stop,
                "resources": self.resource_verdicts()}


class Soak:
    """One seed's soak on ``kafka`` (three nodes) and ``spark`` (standalone), in
    ``workdir``; ``on_fault`` hears the result so far after every fault."""

    def __init__(self, settings: SoakSettings, kafka: LocalKafkaCluster,
                 spark: LocalSparkCluster, workdir: Path,
                 on_fault: Callable[[SoakResult], None] | None = None) -> None:
        self.settings = settings
        self.on_fault = on_fault
        self.kafka = kafka
        self.spark = spark
        self.workdir = workdir
        self.rng = random.Random(settings.seed)
        planned = self.plan(settings, self.rng)
        variant = planned.variant
        self.parallelism = FIRST_PARALLELISM
        self.result = SoakResult(settings, variant, planned.schedule, variants=[variant])
        self.local_state = workdir / "local-state"
        self.status = workdir / "status.json"
        self.history = workdir / "history.jsonl"
        prefix = f"soak{settings.seed}-{uuid.uuid4().hex[:6]}"
        self.job = Job(prefix, kafka.bootstrap_servers, workdir / "checkpoint-0", ENDLESS,
                       cluster_engine(spark), settings.per_batch * READ_AHEAD,
                       materialization_s=1.0,
                       options=self._options(variant))
        self.config = self.job.config()
        # Input enough for every batch to be full until the last (faults never find an
        # idle job for want of input).
        self.model = InputModel((settings.batches + settings.lead) * settings.per_batch,
                                settings.users)
        self.producer = Producer({**kafka.client_config(), "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 5})
        self.driver: Driver | None = None
        #: The last restart: its fault, the latest checkpoint then, when (monotonic).
        self.recovering: tuple[Injected, int, float] | None = None
        self.runs = 0
        self.started = time.monotonic()

    @staticmethod
    def plan(settings: SoakSettings, rng: random.Random | None = None) -> Plan:
        """The seed's variant and schedule (drawn from ``rng``, default a new
        ``random.Random(settings.seed)``)."""
        rng = rng or random.Random(settings.seed)
        variant = rng.choice(sorted(VARIANTS))
        return Plan(variant, draw_schedule(rng, settings.batches, settings.faults,
                                           FIRST_PARALLELISM, sorted(VARIANTS), variant))

    def _options(self, variant: str) -> tuple[str, ...]:
        return (*VARIANTS[variant], "--local-state-dir", str(self.local_state),
                "--status-file", str(self.status), "--timeout", "1e9",
                "--snapshot-sweep", str(SWEEP_INTERVAL_S), str(SWEEP_GRACE_S))

    # -- the run -------------------------------------------------------------------

    def run(self) -> SoakResult:
        """Run the seed to its end (or its first problem); never raises a
        :class:`SoakFailure`, which becomes the result's problems."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._run()
        except SoakFailure as failure:
            self.result.problems.append(str(failure))
        finally:
            if self.driver is not None:
                self.driver.kill()
            self.result.seconds = time.monotonic() - self.started
            self.result.events_produced = self.model.produced
            WorkerResources.release(self.config)
        return self.result

    def _run(self) -> None:
        settings = self.settings
        ensure_topic(self.kafka.client_config(), self.job.input_topic)
        self._produce()
        self.driver = self._start()
        pending = list(self.result.schedule)
        progress_at, last_seen = time.monotonic(), -1
        while True:
            latest = self._latest()
            self.result.batches = latest
            if latest != last_seen:
                progress_at, last_seen = time.monotonic(), latest
            elif time.monotonic() - progress_at > settings.stall_s:
                raise SoakFailure(f"no new checkpoint for {settings.stall_s:.0f} s after "
                                  f"checkpoint {latest}")
            self.driver.check_alive()
            self._produce()
            if self.recovering is not None and latest > self.recovering[1]:
                self.recovering[0].recovered_s = round(
                    time.monotonic() - self.recovering[2], 1)
                self.recovering = None
            if self.result.first is None and latest >= settings.measure_at:
                self.result.first = self._measure(latest)
            if settings.deadline is not None and time.time() > settings.deadline:
                self.result.cut_short = True
                break
            if pending and latest >= pending[0].batch:
                self._inject(pending.pop(0))
            elif not pending and latest >= settings.batches:
                break
            time.sleep(0.3)
        # Measured while the job is busy (PySpark ends Python workers idle for a minute),
        # once the driver's status names a batch it ran: a driver restarted by the last
        # fault may have committed the latest checkpoint before its status (rewritten every
        # half second) says so.
        self._await_reported_batch()
        self.result.last = self._measure(latest)
        self._catch_up()
        self.result.batches = self._latest()
        self.driver.stop()
        self.result.local_state_after_stop = directory_bytes(self.local_state)
        expected = self.model.expected()
        problems = checks.all_problems(self.config, self.job.output_topic, expected)
        problems += checks.cli_problems(self.config, expected,
                                        self.rng.sample(sorted(expected), 3))
        if problems:
            raise SoakFailure("at the end: " + "; ".join(problems))

    def _await_reported_batch(self, limit_s: float = 30.0) -> None:
        """Wait (at most ``limit_s``) until the running driver's status file counts a
        batch (a killed driver's file may still be there)."""
        assert self.driver is not None
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                status = json.loads(self.status.read_text())
                if status["pid"] == self.driver.pid and status["batches"] > 0:
                    return
            except (OSError, ValueError, KeyError):
                pass  # not written yet, or being rewritten
            time.sleep(0.2)

    def _start(self) -> Driver:
        self.runs += 1
        return Driver(self.job, self.parallelism, self.workdir / f"driver-{self.runs}.log")

    def _latest(self) -> int:
        ids = WorkerResources.coordinator(self.config).checkpoints.checkpoint_ids(
            self.job.prefix)
        return max(ids) if ids else 0

    def _produce(self, wait: bool = True) -> None:
        """Keep ``lead`` batches of input ahead of the latest checkpoint; ``wait``: until
        every event produced so far is acknowledged."""
        target = (self._latest() + self.settings.lead) * self.settings.per_batch
        for event in self.model.next_events(target):
            self.producer.produce(self.job.input_topic, key=event["user"].encode(),
                                  value=json.dumps(event).encode())
        if not wait:
            self.producer.poll(0)
        elif self.producer.flush(60) != 0:
            raise SoakFailure("input events were not all acknowledged")

    def _measure(self, batch: int) -> Figures:
        pid = self.driver.pid if self.driver is not None else None
        return measure(batch, self.kafka, self.spark, self.config, self.local_state, pid,
                       self.status)

    # -- faults --------------------------------------------------------------------

    def _inject(self, fault: PlannedFault) -> None:
        time.sleep(fault.delay_s)
        assert self.driver is not None
        self.driver.check_alive()
        injected = Injected(fault.kind, fault.batch, self._latest(),
                            round(time.monotonic() - self.started, 1), "")
        kind = fault.kind
        if kind is FaultKind.FRESH_CHECKPOINT:
            # The new query continues at the offsets of the state's latest checkpoint. The
            # driver goes when the job caught up: a batch abandoned mid-way for a new
            # checkpointLocation leaves the outputs its subtasks committed published
            # (docs/exactly-once.md), which the output check would count twice.
            self._catch_up()
            self.job = replace(self.job, checkpoint_dir=self.workdir / f"checkpoint-{self.runs}")
            injected.detail = f"new checkpointLocation {self.job.checkpoint_dir.name}"
        elif kind is FaultKind.RESCALE:
            injected.detail = f"parallelism {self.parallelism} -> {fault.parallelism}"
            self.parallelism = fault.parallelism
        elif kind is FaultKind.DRIVER_KILL:
            injected.detail = f"driver pid {self.driver.pid}"
        elif kind in (FaultKind.PYTHON_WORKER_KILL, FaultKind.EXECUTOR_KILL):
            find = python_workers if kind is FaultKind.PYTHON_WORKER_KILL else executors
            deadline = time.monotonic() + PROCESS_WAIT_S
            while not (found := find(self.spark)) and time.monotonic() < deadline:
                self._keep_producing(0.5)  # e.g. a new driver's executors are starting
            if found:
                victim = found[fault.target % len(found)]
                kill_tree(victim)
                injected.detail = f"pid {victim} of {len(found)}"
            else:
                injected.detail = "none running: nothing killed"
        else:
            self._break_broker(fault, injected)
        if kind.restarts_driver:
            self.job = replace(self.job, options=self._options(fault.variant))
            injected.detail += f"; variant {fault.variant}"
            self.result.variants.append(fault.variant)
            self.driver.kill()
            self._check_at_restart()
            self.driver = self._start()
            self.recovering = (injected, self._latest(), time.monotonic())
        self.result.injected.append(injected)
        with open(self.history, "a") as history:
            history.write(json.dumps(injected.to_json()) + "\n")
        print(f"[soak {self.settings.seed}] {injected.to_json()}", flush=True)
        if self.on_fault is not None:
            self.on_fault(self.result)

    def _break_broker(self, fault: PlannedFault, injected: Injected) -> None:
        node = fault.target % self.kafka.node_count
        if fault.kind is FaultKind.BROKER_KILL:
            self.kafka.kill_node(node)
            undo: Callable[[int], None] = self.kafka.restart_node
            how = "down"
        else:
            self.kafka.pause_node(node)
            undo, how = self.kafka.resume_node, "paused"
        try:
            # Without waiting for acks: a produce request in flight to a paused broker is
            # answered only after SIGCONT (or librdkafka's socket timeout, 60 s), and
            # waiting for it here would hold back the SIGCONT.
            self._keep_producing(fault.seconds, wait=False)
        finally:
            undo(node)
        self._produce()
        injected.detail = f"node {node} {how} {fault.seconds} s"

    def _keep_producing(self, seconds: float, wait: bool = True) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._produce(wait)
            time.sleep(0.5)

    # -- checks --------------------------------------------------------------------

    def _check_at_restart(self) -> None:
        """The state and outputs at the latest checkpoint, taken while the job ran (its
        driver was just killed): every user's state the fold of its first events, its last
        outputs that state, no output twice."""
        users = sorted({event["user"] for event in self.model.applied()})
        found = state_of(self.config, users)
        latest = self._latest()
        problems = self.model.prefix_problems(found) + checks.restart_output_problems(
            checks.outputs(self.config, self.job.output_topic), found, latest)
        if problems:
            raise SoakFailure(f"at the restart after checkpoint {latest}: {problems}")

    def _catch_up(self) -> None:
        """Wait (producing nothing) until the latest checkpoint's state equals the model of
        everything produced; then the committed outputs must equal it too."""
        assert self.driver is not None
        expected = self.model.expected()
        deadline = time.monotonic() + self.settings.catch_up_s
        seen = self._latest()
        while True:
            self.driver.check_alive()
            if (latest := self._latest()) > seen:
                # Still working (e.g. a new query reading the whole input again): wait on.
                seen, deadline = latest, time.monotonic() + self.settings.catch_up_s
            found = state_of(self.config, sorted(expected))
            if over := overcounted(found, expected):
                raise SoakFailure(f"at checkpoint {self._latest()} the state counts more "
                                  f"events than the input has for {len(over)} users, e.g. "
                                  f"{over[0]}: {found[over[0]]} != {expected[over[0]]}")
            if found == expected:
                break
            if time.monotonic() > deadline:
                wrong = [u for u in expected if found[u] != expected[u]]
                raise SoakFailure(f"no catch-up: no new checkpoint for "
                                  f"{self.settings.catch_up_s:.0f} s and "
                                  f"{len(wrong)} users differ at checkpoint {self._latest()}")
            time.sleep(1.0)
        problems = output_problems(checks.outputs(self.config, self.job.output_topic),
                                          expected)
        if problems:
            raise SoakFailure(f"outputs at checkpoint {self._latest()}: {problems}")
