"""Periodic materialization of a keyed backend: when, in the background, within a budget.

Flink's ``PeriodicMaterializationManager``: a timer marks materialization as due (the
operator thread starts it at its next state access or snapshot), at most one runs at a
time on a background thread, a finished one is handed back to the operator thread to
apply, and failures are retried until more than ``max_failures_allowed`` in a row
surface as :class:`MaterializationFailedError`. *What* is materialized, and what
applying it means, is the backend's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...sequence import SequenceNumber
from ..errors import MaterializationFailedError
from .materializer import MaterializationConfig, PeriodicMaterializer
from .snapshot import SnapshotHandle

logger = logging.getLogger(__name__)


def next_materialization_id(previous: int) -> int:
    """The id of a new materialization after ``previous``: the time it starts, in
    microseconds since the epoch (ascending even if the clock steps back)."""
    return max(previous + 1, time.time_ns() // 1000)


def materialized_at(materialization_id: int) -> float:
    """When the materialization ``materialization_id`` started, in seconds since the
    epoch (see :func:`next_materialization_id`)."""
    return materialization_id / 1e6


@dataclass
class MaterializationRun:
    """One materialization: its id, what it covers, and its background write."""

    future: Future[SnapshotHandle]
    materialization_id: int
    #: The sequence number the materialized state is consistent with.
    upto: SequenceNumber
    #: Key groups it writes anew (to write again if it fails).
    changed: set[int]
    #: Local-recovery journal entries it covers.
    journal_cut: int
    started: float


@dataclass(frozen=True)
class MaterializationStats:
    """Counters of a backend's materializations."""

    completed: int
    failed_in_a_row: int
    skipped: int
    #: Started, in all.
    started: int = 0
    #: Bytes of the chunks the materializations wrote (reused chunks not counted).
    bytes_written: int = 0


class MaterializationManager:
    """The timer, the background writer and the failure budget of one backend."""

    def __init__(self, config: MaterializationConfig, owner: str) -> None:
        self.config = config
        self._owner = owner
        self.timer = PeriodicMaterializer(config)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kafka-changelog-materialize")
        self.running: MaterializationRun | None = None
        self._failures_in_a_row = 0
        self._failure: MaterializationFailedError | None = None
        self._completed = 0
        self._skipped = 0
        self._started = 0
        self._bytes_written = 0

    def take_due(self) -> bool:
        """Whether the timer marked a materialization as due (the mark is taken)."""
        if self.timer.due.is_set():
            self.timer.due.clear()
            return True
        return False

    def skipped(self) -> None:
        """A due materialization had nothing to write."""
        self._skipped += 1

    def start(self, materialization_id: int, upto: SequenceNumber, changed: set[int],
              journal_cut: int, write: Callable[[], SnapshotHandle]) -> Future[SnapshotHandle]:
        """Run ``write`` in the background as materialization ``materialization_id``."""
        assert self.running is None, "one materialization at a time"
        logger.info("%s: materialization %d of %d key groups started", self._owner,
                    materialization_id, len(changed))
        self._started += 1
        future = self._executor.submit(write)
        self.running = MaterializationRun(future, materialization_id, upto, changed,
                                          journal_cut, time.monotonic())
        return future

    def started_elsewhere(self) -> None:
        """A materialization of this backend's state is written elsewhere (counted)."""
        self._started += 1

    def completed_elsewhere(self, bytes_written: int) -> None:
        """A materialization written elsewhere was applied (counted, with its bytes)."""
        self._completed += 1
        self._bytes_written += bytes_written

    def finished(self) -> MaterializationRun | None:
        """The running materialization if it has finished (it is no longer running).

        A failure counts against the budget (see :meth:`check`); a success resets it.
        """
        run = self.running
        if run is None or not run.future.done():
            return None
        self.running = None
        error = run.future.exception()
        seconds = time.monotonic() - run.started
        if error is None:
            self._failures_in_a_row = 0
            self._completed += 1
            written = [c for c in run.future.result().chunks
                       if c.materialization_id == run.materialization_id]
            self._bytes_written += sum(c.size for c in written)
            logger.info("%s: materialization %d done in %.3f s (%d chunks written, %d bytes)",
                        self._owner, run.materialization_id, seconds, len(written),
                        sum(c.size for c in written))
            return run
        self._failures_in_a_row += 1
        logger.warning("%s: materialization %d failed after %.3f s (%d in a row, %d allowed): "
                       "%s", self._owner, run.materialization_id, seconds,
                       self._failures_in_a_row, self.config.max_failures_allowed, error)
        if self._failures_in_a_row > self.config.max_failures_allowed:
            self._failure = MaterializationFailedError(
                f"materialization of backend {self._owner} failed {self._failures_in_a_row} "
                f"times in a row (max_failures_allowed={self.config.max_failures_allowed}): "
                f"{error}")
            self._failure.__cause__ = error
        return run

    def check(self) -> None:
        """Raise :class:`MaterializationFailedError` once the failure budget is spent."""
        if self._failure is not None:
            raise self._failure

    def in_background(self, work: Callable[..., Any], *args: Any) -> None:
        """Run housekeeping on the background thread (after the running write)."""
        self._executor.submit(work, *args)

    @property
    def stats(self) -> MaterializationStats:
        """Completed, consecutive failed and skipped materializations."""
        return MaterializationStats(self._completed, self._failures_in_a_row, self._skipped,
                                    self._started, self._bytes_written)

    def close(self) -> None:
        """Stop the timer and wait for background work."""
        self.timer.stop()
        self._executor.shutdown(wait=True)
