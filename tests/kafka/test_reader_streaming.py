"""The reader's memory is bounded: a tail larger than its budget spills sorted runs.

Real broker: a tail many times the reader's memory budget, spread over four partitions,
comes back exactly as written (the same order and de-duplication as an in-memory sort)
while the reader never holds more than its stated bound; copies of records (what a
retried upload leaves) are dropped, and a partition whose changes are not in sequence
order (a writer may persist later change sets first) is read back in order. The
column-wise read (``read_columns``, what restores replay) gives exactly the same changes,
or leaves a handle above half its budget to ``read``.
"""

from __future__ import annotations

import dataclasses
import random
import tracemalloc
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import (
    KafkaChangelogConfig,
    KafkaChangelogHandle,
    KafkaChangelogReader,
    KafkaChangelogStorage,
)
from kafka_changelog.kafka.handle import PartitionRange

from .kafka_helpers import storage_config

pytestmark = pytest.mark.broker

KIB = 1024
PARTITIONS = 4
BUDGET = 1024 * KIB


def write(config: KafkaChangelogConfig, sets: int, per_set: int, size: int,
          ) -> tuple[KafkaChangelogHandle, list[bytes]]:
    """``sets`` change sets of ``per_set`` random-key-group changes; (handle, payloads)."""
    rng = random.Random(7)
    written: list[bytes] = []
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("streamed", KeyGroupRange.of(0, config.max_parallelism - 1))
        first = writer.initial_sequence_number()
        for s in range(sets):
            if s:
                writer.next_sequence_number()  # a new change set
            for i in range(per_set):
                payload = f"{s}/{i}/".encode() + rng.randbytes(size)
                writer.append(rng.randrange(config.max_parallelism), payload)
                written.append(payload)
        handle = writer.persist(first, 1).result(timeout=120).job_owned
        writer.close()
    assert isinstance(handle, KafkaChangelogHandle)
    return handle, written


def read(config: KafkaChangelogConfig, handle: KafkaChangelogHandle,
         **options: Any) -> tuple[list[bytes], int]:
    with KafkaChangelogReader(config, memory_budget_bytes=BUDGET, **options) as reader:
        payloads = [c.payload for c in reader.read(handle)]
        return payloads, reader.spilled_runs


def records_of(config: KafkaChangelogConfig, r: PartitionRange, topic: str) -> list[Message]:
    """The records of ``topic`` in range ``r`` (up to the partition's end)."""
    consumer = Consumer(config.consumer())  # partition-end events end the read
    try:
        consumer.assign([TopicPartition(topic, r.partition, r.start_offset)])
        found: list[Message] = []
        while True:
            for m in consumer.consume(100, timeout=0.2):  # returns after the timeout
                error = m.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    return [m for m in found if (m.offset() or 0) < r.end_offset]
                found.append(m)
    finally:
        consumer.close()


def produce(config: KafkaChangelogConfig, topic: str, partition: int,
            records: list[Message]) -> tuple[int, int]:
    """Send ``records`` again to ``topic[partition]``; the offsets they got (first, end)."""
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": config.bootstrap_servers,
                         **config.client_config})
    for m in records:
        producer.produce(topic, m.value(), m.key(), partition=partition,
                         headers=m.headers() or [],
                         on_delivery=lambda err, msg: offsets.append(msg.offset() or 0))
    producer.flush(30)
    assert len(offsets) == len(records)
    return min(offsets), max(offsets) + 1


def test_a_tail_larger_than_the_budget_is_read_in_order_within_it(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=PARTITIONS, max_record_bytes=64 * KIB)
    handle, written = write(config, sets=6, per_set=1_000, size=4 * KIB)  # ~24 MiB
    tail = sum(r.record_bytes for r in handle.ranges)
    assert len(handle.ranges) == PARTITIONS
    assert tail > 16 * BUDGET

    tracemalloc.start()
    try:
        seen = 0
        with KafkaChangelogReader(config, memory_budget_bytes=BUDGET) as reader:
            for change in reader.read(handle):
                assert change.payload == written[seen]
                seen += 1
            spilled, peak_held = reader.spilled_runs, reader.peak_held_bytes
        _, peak_allocated = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == len(written)
    assert spilled >= 16
    # The stated bound: the budget plus one record's changes (at most max_record_bytes).
    assert peak_held <= BUDGET + 64 * KIB + 16 * 100, peak_held
    # Everything Python allocated at once (decoded records, merge chunks): far below the
    # tail, which the reader held whole before.
    assert peak_allocated < tail / 3, (peak_allocated, tail)


