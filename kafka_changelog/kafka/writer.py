"""The Kafka writer: change sets become batched records; a persist waits for their acks."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..buffering_writer import BufferingChangelogWriter
from ..change import META_KEY_GROUP
from ..change_set import ChangeSet
from ..keygroups import KeyGroupRange, key_groups_of_partition, partition_for_key_group
from ..registry import ChangelogRegistry
from ..sequence import SequenceNumber
from .handle import KafkaChangelogHandle, PartitionRange
from .producer import DeliveryCallback, SharedProducer
from .record_format import RawChange, split_into_records


@dataclass(frozen=True, slots=True)
class RecordLocation:
    """One record holding changes of a change set."""

    partition: int
    offset: int
    value_bytes: int


@dataclass(frozen=True, slots=True)
class KafkaLocation:
    """Where a persisted change set lives: the records holding its changes."""

    records: tuple[RecordLocation, ...]
    has_meta: bool


@dataclass
class _SetTracker:
    """Collects the acks of the records a change set is spread over."""

    future: Future[KafkaLocation]
    has_meta: bool
    remaining: int = 0
    records: list[RecordLocation] = field(default_factory=list)
    error: Exception | None = None

    def record_done(self, location: RecordLocation | None, error: Exception | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        if location is not None:
            self.records.append(location)
        self.remaining -= 1
        if self.remaining == 0:
            if self.error is not None:
                self.future.set_exception(self.error)
            else:
                self.future.set_result(KafkaLocation(tuple(self.records), self.has_meta))


class KafkaChangelogWriter(BufferingChangelogWriter[KafkaChangelogHandle, KafkaLocation]):
    """Writes one operator's changes to the shared changelog topic.

    Changes go to the partition of their key group (meta changes to the
    partition of the range's first key group); one record holds many changes of
    one partition, possibly from several change sets, each change tagged with its
    sequence number and position so that restore can put them back in order.
    """

    def __init__(
        self,
        log_id: str,
        key_group_range: KeyGroupRange,
        registry: ChangelogRegistry[KafkaLocation],
        producer: SharedProducer,
        topic: str,
        partitions: int,
        max_parallelism: int,
        max_record_bytes: int,
        preemptive_persist_threshold_bytes: int | None,
    ) -> None:
        super().__init__(log_id, key_group_range, registry, preemptive_persist_threshold_bytes)
        self._producer = producer
        self._topic = topic
        self._partitions = partitions
        self._max_parallelism = max_parallelism
        self._max_record_bytes = max_record_bytes
        first = key_group_range.start if not key_group_range.is_empty else 0
        self._meta_partition = partition_for_key_group(first, partitions, max_parallelism)
        self._partition_of = {
            kg: partition_for_key_group(kg, partitions, max_parallelism)
            for kg in key_group_range
        }

    def _upload(self, change_sets: Sequence[ChangeSet]) -> list[Future[KafkaLocation]]:
        by_partition: dict[int, list[RawChange]] = {}
        trackers: dict[int, _SetTracker] = {}
        partition_of, meta_partition = self._partition_of, self._meta_partition
        for change_set in change_sets:
            sqn = change_set.sequence_number.value
            has_meta = False
            for index, (key_group, payload) in enumerate(change_set.changes):
                if key_group == META_KEY_GROUP:
                    partition = meta_partition
                    has_meta = True
                else:
                    partition = partition_of[key_group]
                bucket = by_partition.get(partition)
                if bucket is None:
                    bucket = by_partition[partition] = []
                bucket.append((sqn, index, key_group, payload))
            future: Future[KafkaLocation] = Future()
            future.set_running_or_notify_cancel()
            trackers[sqn] = _SetTracker(future, has_meta)

        planned = [
            (partition, record, record.members)
            for partition in sorted(by_partition)
            for record in split_into_records(
                self.log_id, by_partition[partition], self._max_record_bytes)
        ]
        for _, _, members in planned:
            for sqn in members:
                trackers[sqn].remaining += 1
        for partition, record, members in planned:
            self._producer.produce(
                self._topic, partition, record,
                self._on_record_done(partition, len(record.value), [trackers[s] for s in members]),
            )
        return [trackers[cs.sequence_number.value].future for cs in change_sets]

    def _on_record_done(
        self, partition: int, size: int, trackers: list[_SetTracker]
    ) -> DeliveryCallback:
        def done(offset: int | None, error: Exception | None) -> None:
            location = RecordLocation(partition, offset, size) if offset is not None else None
            for tracker in trackers:
                tracker.record_done(location, error)

        return done

    def _make_handle(
        self, parts: Sequence[tuple[SequenceNumber, KafkaLocation]], checkpoint_id: int
    ) -> KafkaChangelogHandle:
        spans: dict[int, tuple[int, int]] = {}
        sizes: dict[tuple[int, int], int] = {}
        has_meta = False
        for _, location in parts:
            has_meta = has_meta or location.has_meta
            for rec in location.records:
                low, high = spans.get(rec.partition, (rec.offset, rec.offset))
                spans[rec.partition] = (min(low, rec.offset), max(high, rec.offset))
                sizes[(rec.partition, rec.offset)] = rec.value_bytes
        ranges = []
        for partition, (low, high) in spans.items():
            groups = key_groups_of_partition(
                partition, self._partitions, self._max_parallelism
            ).intersection(self.key_group_range)
            ranges.append(PartitionRange(
                partition, low, high + 1, groups,
                sum(size for (p, _), size in sizes.items() if p == partition),
            ))
        first = parts[0][0].value if parts else 0
        last = parts[-1][0].value if parts else -1
        return KafkaChangelogHandle(
            self.log_id, self._topic, self.key_group_range, ranges, first, last,
            self._meta_partition if has_meta else None, checkpoint_id,
        )
