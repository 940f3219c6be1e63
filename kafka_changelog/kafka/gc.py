"""Garbage collection: delete changelog records nobody needs any more.

Per partition the collector finds the lowest offset still needed by a live
writer (the ownership registry) or a retained handle (e.g. of a retained
checkpoint), and calls ``DeleteRecords`` below it; never below anything needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..registry import RegistryEntry
from .handle import KafkaChangelogHandle
from .writer import KafkaLocation


def lowest_needed_offsets(
    high_watermarks: Mapping[int, int],
    live_entries: Iterable[RegistryEntry[KafkaLocation]],
    retained_handles: Iterable[KafkaChangelogHandle],
    topic: str,
) -> dict[int, int]:
    """Per partition the smallest offset anything still needs (the high watermark if none)."""
    needed = dict(high_watermarks)
    for entry in live_entries:
        for record in entry.location.records:
            needed[record.partition] = min(needed[record.partition], record.offset)
    for handle in retained_handles:
        if handle.topic != topic:
            continue
        for r in handle.ranges:
            if r.end_offset > r.start_offset:
                needed[r.partition] = min(needed[r.partition], r.start_offset)
    return needed
