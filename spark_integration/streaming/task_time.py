"""What a task does with the batch's time: late rows against the watermark, and the due
timers fired after the batch's rows (per key, or once for a vectorised function)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kafka_changelog.errors import ChangelogError
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.time.timers import TimeDomain

from .event_times import event_times_ms
from .key_runs import key_value_of
from .key_state import BatchContext, EventTime, KeyState, LateRows, TimerInfo
from .output_rows import output_records
from .vectorized import VectorizedTimerFunction, call_vectorized_timers

logger = logging.getLogger(__name__)

#: ``on_timer(key, timer, state) -> output rows``: called for each of a key's timers when
#: it is due (after the batch's rows), with the key as the stateful function gets it.
TimerFunction = Callable[[Any, TimerInfo, KeyState], Any]


@dataclass(frozen=True)
class TaskTime:
    """The batch's time as its tasks see it, and what they do with it."""

    context: BatchContext
    event_time: EventTime | None = None
    on_timer: TimerFunction | VectorizedTimerFunction | None = None
    #: The key columns' Spark types (``on_timer`` gets keys decoded with them).
    key_types: tuple[str, ...] = ()


def split_late_rows(rows: pd.DataFrame, time: TaskTime, batch_id: int
                    ) -> tuple[pd.DataFrame, int, int | None]:
    """The rows the function gets (late ones dropped by the default policy), how many were
    late (event time before the batch's watermark), and the largest event time (ms).

    The event-time column may have any timestamp unit (:func:`~.event_times.event_times_ms`);
    one that holds no timestamps raises ``EventTimeColumnError`` naming it and its dtype."""
    event_time = time.event_time
    assert event_time is not None
    times = rows[event_time.column]
    nulls = int(times.isna().sum())
    if nulls:
        raise ChangelogError(
            f"batch {batch_id}: {nulls} rows have a null in event-time "
            f"column {event_time.column!r}: an event without a time has no place in event "
            "time; filter or fill them first")
    ms = event_times_ms(times, event_time.column)
    watermark = time.context.watermark_ms
    late_mask = ms < watermark if watermark is not None else None
    late = int(late_mask.sum()) if late_mask is not None else 0
    max_event = int(ms.max()) if len(ms) else None
    if late and event_time.late_rows is LateRows.DROP:
        assert late_mask is not None
        rows = rows[~late_mask]
    return rows, late, max_event


def fire_timers(backend: ChangelogKeyedStateBackend, state: KeyState, time: TaskTime,
                outputs: list[dict[str, Any]], columns: Set[str], vectorized: bool,
                batch_id: int) -> int:
    """Call ``on_timer`` for each due timer (processing time, then event time), with the
    timer's key current (vectorised: once with all of them); returns how many fired.
    Timers registered while firing at a time already passed fire in the next batch."""
    context = time.context
    due = backend.due_timers(TimeDomain.PROCESSING_TIME, context.processing_time_ms)
    if time.event_time is not None and context.watermark_ms is not None:
        due += backend.due_timers(TimeDomain.EVENT_TIME, context.watermark_ms)
    if not due:
        return 0
    on_timer = time.on_timer
    if on_timer is None:
        logger.warning("batch %d: %d timers fired but no on_timer function was given: they "
                       "are dropped", batch_id, len(due))
        return len(due)

    def key_value(key: bytes) -> Any:
        return key_value_of(key, time.key_types) if time.key_types else key

    if vectorized:
        outputs.extend(call_vectorized_timers(
            on_timer, backend, due, key_value, state, columns))  # type: ignore[arg-type]
        return len(due)
    per_key: TimerFunction = on_timer  # type: ignore[assignment]
    for timer in due:
        backend.set_current_key(timer.key, timer.key_group)
        key = key_value(timer.key)
        state.calling(True)
        try:
            produced = per_key(key, TimerInfo(timer.time_ms, timer.domain), state)
        finally:
            state.calling(False)
        if produced is not None:
            outputs.extend(output_records(produced, columns, key))
    return len(due)


__all__ = ["TaskTime", "TimerFunction", "fire_timers", "split_late_rows"]
