"""Garbage collection: delete changelog records nobody needs any more.

Per partition the collector finds the lowest offset still needed by a live
writer (the ownership registry) or a retained handle (e.g. of a retained
checkpoint), and calls ``DeleteRecords`` below it; never below anything needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ..errors import ChangelogError
from ..registry import RegistryEntry
from .errors import describe
from .handle import KafkaChangelogHandle
from .writer import KafkaLocation


@dataclass(frozen=True)
class GarbageCollectionResult:
    """Per partition: the new log start offset after deletion."""

    topic: str
    deleted_below: dict[int, int]


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


def list_offsets(
    admin: AdminClient, topic: str, partitions: int, spec: OffsetSpec, timeout_s: float
) -> dict[int, int]:
    """Offsets of every partition for ``spec`` (earliest or latest)."""
    request = {TopicPartition(topic, p): spec for p in range(partitions)}
    futures = admin.list_offsets(request, request_timeout=timeout_s)
    try:
        return {tp.partition: f.result(timeout=timeout_s).offset for tp, f in futures.items()}
    except KafkaException as exc:
        raise ChangelogError(f"cannot list offsets of {topic}: {describe(exc.args[0])}") from exc


def delete_below(
    admin: AdminClient, topic: str, offsets: Mapping[int, int], timeout_s: float
) -> dict[int, int]:
    """``DeleteRecords`` below each offset; returns each partition's new log start."""
    if not offsets:
        return {}
    request = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    futures = admin.delete_records(request, request_timeout=timeout_s)
    result = {}
    try:
        for tp, future in futures.items():
            result[tp.partition] = future.result(timeout=timeout_s).low_watermark
    except KafkaException as exc:
        raise ChangelogError(
            f"DeleteRecords on {topic} failed: {describe(exc.args[0])}") from exc
    return result
