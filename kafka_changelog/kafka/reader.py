"""Reading handles back: seek each range, keep the writer's changes, restore their order."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator, Sequence

from confluent_kafka import KafkaError, Message

from ..avro_columns import padded_join
from ..change import META_KEY_GROUP, StateChange, new_unchecked
from ..change_columns import DecodedChanges
from ..errors import ChangelogError, ChangelogTruncatedError, RecordDecodeError
from ..keygroups import KeyGroupRange
from ..reader import StateChangelogReader, wrong_handle
from .config import KafkaChangelogConfig
from .consume import BATCH, consume_ranges, end_of_partition
from .error_text import access_error, describe, is_access_error
from .handle import KafkaChangelogHandle, PartitionRange
from .live_clients import new_consumer
from .offsets import watermarks
from .record_columns import ChangeFilter, RecordGroup, in_log_order, kept_columns
from .record_format import (
    RawChange,
    check_schema_header,
    current_value,
    decode_record,
)
from .spill_sort import BUDGET_BYTES, Entry, SpillingSorter


class KafkaChangelogReader(StateChangelogReader[KafkaChangelogHandle]):
    """Reads the changes of Kafka handles with one reused consumer (read-only: READ ACLs).

    A handle's ranges are read at once, every partition assigned to one consumer: each
    fetch asks for all of them, so a handle of many partitions costs one round trip, not
    one per partition (:func:`~.consume.consume_ranges`).

    Memory is bounded whatever the length of a handle's tail: the changes read are
    held up to ``memory_budget_bytes`` (payloads plus ~100 bytes a change), then sorted
    and spilled to a temporary file in ``spill_directory`` (default: the system's
    temporary directory) as a sorted run; the runs are merged while iterating, one
    64-KiB chunk of each in memory (see :mod:`.spill_sort`). Records are fetched at
    most ``memory_budget_bytes / 4`` at a time (by ``max_record_bytes``). So a read
    holds at most about 1.25 x the budget plus 64 KiB per spilled run (tail / budget
    runs), plus librdkafka's prefetch queue (``queued.max.messages.kbytes``). Below the
    budget nothing is written to disk. :meth:`read_columns` reads only handles of at most
    half the budget, so it too holds at most about the budget (the records twice).
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
        # Records held at once by a consume call: a quarter of the budget at most.
        self._batch = min(BATCH, max(1, memory_budget_bytes // 4 // config.max_record_bytes))
        self.records_read = 0
        self.bytes_read = 0

    def read(self, handle: KafkaChangelogHandle) -> Iterator[StateChange]:
        """The handle's changes in sequence order (append order within a change set).

        Partitions are not sorted runs (a writer may persist later change sets before
        earlier ones, and a retried upload sends sets again), so every change of the
        handle is read before the first is yielded: memory stays within the reader's
        budget by spilling sorted runs to disk (see the class). Handles of up to half the
        budget are decoded column-wise (:meth:`read_columns`) when their records allow. Raises
        :class:`ChangelogTruncatedError` when a range starts below the partition's log
        start offset, and :class:`RecordDecodeError` naming the offset of a record that
        cannot be decoded.
        """
        if not isinstance(handle, KafkaChangelogHandle):
            raise wrong_handle(self, handle)
        # Column-wise when it can (within half the budget, records it decodes so): the
        # same changes in the same order, without a Python step per change but theirs.
        columns = self.read_columns([handle])
        if columns is not None:
            self.spilled_runs, self.peak_held_bytes = 0, len(columns.data)
            yield from columns.changes()
            return
        collected = SpillingSorter(self._budget, self._spill_directory)
        first_sqn, last_sqn = handle.from_sequence_number, handle.to_sequence_number
        lowest, highest = handle.key_group_range.start, handle.key_group_range.end
        try:
            for partition, offset, value in self._handle_values(handle):
                kept: list[Entry] = []
                keep = kept.append
                for c in decode_log_record(handle.topic, partition, offset, value,
                                           handle.log_id):
                    sqn, key_group = c[0], c[2]
                    if first_sqn <= sqn <= last_sqn and (
                        key_group == META_KEY_GROUP or lowest <= key_group <= highest
                    ):
                        keep(c)
                # The record's value bounds its kept payloads: counted once per record.
                collected.extend(kept, len(value))
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

    def read_columns(self, handles: Sequence[KafkaChangelogHandle]) -> DecodedChanges | None:
        """The changes of ``handles`` as :meth:`read` of each in turn gives them, decoded
        column-wise (:mod:`.record_columns`): read into one buffer, kept, ordered and rid of
        copies with NumPy. Several handles are read together, one range per partition, when
        they are consecutive pieces of one log (see :func:`merged_pieces`).

        None for pieces not read together, for more than half the memory budget (the
        records are held twice while they are joined into the one buffer the columns
        keep), or for a record the column-wise decoder leaves to the per-change one:
        :meth:`read` reads those (and names what is wrong)."""
        for piece in handles:
            if not isinstance(piece, KafkaChangelogHandle):
                raise wrong_handle(self, piece)
        handle = merged_pieces(handles)
        if handle is None or handle.state_size > self._budget // 2:
            return None
        log_id = handle.log_id.encode()
        group = RecordGroup()
        values = self._handle_values(handle)
        try:
            for _, offset, value in values:
                group.add(offset, value, log_id)
                if not group.columnar:
                    return None
        finally:
            values.close()  # unassigns the consumer, also when left early
        data, buffer, limit = padded_join(group.values)
        group.values.clear()  # the records' bytes held twice at most, while joining
        kept = kept_columns(group, buffer, limit, ChangeFilter(
            handle.from_sequence_number, handle.to_sequence_number,
            handle.key_group_range.start, handle.key_group_range.end))
        if kept is None:
            return None
        ordered = in_log_order(kept)
        return DecodedChanges(data, buffer, limit, ordered.key_groups, ordered.payload_starts,
                              ordered.payload_lengths)

    def _handle_values(self, handle: KafkaChangelogHandle) -> Generator[tuple[int, int, bytes]]:
        """(partition, offset, value) of every record of the handle's log in its ranges
        (one span per partition): see :meth:`_values`."""
        return self._values(handle.topic, handle.log_id, _spans(handle.ranges))

    def log_values(
        self, topic: str, r: PartitionRange, log_id: str,
    ) -> Iterator[tuple[int, bytes]]:
        """(offset, value) of every record of ``log_id`` in ``r``, in offset order, values
        not decoded (the schema header checked), for readers that decode values
        themselves.

        A range below the log start raises :class:`ChangelogTruncatedError`, one past
        the log end says records were lost; both are found when reading fails (the
        watermarks are only asked for then: one round trip per range less on every
        restore). Skips other logs' records, and refuses unknown schemas naming the
        offset.
        """
        for _, offset, value in self._values(topic, log_id, [r]):
            yield offset, value

    def _values(self, topic: str, log_id: str, ranges: Sequence[PartitionRange]
                ) -> Generator[tuple[int, int, bytes]]:
        """(partition, offset, value) of every record of ``log_id`` in ``ranges`` (one per
        partition), values not decoded (the schema header checked), all partitions read
        at once (:func:`~.consume.consume_ranges`): each partition's records in offset
        order. Errors as :meth:`log_values`."""
        by_partition = {r.partition: r for r in ranges}
        log_key = log_id.encode()

        def on_error(partition: int, error: KafkaError, position: int) -> int:
            return self._after_error(topic, by_partition[partition], log_id, position, error)

        for message in consume_ranges(
                self._consumer, topic,
                [(r.partition, r.start_offset, r.end_offset) for r in ranges],
                self._timeout, on_error, batch=self._batch):
            if message.key() == log_key:
                partition = message.partition() or 0
                offset = message.offset() or 0
                yield partition, offset, self._checked_value(topic, partition, offset,
                                                             message)

    def _checked_value(self, topic: str, partition: int, offset: int, message: Message
                       ) -> bytes:
        """A record's value in the current layout, counted, its schema header checked (an
        unknown schema is a :class:`RecordDecodeError` naming the offset). A legacy record
        (``change_batch/1``) is converted (:func:`~.record_format.current_value`); one that
        does not decode is a :class:`RecordDecodeError` naming the offset."""
        value = message.value() or b""
        self.records_read += 1
        self.bytes_read += len(value)
        try:
            headers = message.headers()
            version = check_schema_header(
                list(headers.items()) if isinstance(headers, dict) else headers)
            return current_value(value, version)
        except ValueError as exc:  # UnknownSchemaError too
            raise RecordDecodeError(topic, partition, offset, str(exc)) from exc

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


def decode_log_record(topic: str, partition: int, offset: int, value: bytes,
                      log_id: str) -> list[RawChange]:
    """The changes of the record of ``log_id`` at ``offset``, change by change;
    :class:`RecordDecodeError` naming the offset if it does not decode or names another log."""
    try:
        found, changes = decode_record(value)
    except ValueError as exc:
        raise RecordDecodeError(topic, partition, offset, str(exc)) from exc
    if found != log_id:
        raise RecordDecodeError(
            topic, partition, offset, f"record key says log {log_id} but value says {found}")
    return changes


def merged_pieces(handles: Sequence[KafkaChangelogHandle]) -> KafkaChangelogHandle | None:
    """One handle reading what ``handles`` hold, or None when they are not consecutive
    pieces of one log (same log, topic and key groups, each piece's sequence numbers
    right after the one before).

    Its range in a partition spans the pieces' ranges there: the records between them
    are other logs' (skipped) or copies of the pieces' own changes from retried uploads
    (dropped as copies); its sequence numbers span the pieces', which follow one another,
    so it keeps exactly their changes.
    """
    if not handles:
        return None
    first = handles[0]
    if len(handles) == 1:
        return first
    for before, after in itertools.pairwise(handles):
        if (after.log_id != first.log_id or after.topic != first.topic
                or after.key_group_range != first.key_group_range
                or after.from_sequence_number != before.to_sequence_number + 1):
            return None
    return KafkaChangelogHandle(first.log_id, first.topic, first.key_group_range,
                                _spans([r for h in handles for r in h.ranges]),
                                first.from_sequence_number, handles[-1].to_sequence_number,
                                first.meta_partition)


def _spans(ranges: Sequence[PartitionRange]) -> list[PartitionRange]:
    """One range per partition spanning the non-empty ``ranges`` in it (what lies between
    two ranges of a log is other logs' records or copies of its own)."""
    spans: dict[int, PartitionRange] = {}
    for r in ranges:
        if r.end_offset <= r.start_offset:
            continue
        seen = spans.get(r.partition)
        spans[r.partition] = r if seen is None else PartitionRange(
            r.partition, min(seen.start_offset, r.start_offset),
            max(seen.end_offset, r.end_offset),
            KeyGroupRange(min(seen.key_groups.start, r.key_groups.start),
                          max(seen.key_groups.end, r.key_groups.end)),
            seen.record_bytes + r.record_bytes)
    return list(spans.values())