def test_copies_of_retried_uploads_are_dropped(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=PARTITIONS, max_record_bytes=8 * KIB)
    handle, written = write(config, sets=4, per_set=300, size=100)
    ranges = []
    for r in handle.ranges:
        # A retried upload: its records again, after what the partition holds.
        records = records_of(config, r, handle.topic)
        _, end = produce(config, handle.topic, r.partition, records[len(records) // 2:])
        _, end = produce(config, handle.topic, r.partition, records)
        ranges.append(dataclasses.replace(r, end_offset=end))
    with_copies = KafkaChangelogHandle(
        handle.log_id, handle.topic, handle.key_group_range, ranges,
        handle.from_sequence_number, handle.to_sequence_number, handle.meta_partition, 1)
    with KafkaChangelogReader(config, memory_budget_bytes=64 * KIB) as reader:
        payloads = [c.payload for c in reader.read(with_copies)]
        spilled = reader.spilled_runs
    assert spilled > 1  # copies in different runs are dropped by the merge too
    assert payloads == written
    assert column_payloads(config, with_copies) == written
    with KafkaChangelogReader(config, memory_budget_bytes=64 * KIB) as reader:
        assert with_copies.state_size > 32 * KIB
        assert reader.read_columns([with_copies]) is None  # more than half the budget


def test_a_partition_out_of_sequence_order_is_read_in_order(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=1, max_record_bytes=8 * KIB)
    handle, written = write(config, sets=6, per_set=200, size=100)
    (r,) = handle.ranges
    records = records_of(config, r, handle.topic)
    assert len(records) > 3
    # The same records in another topic, last first: later sets before earlier ones.
    other = storage_config(kafka_cluster, partitions=1)
    with KafkaChangelogStorage(other) as storage:
        storage.create_writer("other", KeyGroupRange.of(0, other.max_parallelism - 1)).close()
    first, end = produce(config, other.topic, 0, records[::-1])
    reversed_handle = KafkaChangelogHandle(
        handle.log_id, other.topic, handle.key_group_range,
        [dataclasses.replace(r, start_offset=first, end_offset=end)],
        handle.from_sequence_number, handle.to_sequence_number, handle.meta_partition, 1)
    payloads, spilled = read(other, reversed_handle)
    assert spilled == 0  # ~0.3 MiB: below the budget, sorted in memory
    assert payloads == written
    with KafkaChangelogReader(other, memory_budget_bytes=16 * KIB) as reader:
        assert [c.payload for c in reader.read(reversed_handle)] == written
        assert reader.spilled_runs > 1
    assert column_payloads(other, reversed_handle) == written


def test_a_column_wise_read_keeps_what_the_handle_keeps(kafka_cluster: Any) -> None:
    """Key groups and sequence numbers outside the handle are dropped, meta changes kept,
    key groups given exactly."""
    config = storage_config(kafka_cluster, partitions=PARTITIONS)
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("kept", KeyGroupRange.of(0, 127))
        first = writer.initial_sequence_number()
        writer.append_meta(b"registration")
        for i in range(400):
            writer.append(i % 128, b"first/%d" % i)
        middle = writer.next_sequence_number()
        for i in range(400):
            writer.append(i % 128, b"second/%d" % i)
        handle = writer.persist(first, 1).result(timeout=60).job_owned
        writer.close()
    assert isinstance(handle, KafkaChangelogHandle)
    narrowed = handle.intersection(KeyGroupRange.of(32, 63))
    assert narrowed is not None
    second_only = KafkaChangelogHandle(
        handle.log_id, handle.topic, handle.key_group_range, handle.ranges, middle.value,
        handle.to_sequence_number, handle.meta_partition, 1)
    with KafkaChangelogReader(config) as reader:
        for piece in (handle, narrowed, second_only):
            columns = reader.read_columns([piece])
            assert columns is not None
            assert list(columns.changes()) == list(reader.read(piece))
        assert [c.key_group for c in reader.read_columns([narrowed]).changes()] == [
            -1, *[i % 128 for i in range(400) if 32 <= i % 128 <= 63] * 2]


def column_payloads(config: KafkaChangelogConfig, handle: KafkaChangelogHandle) -> list[bytes]:
    with KafkaChangelogReader(config) as reader:
        columns = reader.read_columns([handle])
        assert columns is not None
        return [c.payload for c in columns.changes()]


def test_consecutive_pieces_of_a_log_are_read_together_as_each_in_turn(
        kafka_cluster: Any) -> None:
    """Three pieces (checkpoints) of one log, another log's records and a retried upload's
    copies between them: read together they give what reading each in turn gives; pieces
    that do not follow one another are left to the piece-by-piece read."""
    config = storage_config(kafka_cluster, partitions=2)
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("pieces", KeyGroupRange.of(0, 127))
        other = storage.create_writer("other", KeyGroupRange.of(0, 127))
        pieces: list[KafkaChangelogHandle] = []
        start = writer.initial_sequence_number()
        for checkpoint in range(1, 4):
            if checkpoint > 1:
                start = writer.next_sequence_number()
            if checkpoint == 2:  # a retried upload of the first piece, before the second
                for r in pieces[0].ranges:
                    produce(config, config.topic, r.partition,
                            records_of(config, r, config.topic))
            writer.append_meta(b"meta/%d" % checkpoint)
            for i in range(300):
                writer.append(i % 128, b"%d/%d" % (checkpoint, i))
                other.append(i % 128, b"other")
            other.persist(other.initial_sequence_number(), checkpoint).result(timeout=60)
            piece = writer.persist(start, checkpoint).result(timeout=60).job_owned
            assert isinstance(piece, KafkaChangelogHandle)
            pieces.append(piece)
        writer.close()
        other.close()
    with KafkaChangelogReader(config) as reader:
        each = [c for piece in pieces for c in reader.read(piece)]
        together = reader.read_columns(pieces)
        assert together is not None
        assert list(together.changes()) == each
        assert len(each) == 3 * 301
        assert reader.read_columns([pieces[0], pieces[2]]) is None  # not consecutive
        assert reader.read_columns([pieces[1], pieces[0]]) is None  # not in order
