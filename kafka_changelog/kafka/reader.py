"""Reading handles back: seek each range, keep the writer's changes, restore their order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ..change import META_KEY_GROUP, StateChange, new_unchecked
from ..errors import ChangelogError, ChangelogTruncatedError, RecordDecodeError
from ..reader import StateChangelogReader, wrong_handle
from .config import KafkaChangelogConfig
from .consume import BATCH, consume_range, end_of_partition
from .error_text import access_error, describe, is_access_error
from .handle import KafkaChangelogHandle, PartitionRange
from .live_clients import new_consumer
from .offsets import watermarks
from .record_format import UnknownSchemaError, check_schema_header, decode_record_fields
from .spill_sort import BUDGET_BYTES, Entry, SpillingSorter


class KafkaChangelogReader(StateChangelogReader[KafkaChangelogHandle]):
    """Reads the changes of Kafka handles with reused consumers (read-only: READ ACLs).

    A handle of several ranges is read with two consumers: while one reads a range, the
    other is already fetching the next one, so each move to another partition costs no
    fetch round trip.

    Memory is bounded whatever the length of a handle's tail: the changes read are
    held up to ``memory_budget_bytes`` (payloads plus ~100 bytes a change), then sorted
    and spilled to a temporary file in ``spill_directory`` (default: the system's
    temporary directory) as a sorted run; the runs are merged while iterating, one
    64-KiB chunk of each in memory (see :mod:`.spill_sort`). Records are fetched at
    most ``memory_budget_bytes / 4`` at a time (by ``max_record_bytes``). So a read
    holds at most about 1.25 x the budget plus 64 KiB per spilled run (tail / budget
    runs), plus librdkafka's prefetch queue (``queued.max.messages.kbytes``). Below the
    budget nothing is written to disk.
    """

    def __init__(self, config: KafkaChangelogConfig, timeout_s: float | None = None,
                 memory_budget_bytes: int = BUDGET_BYTES,
                 spill_directory: str | None = None) -> None:
        self._budget = memory_budget_bytes
        self._spill_directory = spill_directory
        #: Sorted runs the last :meth:`read` spilled to disk, and its peak of bytes held.
        self.spilled_runs = 0
        self.peak_held_bytes = 0
        self._config = config
        self._timeout = timeout_s if timeout_s is not None else config.request_timeout_s
        self._consumer = new_consumer(config.consumer(),
                                      f"reader of changelog topic {config.topic}")
        self._spare: Consumer | None = None
        self._last_value_bytes = 0
        # Records held at once by a consume call: a quarter of the budget at most.
        self._batch = min(BATCH, max(1, memory_budget_bytes // 4 // config.max_record_bytes))
        self.records_read = 0
        self.bytes_read = 0

    def read(self, handle: KafkaChangelogHandle) -> Iterator[StateChange]:
        """The handle's changes in sequence order (append order within a change set).

        Partitions are not sorted runs (a writer may persist later change sets before
        earlier ones, and a retried upload sends sets again), so every change of the
        handle is read before the first is yielded: memory stays within the reader's
        budget by spilling sorted runs to disk (see the class). Raises
        :class:`ChangelogTruncatedError` when a range starts below the partition's log
        start offset, and :class:`RecordDecodeError` naming the offset of a record that
        cannot be decoded.
        """
        if not isinstance(handle, KafkaChangelogHandle):
            raise wrong_handle(self, handle)
        collected = SpillingSorter(self._budget, self._spill_directory)
        ranges = [r for r in handle.ranges if r.end_offset > r.start_offset]
        consumers = [self._consumer]
        if len(ranges) > 1:
            if self._spare is None:
                self._spare = new_consumer(self._config.consumer(),
                                           f"reader of changelog topic {self._config.topic}")
            consumers.append(self._spare)
        try:
            for index, partition_range in enumerate(ranges):
                consumer = consumers[index % len(consumers)]
                if index == 0:
                    _assign(consumer, handle.topic, partition_range)
                if index + 1 < len(ranges):  # fetched while this one is read
                    _assign(consumers[(index + 1) % 2], handle.topic, ranges[index + 1])
                self._read_range(handle, partition_range, collected, consumer)
            self.spilled_runs = collected.spilled_runs
            # Equal (sequence number, position) pairs are copies from retried uploads.
            previous = None
            for sqn, position, key_group, payload in collected.sorted():
                if (sqn, position) != previous:
                    previous = (sqn, position)
                    yield new_unchecked(StateChange, (key_group, payload))
        finally:
            self.peak_held_bytes = collected.peak_held_bytes
            collected.close()  # deletes the spilled runs, also on errors

    def _read_range(
        self,
        handle: KafkaChangelogHandle,
        r: PartitionRange,
        collected: SpillingSorter,
        consumer: Consumer,
    ) -> None:
        first_sqn, last_sqn = handle.from_sequence_number, handle.to_sequence_number
        lowest, highest = handle.key_group_range.start, handle.key_group_range.end
        for _, changes in self.log_records(handle.topic, r, handle.log_id, consumer):
            kept: list[Entry] = []
            keep = kept.append
            for c in changes:
                sqn, key_group = c["sequence_number"], c["key_group"]
                if first_sqn <= sqn <= last_sqn and (
                    key_group == META_KEY_GROUP or lowest <= key_group <= highest
                ):
                    keep((sqn, c["index"], key_group, c["payload"]))
            # The record's value bounds its kept payloads: counted once per record.
            collected.extend(kept, self._last_value_bytes)

    def log_records(
        self, topic: str, r: PartitionRange, log_id: str, consumer: Consumer | None = None,
    ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """(offset, decoded changes) of every record of ``log_id`` in ``r``, in offset order.

        A range below the log start raises :class:`ChangelogTruncatedError`, one past
        the log end says records were lost; both are found when reading fails (the
        watermarks are only asked for then: one round trip per range less on every
        restore). Skips other logs' records, and refuses unknown schemas and undecodable
        values naming the offset. ``consumer``: one already assigned at the range's start
        (default: the reader's own, assigned here).
        """
        for offset, value in self.log_values(topic, r, log_id, consumer):
            yield offset, decode_log_record(topic, r.partition, offset, value, log_id)

    def log_values(
        self, topic: str, r: PartitionRange, log_id: str, consumer: Consumer | None = None,
    ) -> Iterator[tuple[int, bytes]]:
        """(offset, value) of every record of ``log_id`` in ``r``, in offset order, values
        not decoded: :meth:`log_records` without the decoding (its errors otherwise, the
        schema header checked), for readers that decode values themselves."""
        log_key = log_id.encode()

        def on_error(error: KafkaError, position: int) -> int:
            return self._after_error(topic, r, log_id, position, error)

        for message in consume_range(consumer or self._consumer, topic, r.partition,
                                     r.start_offset, r.end_offset, self._timeout, on_error,
                                     assigned=consumer is not None, batch=self._batch):
            if message.key() != log_key:
                continue
            offset = message.offset() or 0
            value = message.value() or b""
            self.records_read += 1
            self.bytes_read += len(value)
            self._last_value_bytes = len(value)
            try:
                headers = message.headers()
                check_schema_header(
                    list(headers.items()) if isinstance(headers, dict) else headers)
            except UnknownSchemaError as exc:
                raise RecordDecodeError(topic, r.partition, offset, str(exc)) from exc
            yield offset, value

    def _after_error(
        self, topic: str, r: PartitionRange, log_id: str, position: int, error: KafkaError
    ) -> int:
        if end_of_partition(error):
            # Gaps (transaction markers, compaction) end a range early: the position is
            # the log end. Short of the range's end: were records lost?
            if position < r.end_offset:
                self._check_range(topic, r, log_id)
            return position
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            # The offset is out of the log's range: below its start, or past its end.
            low = self._check_range(topic, r, log_id)
            raise ChangelogTruncatedError(topic, r.partition, position, low)
        if is_access_error(error):
            raise access_error(error, f"reading {topic}[{r.partition}]", operation="READ",
                               resource=topic)
        raise ChangelogError(
            f"reading {topic}[{r.partition}] at offset {position} failed: {describe(error)}"
        )

    def _check_range(self, topic: str, r: PartitionRange, log_id: str) -> int:
        """Raise if the partition's log no longer holds all of ``r``; else its log start."""
        low, high = self._watermarks(topic, r.partition)
        if r.start_offset < low:
            raise ChangelogTruncatedError(topic, r.partition, r.start_offset, low)
        if r.end_offset > high:
            raise ChangelogError(
                f"changelog {topic}[{r.partition}] ends at offset {high} but log {log_id} "
                f"needs records up to offset {r.end_offset - 1}: "
                "records were lost (unclean leader election or a recreated topic?)"
            )
        return low

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        return watermarks(self._consumer, topic, partition, self._timeout)

    def close(self) -> None:
        """Close the consumers."""
        self._consumer.close()
        if self._spare is not None:
            self._spare.close()


def decode_log_record(topic: str, partition: int, offset: int, value: bytes,
                      log_id: str) -> list[dict[str, Any]]:
    """The changes (Avro field dicts) of the record of ``log_id`` at ``offset``;
    :class:`RecordDecodeError` naming the offset if it does not decode or names another log."""
    try:
        found, changes = decode_record_fields(value)
    except ValueError as exc:
        raise RecordDecodeError(topic, partition, offset, str(exc)) from exc
    if found != log_id:
        raise RecordDecodeError(
            topic, partition, offset, f"record key says log {log_id} but value says {found}")
    return changes


def _assign(consumer: Consumer, topic: str, r: PartitionRange) -> None:
    consumer.assign([TopicPartition(topic, r.partition, r.start_offset)])
