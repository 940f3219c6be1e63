"""Reading several partition ranges of one topic at once, each into a bounded buffer.

One consumer is assigned to every range at its start offset, so all partitions are
fetched concurrently; a caller takes the next record of whichever partition it needs
(:meth:`RangeFetcher.next_record`). A partition whose buffer holds ``buffer_bytes``
of record values or more is paused (librdkafka stops fetching it) and resumed once
its buffer is drained below half of that, so what the fetcher holds is bounded per
partition by ``buffer_bytes`` plus one consume call (at most :data:`BATCH` records),
whatever the length of the ranges. Offsets may have gaps (transaction markers,
compaction): a range is done when its position reaches its end. What an error means
is the caller's (``on_error``), as in :func:`~.consume.consume_range`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..errors import ChangelogError
from .consume import BATCH, end_of_partition
from .handle import PartitionRange

#: Record values a partition's buffer holds before the partition is paused (default).
BUFFER_BYTES = 4 * 1024 * 1024

T = TypeVar("T")

#: ``on_error(error, range, position) -> position``: what a consumer error means.
RangeErrorHandler = Callable[[KafkaError, PartitionRange, int], int]


@dataclass(eq=False)
class _Feed(Generic[T]):
    """One range's progress and the decoded records fetched but not taken yet."""

    range: PartitionRange
    position: int
    records: deque[tuple[int, T]] = field(default_factory=deque)  # (value bytes, item)
    buffered_bytes: int = 0
    done: bool = False
    paused: bool = False


class RangeFetcher(Generic[T]):
    """Fetches ``ranges`` of ``topic`` with one consumer; records go through ``decode``.

    ``decode(range, message)`` turns a record into what the buffer keeps (None: skip
    it, e.g. another writer's record). Invariant: a partition's buffer never holds more
    than ``buffer_bytes`` of record values plus one consume call's records
    (:attr:`peak_buffered_bytes` records the largest total seen, for tests).
    """

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        ranges: Sequence[PartitionRange],
        timeout_s: float,
        decode: Callable[[PartitionRange, Message], T | None],
        on_error: RangeErrorHandler,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._timeout = timeout_s
        self._decode = decode
        self._on_error = on_error
        self._pause_at = max(1, buffer_bytes)
        self._feeds = {r.partition: _Feed[T](r, r.start_offset)
                       for r in ranges if r.end_offset > r.start_offset}
        self._buffered = 0
        self.peak_buffered_bytes = 0
        if self._feeds:
            consumer.assign([TopicPartition(topic, f.range.partition, f.position)
                             for f in self._feeds.values()])

    def next_record(self, partition: int) -> T | None:
        """The next kept record of ``partition``'s range; None when the range is done."""
        feed = self._feeds[partition]
        deadline = time.monotonic() + self._timeout
        while not feed.records:
            if feed.done:
                return None
            if self._fetch(feed):
                deadline = time.monotonic() + self._timeout
            elif time.monotonic() > deadline:
                raise ChangelogError(
                    f"timed out reading {self._topic}[{partition}] at offset {feed.position} "
                    f"(range ends at {feed.range.end_offset})")
        size, item = feed.records.popleft()
        feed.buffered_bytes -= size
        self._buffered -= size
        if feed.paused and not feed.done and feed.buffered_bytes < self._pause_at // 2:
            self._set_paused(feed, False)
        return item

    def close(self) -> None:
        """Stop fetching (the consumer stays open, unassigned)."""
        self._consumer.unassign()

    def _fetch(self, waiting: _Feed[T]) -> bool:
        """One consume call; False if it returned nothing."""
        messages = self._consumer.consume(BATCH, timeout=0.5)
        if not messages:
            return False
        for message in messages:
            partition = message.partition()
            feed = self._feeds.get(-1 if partition is None else partition, waiting)
            error = message.error()
            if error is not None:
                # Errors without a partition (a broker down, an ACL) are the waited one's.
                position = feed.position
                if end_of_partition(error):
                    position = max(position, message.offset() or 0)
                feed.position = self._on_error(error, feed.range, position)
                self._finish_if_done(feed)
                continue
            offset = message.offset() or 0
            if feed.done or offset < feed.position:
                continue  # past the range, or fetched before a pause and seen already
            if offset >= feed.range.end_offset:
                feed.position = offset
                self._finish_if_done(feed)
                continue
            feed.position = offset + 1
            item = self._decode(feed.range, message)
            if item is not None:
                size = len(message.value() or b"")
                feed.records.append((size, item))
                feed.buffered_bytes += size
                self._buffered += size
            self._finish_if_done(feed)
        self.peak_buffered_bytes = max(self.peak_buffered_bytes, self._buffered)
        for feed in self._feeds.values():
            if not feed.paused and not feed.done and feed.buffered_bytes >= self._pause_at:
                self._set_paused(feed, True)
        return True

    def _finish_if_done(self, feed: _Feed[T]) -> None:
        if not feed.done and feed.position >= feed.range.end_offset:
            feed.done = True
            if not feed.paused:  # fetch nothing more past its end
                self._set_paused(feed, True)

    def _set_paused(self, feed: _Feed[T], paused: bool) -> None:
        partition = [TopicPartition(self._topic, feed.range.partition)]
        if paused:
            self._consumer.pause(partition)
        else:
            self._consumer.resume(partition)
        feed.paused = paused
