"""The checkpoint properties that record time (strings of ms since the epoch).

A stream processor records, with each checkpoint, the processing time of the batch that
committed it (what TTL and processing-time timers followed; readers take it as "now"
when they hide expired entries) and the event-time watermark after that batch (what the
next batch fires event-time timers against).
"""

from __future__ import annotations

from collections.abc import Mapping

PROCESSING_TIME_PROPERTY = "time.processing_ms"
WATERMARK_PROPERTY = "time.watermark_ms"


def recorded_time(properties: Mapping[str, str], name: str) -> int | None:
    """The time property ``name`` of a checkpoint (None: not recorded)."""
    value = properties.get(name)
    return None if value is None else int(value)


__all__ = ["PROCESSING_TIME_PROPERTY", "WATERMARK_PROPERTY", "recorded_time"]
