"""When to materialize: a timer with a start jitter that marks materialization as due.

The backend is used by one operator thread (like the writer), so the timer never
touches state: it only raises a flag that the operator thread acts on at its next
state access or snapshot, as Flink's materializer hands work to the task mailbox.
"""

from __future__ import annotations

import random
import threading
import time
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
    """A daemon timer that sets :attr:`due` every ``interval_s`` (after the jitter).

    The next time it fires is wall-clock time (:attr:`next_due_at`), so that a backend
    that continues another's state in another process can keep its schedule
    (:meth:`reschedule`).
    """

    def __init__(self, config: MaterializationConfig, rng: random.Random | None = None) -> None:
        self._config = config
        self.due = threading.Event()
        self._stopped = False
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._next_due_at: float | None = None
        if config.interval_s:
            jitter = (rng or random.Random()).uniform(0, config.start_jitter_s)
            self._next_due_at = time.time() + config.interval_s + jitter
            self._thread = threading.Thread(
                target=self._run, args=(config.interval_s,),
                name="kafka-changelog-materializer", daemon=True)
            self._thread.start()

    def _run(self, interval: float) -> None:
        with self._wakeup:
            while not self._stopped:
                assert self._next_due_at is not None
                left = self._next_due_at - time.time()
                if left > 0:
                    self._wakeup.wait(left)
                    continue  # woken early (stop, reschedule) or on time: look again
                self.due.set()
                self._next_due_at = time.time() + interval

    @property
    def next_due_at(self) -> float | None:
        """When the timer next marks materialization as due (seconds since the epoch);
        None without a timer."""
        with self._wakeup:
            return self._next_due_at

    def reschedule(self, at: float) -> None:
        """Fire next at ``at`` (seconds since the epoch), then every interval; a time that
        has passed marks materialization as due at once. No-op without a timer."""
        with self._wakeup:
            if self._thread is None or self._stopped or not self._config.interval_s:
                return
            now = time.time()
            if at <= now:
                self.due.set()
                at = now + self._config.interval_s
            self._next_due_at = at
            self._wakeup.notify_all()

    def stop(self) -> None:
        """Stop the timer."""
        with self._wakeup:
            self._stopped = True
            self._wakeup.notify_all()
        if self._thread is not None:
            self._thread.join()
