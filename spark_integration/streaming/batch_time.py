"""The driver's decisions about time: a batch's processing time and watermark, taken
from the checkpoints so that a re-run batch sees exactly what its first run saw, and the
event-time column checked before any task runs.

Each committed checkpoint records the processing time of its batch and the watermark
after it (``time.processing_ms``, ``time.watermark_ms``). A batch's watermark is the one
its base checkpoint recorded (Spark's semantics: the watermark a batch uses comes from
the event times of the batches before it); the next watermark is the largest event time
the batch's subtasks saw minus the allowed delay, never below the previous one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from kafka_changelog.errors import ChangelogError
from kafka_changelog.state.checkpoints.checkpoint_store import CheckpointStore
from kafka_changelog.state.checkpoints.subtask_commit import SubtaskCommit
from kafka_changelog.state.checkpoints.time_properties import (
    PROCESSING_TIME_PROPERTY,
    WATERMARK_PROPERTY,
    recorded_time,
)

from .batch_identity import BatchPlan
from .key_state import BatchContext, EventTime
from .metrics import SubtaskMetrics

#: Spark types an event-time column may have.
EVENT_TIME_TYPES = ("timestamp", "timestamp_ntz")


class EventTimeColumnError(ChangelogError, ValueError):
    """The declared event-time column is missing from the batch or is not a timestamp."""


def check_event_time_column(schema: Any, event_time: EventTime) -> None:
    """Refuse a batch whose event-time column is missing or not a timestamp, naming it."""
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    found = fields.get(event_time.column)
    if found is None:
        raise EventTimeColumnError(
            f"event-time column {event_time.column!r} is not a column of the batch "
            f"(columns: {sorted(fields)})")
    if found not in EVENT_TIME_TYPES:
        raise EventTimeColumnError(
            f"event-time column {event_time.column!r} is {found}, expected a timestamp "
            "(cast it, e.g. F.col(...).cast('timestamp'))")


def wall_clock_ms() -> int:
    """The wall clock, ms since the epoch."""
    return int(time.time() * 1000)


def batch_context(checkpoints: CheckpointStore, application: str, plan: BatchPlan,
                  batch_id: int, reused: Iterable[SubtaskCommit] = (),
                  clock: Callable[[], int] = wall_clock_ms) -> BatchContext:
    """The context of batch ``batch_id`` planned as ``plan``: a re-run of a committed batch
    takes the processing time its checkpoint recorded; a batch some of whose subtasks
    committed before a crash takes theirs; a new batch takes the wall clock, never before
    its base's."""
    base = checkpoints.get(application, plan.base) if plan.base is not None else None
    base_properties = base.properties if base is not None else {}
    watermark = recorded_time(base_properties, WATERMARK_PROPERTY)
    processing: int | None = None
    if not plan.commit:
        committed = checkpoints.get(application, plan.checkpoint_id)
        processing = recorded_time(committed.properties, PROCESSING_TIME_PROPERTY)
    for commit in reused:
        processing = SubtaskMetrics.from_json(commit.metrics).processing_time_ms or processing
        break
    if processing is None:
        now = clock()
        processing = max(now, recorded_time(base_properties, PROCESSING_TIME_PROPERTY) or now)
    return BatchContext(batch_id, plan.checkpoint_id, processing, watermark)


def next_watermark(context: BatchContext, event_time: EventTime | None,
                   metrics: Iterable[SubtaskMetrics]) -> int | None:
    """The watermark after the batch: the largest event time seen minus the delay, never
    below the batch's own (None: no event time, or none seen yet)."""
    if event_time is None:
        return None
    seen = [m.max_event_time_ms for m in metrics if m.max_event_time_ms is not None]
    if not seen:
        return context.watermark_ms
    candidate = max(seen) - event_time.delay_ms
    current = context.watermark_ms
    return candidate if current is None else max(current, candidate)


def time_properties(context: BatchContext, watermark: int | None) -> dict[str, str]:
    """What the batch's checkpoint records of time."""
    recorded = {PROCESSING_TIME_PROPERTY: str(context.processing_time_ms)}
    if watermark is not None:
        recorded[WATERMARK_PROPERTY] = str(watermark)
    return recorded


__all__ = ["EVENT_TIME_TYPES", "EventTimeColumnError", "batch_context",
           "check_event_time_column", "next_watermark", "time_properties", "wall_clock_ms"]
