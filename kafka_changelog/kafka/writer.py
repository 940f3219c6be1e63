"""The Kafka writer: change sets become batched records; a persist waits for their acks."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from ..buffering_writer import BufferingChangelogWriter
from ..change import META_KEY_GROUP
from ..change_set import ChangeSet
from ..keygroups import KeyGroupRange, key_groups_of_partition, partition_for_key_group
from ..registry import ChangelogRegistry
from ..sequence import SequenceNumber
from .handle import KafkaChangelogHandle, PartitionRange
from .producer import DeliveryCallback, SharedProducer
from .record_format import ChangeColumns, encode_records


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
        # Partition of key group kg at [kg + 1]; [0] is the meta changes' partition.
        self._partition_lookup = np.array(
            [self._meta_partition, *(partition_for_key_group(kg, partitions, max_parallelism)
                                     for kg in range(max_parallelism))],
            np.int16 if partitions < 2**15 else np.int32)

    def _upload(self, change_sets: Sequence[ChangeSet]) -> list[Future[KafkaLocation]]:
        # Column by column (see record_format.encode_records): the changes of all sets
        # in partition order, each partition's slice in the logged order.
        trackers: dict[int, _SetTracker] = {}
        sqn_parts, index_parts, group_parts = [], [], []
        for change_set in change_sets:
            size = len(change_set)
            groups = np.asarray(change_set.key_groups, np.int64)
            sqn = change_set.sequence_number.value
            sqn_parts.append(np.full(size, sqn, np.int64))
            index_parts.append(np.arange(size, dtype=np.int64))
            group_parts.append(groups)
            future: Future[KafkaLocation] = Future()
            future.set_running_or_notify_cancel()
            trackers[sqn] = _SetTracker(future, bool((groups == META_KEY_GROUP).any()))
        key_groups = np.concatenate(group_parts)
        partitions = self._partition_lookup[key_groups + 1]
        sequence_numbers = np.concatenate(sqn_parts)
        indexes = np.concatenate(index_parts)
        payload_list = (change_sets[0].payloads if len(change_sets) == 1 else
                        list(chain.from_iterable(cs.payloads for cs in change_sets)))
        if len(partitions) > 1 and (np.diff(partitions) < 0).any():
            # Small ints: a radix sort. Stable, so each partition keeps the logged order.
            # The payloads are reordered as a list: cheaper than moving their bytes.
            order = np.argsort(partitions, kind="stable")
            payload_list = [payload_list[i] for i in order.tolist()]
            sequence_numbers, indexes = sequence_numbers[order], indexes[order]
            key_groups, partitions = key_groups[order], partitions[order]
        # Each partition's first row starts a record of its own.
        breaks = (np.flatnonzero(np.diff(partitions)) + 1).tolist()
        planned = [
            (int(partitions[first]), record) for first, record in encode_records(
                self.log_id, ChangeColumns(sequence_numbers, indexes, key_groups, payload_list),
                self._max_record_bytes, breaks)
        ]
        for _, record in planned:
            for sqn in record.members:
                trackers[sqn].remaining += 1
        for partition, record in planned:
            self._producer.produce(
                self._topic, partition, record,
                self._on_record_done(partition, len(record.value),
                                     [trackers[s] for s in record.members]),
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
