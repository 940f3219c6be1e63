"""Reading handles back: fetch the ranges together, keep the writer's changes, merge them."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message

from ..change import META_KEY_GROUP, StateChange, new_unchecked
from ..errors import ChangelogError, ChangelogTruncatedError, KafkaAccessError, RecordDecodeError
from ..reader import StateChangelogReader, wrong_handle
from .config import KafkaChangelogConfig
from .consume import consume_range, end_of_partition
from .error_text import describe, is_access_error
from .handle import KafkaChangelogHandle, PartitionRange
from .offsets import watermarks
from .range_fetch import BUFFER_BYTES, RangeFetcher
from .record_format import UnknownSchemaError, check_schema_header, decode_record_fields

#: A decoded entry: (sequence number, index in its change set, key group, payload).
Entry = tuple[int, int, int, bytes]


class KafkaChangelogReader(StateChangelogReader[KafkaChangelogHandle]):
    """Reads the changes of Kafka handles with a reused consumer (read-only: READ ACLs).

    A handle's ranges are fetched together by one consumer and merged as they arrive
    (each partition's changes come in sequence order), so reading streams: memory is
    bounded by ``buffer_bytes`` of record values per partition of the handle, plus
    one consume call (at most 1,000 records) and librdkafka's prefetch queue
    (``queued.max.messages.kbytes``), whatever the length of the handle's tail.
    """

    def __init__(self, config: KafkaChangelogConfig, timeout_s: float | None = None,
                 buffer_bytes: int = BUFFER_BYTES) -> None:
        self._config = config
        self._timeout = timeout_s if timeout_s is not None else config.request_timeout_s
        self._buffer_bytes = buffer_bytes
        self._consumer = Consumer(config.consumer())
        self.records_read = 0
        self.bytes_read = 0
        #: Most record-value bytes buffered at once by the last :meth:`read` (for tests).
        self.peak_buffered_bytes = 0

    def read(self, handle: KafkaChangelogHandle) -> Iterator[StateChange]:
        """The handle's changes in sequence order (append order within a change set).

        Streams: a k-way merge of the partitions' sorted runs, each fetched into a
        buffer of at most ``buffer_bytes`` (see the class). Equal (sequence number,
        index) pairs are copies from retried uploads: one is kept. Raises
        :class:`ChangelogTruncatedError` when a range starts below the partition's log
        start offset, :class:`ChangelogError` when records past the log end were lost
        or a partition's changes are out of sequence order, and
        :class:`RecordDecodeError` naming the offset of a record that cannot be decoded.
        """
        if not isinstance(handle, KafkaChangelogHandle):
            raise wrong_handle(self, handle)
        ranges = [r for r in handle.ranges if r.end_offset > r.start_offset]
        topic, log_id = handle.topic, handle.log_id

        def on_error(error: KafkaError, r: PartitionRange, position: int) -> int:
            return self._after_error(topic, r, log_id, position, error)

        fetcher = RangeFetcher(self._consumer, topic, ranges, self._timeout,
                               self._record_decoder(handle), on_error, self._buffer_bytes)
        try:
            runs = [_sorted_run(topic, r.partition, fetcher) for r in ranges]
            merged: Iterator[Entry] = runs[0] if len(runs) == 1 else heapq.merge(*runs)
            previous = None
            for sqn, position, key_group, payload in merged:
                if (sqn, position) != previous:
                    previous = (sqn, position)
                    yield new_unchecked(StateChange, (key_group, payload))
        finally:
            self.peak_buffered_bytes = fetcher.peak_buffered_bytes
            fetcher.close()

    def _record_decoder(
        self, handle: KafkaChangelogHandle
    ) -> Callable[[PartitionRange, Message], tuple[int, list[Entry]] | None]:
        """(offset, kept entries) of a record of the handle's log; None for others'."""
        first_sqn, last_sqn = handle.from_sequence_number, handle.to_sequence_number
        lowest, highest = handle.key_group_range.start, handle.key_group_range.end
        topic, log_id, log_key = handle.topic, handle.log_id, handle.log_id.encode()

        def decode(r: PartitionRange, message: Message) -> tuple[int, list[Entry]] | None:
            if message.key() != log_key:
                return None
            offset, changes = self._decode(topic, r.partition, log_id, message)
            kept: list[Entry] = []
            keep = kept.append
            for c in changes:
                sqn, key_group = c["sequence_number"], c["key_group"]
                if first_sqn <= sqn <= last_sqn and (
                    key_group == META_KEY_GROUP or lowest <= key_group <= highest
                ):
                    keep((sqn, c["index"], key_group, c["payload"]))
            return (offset, kept) if kept else None

        return decode

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
        log_key = log_id.encode()

        def on_error(error: KafkaError, position: int) -> int:
            return self._after_error(topic, r, log_id, position, error)

        for message in consume_range(consumer or self._consumer, topic, r.partition,
                                     r.start_offset, r.end_offset, self._timeout, on_error,
                                     assigned=consumer is not None):
            if message.key() == log_key:
                yield self._decode(topic, r.partition, log_id, message)

    def _decode(
        self, topic: str, partition: int, log_id: str, message: Message
    ) -> tuple[int, list[dict[str, Any]]]:
        """(offset, changes) of a record of ``log_id``; undecodable: an error naming it."""
        offset = message.offset() or 0
        value = message.value() or b""
        self.records_read += 1
        self.bytes_read += len(value)
        try:
            headers = message.headers()
            check_schema_header(list(headers.items()) if isinstance(headers, dict) else headers)
            found, changes = decode_record_fields(value)
        except (UnknownSchemaError, ValueError) as exc:
            raise RecordDecodeError(topic, partition, offset, str(exc)) from exc
        if found != log_id:
            raise RecordDecodeError(
                topic, partition, offset, f"record key says log {log_id} but value says {found}")
        return offset, changes

    def _after_error(
        self, topic: str, r: PartitionRange, log_id: str, position: int, error: KafkaError
    ) -> int:
        if end_of_partition(error):
            # Gaps (transaction markers, compaction) end a range early: the position is
            # the log end. Short of the range's end: were records lost?
            if position < r.end_offset:
                self._check_range(topic, r, log_id)
            return position
        if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            # librdkafka looks up the group coordinator although readers never commit:
            # no group ACL is needed to read, so this is noise.
            return position
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            # The offset is out of the log's range: below its start, or past its end.
            low = self._check_range(topic, r, log_id)
            raise ChangelogTruncatedError(topic, r.partition, position, low)
        if is_access_error(error):
            raise KafkaAccessError(f"reading {topic}[{r.partition}] failed: {describe(error)}")
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
        """Close the consumer."""
        self._consumer.close()


def _sorted_run(topic: str, partition: int, fetcher: RangeFetcher[tuple[int, list[Entry]]],
                ) -> Iterator[Entry]:
    """One partition's entries, checked to be in sequence order (the merge needs it)."""
    last: Entry | None = None
    while (record := fetcher.next_record(partition)) is not None:
        offset, entries = record
        for entry in entries:
            if last is not None and entry < last:
                # A merge cannot put it back in place: say so rather than misorder.
                raise ChangelogError(
                    f"changelog {topic}[{partition}]@{offset}: change {entry[0]}/{entry[1]} "
                    f"comes after {last[0]}/{last[1]}: the partition is out of sequence order")
            last = entry
            yield entry
