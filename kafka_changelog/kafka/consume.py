"""The one loop that reads ranges of offsets, one per partition, at once.

The changelog reader, the snapshot and checkpoint stores read ranges ``[start, end)``
of partitions with an assigned consumer (no group, no commits). Offsets may have gaps
(transaction markers, compaction): a range is done when the position reaches its
end. What an error means is the caller's (``on_error``): it returns the position to
go on from, or raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..errors import ChangelogError

#: Messages fetched per consume call at most.
BATCH = 1000

#: Seconds one consume call waits for its batch to fill. librdkafka returns a batch only
#: when it is full or this has passed, and the partition-end event does not end the wait:
#: ranges whose offsets include gaps (transaction markers, compacted records) never fill
#: their last batch, so every read waits this out once (a checkpoint commit's read of the
#: checkpoint topic paid 0.5 s when it was that; each range of a handle paid it when the
#: reader read them one by one).
CONSUME_WAIT_S = 0.005

#: ``on_error(error, position) -> position``: what a consumer error means to the caller.
ErrorHandler = Callable[[KafkaError, int], int]

#: ``on_error(partition, error, position) -> position``: :data:`ErrorHandler` of a partition.
PartitionErrorHandler = Callable[[int, KafkaError, int], int]


def end_of_partition(error: KafkaError) -> bool:
    """True for the event that says the consumer reached the end of the log."""
    return error.code() == KafkaError._PARTITION_EOF


def consume_range(
    consumer: Consumer, topic: str, partition: int, start: int, end: int, timeout_s: float,
    on_error: ErrorHandler, *, batch: int = BATCH,
) -> Iterator[Message]:
    """The messages of ``topic[partition]`` at offsets ``start <= offset < end``, in order:
    :func:`consume_ranges` of one range."""
    return consume_ranges(consumer, topic, [(partition, start, end)], timeout_s,
                          lambda _, error, position: on_error(error, position), batch=batch)


def consume_ranges(
    consumer: Consumer, topic: str, ranges: Sequence[tuple[int, int, int]], timeout_s: float,
    on_error: PartitionErrorHandler, *, batch: int = BATCH,
) -> Iterator[Message]:
    """The messages at offsets ``start <= offset < end`` of each ``(partition, start, end)``
    of ``topic`` (one range per partition), read at once: every partition is assigned, so
    each fetch request asks for all of them (one round trip, not one per partition).

    Each partition's messages come in offset order; partitions interleave. A partition is
    paused once its range is read (while others are still read). Waits up to ``timeout_s``
    for each next message (a stalled broker is an error naming a position). A
    partition-end event moves the position to the log end; every other error goes to
    ``on_error``, which returns the position to go on from, or raises. A refused group
    lookup is ignored: reading assigned partitions needs no group ACL. ``batch``: messages
    fetched per consume call at most (what is held at once: bounds memory). The consumer
    is unassigned afterwards.
    """
    ends = {partition: end for partition, start, end in ranges if end > start}
    positions = {partition: start for partition, start, end in ranges if end > start}
    if len(ends) != sum(1 for _, start, end in ranges if end > start):
        raise ValueError(f"one range per partition of {topic}, got {list(ranges)}")
    if not positions:
        return
    consumer.assign([TopicPartition(topic, p, start) for p, start in positions.items()])
    paused: list[TopicPartition] = []
    try:
        yield from _read_assigned(consumer, topic, positions, ends, timeout_s, on_error,
                                  batch, paused, None)
    finally:
        if paused:  # a partition assigned again later would stay paused
            consumer.resume(paused)
        consumer.unassign()


def _read_assigned(
    consumer: Consumer, topic: str, positions: dict[int, int], ends: dict[int, int],
    timeout_s: float, on_error: PartitionErrorHandler, batch: int,
    paused: list[TopicPartition], beyond: list[Message] | None,
    held: Sequence[Message] = (),
) -> Generator[Message, None, dict[int, int]]:
    """The loop of :func:`consume_ranges` over partitions assigned at ``positions``
    (updated as it reads, a partition removed when done; those done while others are
    not are paused and added to ``paused``). ``held``: messages taken from the consumer
    before, looked at first. ``beyond`` (when given) gets the messages taken past their
    range's end, in order, to be read later. Returns each partition's position when it
    was done: its range's end, or past it where the consumer's queue continues further
    (a partition-end event past the end: no message lies between)."""
    done: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    waited = False
    pending = list(held)
    while positions:
        if pending:
            messages, pending = pending, []
        else:
            # What the consumer holds already, at once; else wait for a fetch (a batch
            # that cannot fill, its range having gaps, waits CONSUME_WAIT_S).
            wanted = min(batch, sum(ends[p] - at for p, at in positions.items()))
            messages = (consumer.consume(wanted, timeout=0)
                        or consumer.consume(wanted, timeout=CONSUME_WAIT_S))
        if not messages:
            if not waited:
                # A new consumer assigned partitions it has no metadata of may wait
                # most of a second before its first fetch (measured); asking for the
                # topic's metadata once gets the fetches going at once.
                waited = True
                consumer.list_topics(topic, timeout=timeout_s)
            if time.monotonic() > deadline:
                partition, position = next(iter(positions.items()))
                raise ChangelogError(
                    f"timed out reading {topic}[{partition}] at offset {position} "
                    f"(range ends at {ends[partition]})")
            continue
        deadline = time.monotonic() + timeout_s
        finished: list[TopicPartition] = []
        for message in messages:
            partition = message.partition() or 0
            if partition not in positions:
                if beyond is not None and message.error() is None:
                    beyond.append(message)
                continue  # fetched before its partition was paused
            position = positions[partition]
            error = message.error()
            if error is not None:
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    continue  # librdkafka looks the group up; an assigned reader needs none
                if end_of_partition(error):
                    position = max(position, message.offset() or 0)
                position = on_error(partition, error, position)
            else:
                offset = message.offset() or 0
                if offset < position:
                    continue  # prefetched before the assignment
                if offset < ends[partition]:
                    position = offset + 1
                    yield message
                else:
                    position = offset
                    if beyond is not None:
                        beyond.append(message)
            if position >= ends[partition]:
                del positions[partition]
                done[partition] = position
                finished.append(TopicPartition(topic, partition))
            else:
                positions[partition] = position
        if finished and positions:  # one call for those done (~1 ms each)
            consumer.pause(finished)
            paused += finished
    return done


class PartitionTail:
    """One partition read forward, range after range, by a consumer that stays assigned
    between reads (the checkpoint store's view): the fetcher keeps what was written since
    the last read in the consumer's queue, so reading it costs no assignment and no first
    fetch. The consumer is this object's alone.

    Invariant: while ``_next`` is set, no message lies at offsets from ``_read_to``
    up to ``_next``, the consumer's queue continues at ``_next``, and ``_held`` holds
    the messages already taken from it (in order): a read from an offset in
    ``[_read_to, _next]`` goes on; a read from anywhere else assigns the consumer again.
    """

    def __init__(self, consumer: Consumer, topic: str, partition: int) -> None:
        self.consumer, self.topic, self.partition = consumer, topic, partition
        self._read_to = 0
        self._next: int | None = None
        self._held: list[Message] = []

    def read(self, start: int, end: int, timeout_s: float, on_error: ErrorHandler,
             *, batch: int = BATCH) -> Iterator[Message]:
        """The messages at offsets ``start <= offset < end``, in order, as
        :func:`consume_range` reads them (the same errors and waits)."""
        partition = self.partition
        going_on = self._next is not None and self._read_to <= start <= self._next
        if going_on:
            assert self._next is not None
            start = max(start, self._next)  # nothing lies before
        if end <= start:
            return
        if not going_on:
            self._held = []
            self.consumer.assign([TopicPartition(self.topic, partition, start)])
        held, self._held, self._next = self._held, [], None  # unknown until done
        beyond: list[Message] = []
        done = yield from _read_assigned(
            self.consumer, self.topic, {partition: start}, {partition: end}, timeout_s,
            lambda _, error, position: on_error(error, position), batch, [], beyond, held)
        self._read_to, self._next = end, done[partition]
        self._held = [m for m in beyond if (m.offset() or 0) >= end]

    def release(self) -> None:
        """Unassign the consumer (the next read assigns it again)."""
        self._next, self._held = None, []
        self.consumer.unassign()
