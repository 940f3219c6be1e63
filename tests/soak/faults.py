"""The faults of the soak and the seeded schedule that places them.

A schedule is drawn from ``random.Random(seed)`` alone: the same seed and sizes give the
same faults, at the same batches, with the same choices (which broker, how long, which
parallelism), so a failing seed reruns the same schedule.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class FaultKind(Enum):
    """What the soak breaks."""

    #: kill -9 of the Spark driver (the job's process and its JVM); restarted as it was.
    DRIVER_KILL = "driver_kill"
    #: kill -9 of one Python worker (a ``pyspark.daemon`` child) of an executor.
    PYTHON_WORKER_KILL = "python_worker_kill"
    #: kill -9 of one executor JVM (its worker starts another).
    EXECUTOR_KILL = "executor_kill"
    #: kill -9 of one broker, restarted ``seconds`` later.
    BROKER_KILL = "broker_kill"
    #: SIGSTOP of one broker, SIGCONT ``seconds`` later.
    BROKER_PAUSE = "broker_pause"
    #: kill -9 of the driver, restarted at another parallelism.
    RESCALE = "rescale"
    #: kill -9 of the driver, restarted with a new (empty) checkpointLocation.
    FRESH_CHECKPOINT = "fresh_checkpoint"

    @property
    def restarts_driver(self) -> bool:
        """Whether the job is started again after this fault."""
        return self in (FaultKind.DRIVER_KILL, FaultKind.RESCALE, FaultKind.FRESH_CHECKPOINT)


#: The parallelisms a rescale picks from.
PARALLELISMS = (1, 2, 3)


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a schedule."""

    kind: FaultKind
    #: Injected once the application's latest checkpoint id reaches this.
    batch: int
    #: Seconds after that checkpoint (a random moment in the next batch).
    delay_s: float
    #: Which broker (index) or which process (index into the sorted candidates).
    target: int
    #: How long a broker stays down or paused.
    seconds: float
    #: The parallelism of a rescale's restart.
    parallelism: int
    #: The job's variant after the restart (a redeploy may change the function or the
    #: backend: the state is the same); the one before for faults without a restart.
    variant: str

    def to_json(self) -> dict[str, Any]:
        """The fault as JSON-compatible values."""
        return {**asdict(self), "kind": self.kind.value}


def draw_schedule(rng: random.Random, batches: int, faults: int, parallelism: int,
                  variants: list[str], variant: str) -> list[PlannedFault]:
    """``faults`` faults at distinct batches in ``[2, batches)``, in batch order.

    Kinds cycle through a shuffled order of all kinds, so that any ``len(FaultKind)``
    consecutive faults cover every kind. ``parallelism`` is the job's first one (a rescale
    always changes it); every restart picks one of ``variants`` (``variant`` is the
    first run's).
    """
    if faults > batches - 2:
        raise ValueError(f"{faults} faults need at least {faults + 2} batches, not {batches}")
    kinds = list(FaultKind)
    rng.shuffle(kinds)
    at = sorted(rng.sample(range(2, batches), faults))
    planned = []
    current = parallelism
    for i, batch in enumerate(at):
        kind = kinds[i % len(kinds)]
        if kind is FaultKind.RESCALE:
            current = rng.choice([p for p in PARALLELISMS if p != current])
        if kind.restarts_driver:
            variant = rng.choice(variants)
        planned.append(PlannedFault(kind, batch, round(rng.uniform(0.0, 1.5), 2),
                                    rng.randrange(1000), round(rng.uniform(2.0, 8.0), 1),
                                    current, variant))
    return planned
