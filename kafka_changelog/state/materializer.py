"""When to materialize: a timer with a start jitter that marks materialization as due.

The backend is used by one operator thread (like the writer), so the timer never
touches state: it only raises a flag that the operator thread acts on at its next
state access or snapshot, as Flink's materializer hands work to the task mailbox.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class MaterializationConfig:
    """Periodic materialization settings (defaults as Flink's)."""

    #: Seconds between materializations; None or 0 disables the timer.
    interval_s: float | None = 600.0
    #: The first materialization starts after interval + uniform(0, jitter) seconds, so
    #: that many subtasks started together do not all snapshot at once.
    start_jitter_s: float = 60.0
    #: Consecutive failures tolerated; one more is surfaced as an error on the backend.
    max_failures_allowed: int = 3

    def __post_init__(self) -> None:
        if self.max_failures_allowed < 0:
            raise ValueError(f"max_failures_allowed must be >= 0, got {self.max_failures_allowed}")


class PeriodicMaterializer:
    """A daemon timer that sets :attr:`due` every ``interval_s`` (after the jitter)."""

    def __init__(self, config: MaterializationConfig, rng: random.Random | None = None) -> None:
        self._config = config
        self.due = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if config.interval_s:
            jitter = (rng or random.Random()).uniform(0, config.start_jitter_s)
            self._thread = threading.Thread(
                target=self._run, args=(config.interval_s, jitter),
                name="kafka-changelog-materializer", daemon=True)
            self._thread.start()

    def _run(self, interval: float, jitter: float) -> None:
        delay = interval + jitter
        while not self._stopped.wait(delay):
            self.due.set()
            delay = interval

    def stop(self) -> None:
        """Stop the timer."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
