"""The one loop that reads ranges of offsets, one per partition, at once.

The changelog reader, the snapshot and checkpoint stores read ranges ``[start, end)``
of partitions with an assigned consumer (no group, no commits). Offsets may have gaps
(transaction markers, compaction): a range is done when the position reaches its
end. What an error means is the caller's (``on_error``): it returns the position to
go on from, or raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

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
    deadline = time.monotonic() + timeout_s
    waited = False
    try:
        while positions:
            left = sum(ends[p] - at for p, at in positions.items())
            messages = consumer.consume(min(batch, left), timeout=CONSUME_WAIT_S)
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
                if position >= ends[partition]:
                    del positions[partition]
                    finished.append(TopicPartition(topic, partition))
                else:
                    positions[partition] = position
            if finished and positions:  # one call for those done (~1 ms each)
                consumer.pause(finished)
                paused += finished
    finally:
        if paused:  # a partition assigned again later would stay paused
            consumer.resume(paused)
        consumer.unassign()
