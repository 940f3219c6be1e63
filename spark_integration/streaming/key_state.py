"""What a stateful function sees besides its rows: the state of its key, the batch's
context (ids, processing time, watermark) and its key's timers.

No Spark here: the tester (:mod:`spark_integration.streaming.tester`) gives functions
exactly these objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka_changelog.enums import StrEnum
from kafka_changelog.errors import ChangelogError
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.schema.descriptors import StateDescriptor
from kafka_changelog.state.time.timers import TimeDomain, TimerService

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def to_ms(when: Any) -> int:
    """``when`` as ms since the epoch: an int (ms), a ``datetime`` (naive: UTC) or a
    ``pandas.Timestamp``."""
    if isinstance(when, bool):
        raise TypeError("a time must be ms since the epoch or a datetime, got a bool")
    if isinstance(when, int):
        return when
    if isinstance(when, dt.datetime):  # pandas.Timestamp is one
        aware = when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)
        return (aware - _EPOCH) // dt.timedelta(milliseconds=1)
    item = getattr(when, "item", None)  # a numpy integer
    if item is not None and isinstance(item(), int):
        return int(item())
    raise TypeError(f"a time must be ms since the epoch or a datetime, got {when!r}")


def from_ms(ms: int) -> dt.datetime:
    """ms since the epoch as an aware UTC ``datetime``."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


@dataclass(frozen=True)
class BatchContext:
    """The micro-batch a call belongs to. Fixed for the batch: a re-run of the batch sees
    the same processing time (recorded with its checkpoint) and the same watermark."""

    #: Spark's batch id.
    batch_id: int
    #: The checkpoint the batch commits.
    checkpoint_id: int
    #: The batch's processing time, ms since the epoch: what TTL and processing-time
    #: timers follow (never earlier than the previous batch's).
    processing_time_ms: int
    #: The event-time watermark of the batch (ms since the epoch; None: no event time
    #: declared, or no event seen yet): event-time timers at or before it fire.
    watermark_ms: int | None = None

    @property
    def processing_time(self) -> dt.datetime:
        """:attr:`processing_time_ms` as an aware UTC ``datetime``."""
        return from_ms(self.processing_time_ms)

    @property
    def watermark(self) -> dt.datetime | None:
        """:attr:`watermark_ms` as an aware UTC ``datetime`` (None: none yet)."""
        return None if self.watermark_ms is None else from_ms(self.watermark_ms)


class LateRows(StrEnum):
    """What happens to a row whose event time is before the batch's watermark."""

    #: Dropped before the function sees it, and counted (``SubtaskMetrics.late_rows``).
    DROP = "drop"
    #: Given to the function like any row, and counted.
    PASS = "pass"


@dataclass(frozen=True)
class EventTime:
    """An event-time column and how late its events may be (Spark's ``withWatermark``:
    the watermark is the largest event time seen minus ``delay_ms``, never decreasing)."""

    column: str
    delay_ms: int
    late_rows: LateRows = LateRows.DROP

    def __post_init__(self) -> None:
        if not self.column:
            raise ValueError("the event-time column must be named")
        if self.delay_ms < 0:
            raise ValueError(f"the watermark delay of event-time column {self.column!r} "
                             f"must be >= 0, got {self.delay_ms} ms")
        object.__setattr__(self, "late_rows", LateRows(self.late_rows))

    @staticmethod
    def of(column: str, delay: dt.timedelta | float, late_rows: LateRows | str = LateRows.DROP
           ) -> EventTime:
        """``delay`` as a ``timedelta`` or seconds."""
        seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)
        return EventTime(column, round(seconds * 1000), LateRows(late_rows))


@dataclass(frozen=True)
class TimerInfo:
    """A timer that fired, as ``on_timer`` gets it."""

    time_ms: int
    domain: TimeDomain

    @property
    def time(self) -> dt.datetime:
        """:attr:`time_ms` as an aware UTC ``datetime``."""
        return from_ms(self.time_ms)


class TimerOutsideCallError(ChangelogError, RuntimeError):
    """A timer was registered, deleted or listed outside a call of the stateful function
    (no key is current then)."""


class EventTimeNotDeclaredError(ChangelogError, ValueError):
    """An event-time timer without an event-time column declared (it would never fire)."""


class KeyTimers:
    """The current key's timers, from within a call of the stateful function (or of
    ``on_timer``). Times are ms since the epoch or datetimes."""

    def __init__(self, backend: ChangelogKeyedStateBackend, event_time: EventTime | None,
                 in_call: Callable[[], bool]) -> None:
        self._backend = backend
        self._event_time = event_time
        self._in_call = in_call

    def service(self, action: str) -> TimerService:
        """The backend's timer service, for ``action`` ("registered", ...) now: raises
        :class:`TimerOutsideCallError` outside a call."""
        if not self._in_call():
            raise TimerOutsideCallError(
                f"a timer can be {action} only during a call of the stateful function or "
                "of on_timer, for the key of that call")
        return self._backend.timers

    def event_service(self, action: str) -> TimerService:
        """:meth:`service` for event-time timers: raises
        :class:`EventTimeNotDeclaredError` without an event-time column."""
        if self._event_time is None:
            raise EventTimeNotDeclaredError(
                f"an event-time timer was {action}, but no event-time column is declared: "
                "pass event_time=EventTime.of(column, delay) to stateful_foreach_batch")
        return self.service(action)

    def register_processing_time(self, when: Any) -> None:
        """Fire ``on_timer`` for this key in the first batch whose processing time is at
        or after ``when``."""
        self.service("registered").register(TimeDomain.PROCESSING_TIME, to_ms(when))

    def register_event_time(self, when: Any) -> None:
        """Fire ``on_timer`` for this key in the first batch whose watermark is at or
        after ``when``."""
        self.event_service("registered").register(TimeDomain.EVENT_TIME, to_ms(when))

    def delete_processing_time(self, when: Any) -> None:
        """Delete this key's processing-time timer at ``when`` (no-op if none)."""
        self.service("deleted").delete(TimeDomain.PROCESSING_TIME, to_ms(when))

    def delete_event_time(self, when: Any) -> None:
        """Delete this key's event-time timer at ``when`` (no-op if none)."""
        self.event_service("deleted").delete(TimeDomain.EVENT_TIME, to_ms(when))

    def list(self) -> list[TimerInfo]:
        """This key's timers, processing time first, each by time."""
        return [TimerInfo(t.time_ms, t.domain) for t in self.service("listed").of_current_key()
                if t.domain is not TimeDomain.EXPIRY]


class KeyState:
    """What the per-key function gets: state objects scoped to the current key
    (``state(descriptor)``), the batch's :attr:`context` and the key's :attr:`timers`."""

    def __init__(self, backend: ChangelogKeyedStateBackend, context: BatchContext | None = None,
                 event_time: EventTime | None = None) -> None:
        self._backend = backend
        self._calling = False
        #: The batch this call belongs to.
        self.context = context
        #: The current key's timers.
        self.timers = KeyTimers(backend, event_time, lambda: self._calling)

    def __call__(self, descriptor: StateDescriptor) -> Any:
        """The state object (ValueState, ListState, MapState, ...) for ``descriptor``."""
        return self._backend.state(descriptor)

    def calling(self, active: bool) -> None:
        """Mark a call of the user's function as running (timers are usable) or over."""
        self._calling = active


__all__ = ["BatchContext", "EventTime",
           "EventTimeNotDeclaredError", "KeyState", "KeyTimers", "LateRows", "TimerInfo",
           "TimerOutsideCallError", "from_ms", "to_ms"]
