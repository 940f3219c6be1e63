"""Slices read together (:meth:`SliceReader.records_of`) give what each gives alone.

The change feed and mode ``changes`` read an input partition's slices a window at a
time: the slices of one partition merged into runs, the runs of all partitions fetched
at once. Logs sharing a partition interleave, slices overlap, touch or leave gaps; each
slice must still get exactly its log's records in its offsets, in offset order, and the
errors of reading it alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_changelog import ChangelogTruncatedError, RecordDecodeError
from kafka_changelog.kafka import KafkaChangelogConfig
from kafka_changelog.kafka.record_format import EncodedRecord, encode_changes
from spark_integration.reader.scan import OffsetSlice, SliceReader, read_windows

pytestmark = [pytest.mark.broker]


def _headers(record: EncodedRecord) -> list[tuple[str, str | bytes | None]]:
    return [(name, value) for name, value in record.headers]


def test_read_windows_cut_consecutive_items_at_the_budget() -> None:
    assert read_windows([], 10) == []
    assert read_windows([4, 4, 4, 4], 10) == [range(0, 2), range(2, 4)]
    assert read_windows([30, 1, 1], 10) == [range(0, 1), range(1, 3)]  # one above: alone
    assert read_windows([0] * 5, 10) == [range(0, 5)]


def test_slices_read_together_give_what_each_gives_alone(
    kafka_cluster: Any, make_topic: Any
) -> None:
    topic = make_topic(2)
    settings = dict(kafka_cluster.client_config())
    producer = Producer(settings)
    # Partition 0: logs w-1 and w-2 interleaved (offsets 0..11); partition 1: w-1 (0..5).
    for offset in range(12):
        log = "w-1" if offset % 3 else "w-2"
        [record] = encode_changes(log, [(offset % 8, 0, offset, b"p%d" % offset)])
        producer.produce(topic, record.value, record.key, 0, headers=_headers(record))
    for offset in range(6):
        [record] = encode_changes("w-1", [(offset, 0, offset, b"q%d" % offset)])
        producer.produce(topic, record.value, record.key, 1, headers=_headers(record))
    assert producer.flush(30) == 0
    config = KafkaChangelogConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                  client_config=settings, request_timeout_s=10)

    def piece(partition: int, start: int, end: int, log: str = "w-1") -> OffsetSlice:
        return OffsetSlice(topic, partition, start, end, log, 0, 127, 0, 100)

    pieces = [
        piece(0, 0, 4), piece(0, 4, 7),      # touching: one run
        piece(0, 2, 9, "w-2"),               # another log, overlapping both
        piece(0, 5, 6),                      # inside another slice of its log
        piece(0, 10, 12),                    # after a gap: a second run, read in round 2
        piece(1, 0, 3), piece(1, 3, 3),      # another partition; an empty slice
        piece(1, 4, 6),
    ]
    with SliceReader(config) as reader:
        alone = [list(reader.records(p)) for p in pieces]
        together = reader.records_of(pieces)
        assert together == alone
        assert [[offset for offset, _ in records] for records in together] == [
            [1, 2], [4, 5], [3, 6], [5], [10, 11], [0, 1, 2], [], [4, 5]]
        assert reader.records_of([]) == []

        # An unknown record schema is refused, naming its offset, as a slice alone does.
        [bad] = encode_changes("w-1", [(1, 0, 1, b"x")])
        producer.produce(topic, bad.value, bad.key, 1,
                         headers=[("kc.schema", b"change_batch/9")])
        assert producer.flush(30) == 0
        with pytest.raises(RecordDecodeError, match=rf"{topic}\[1\]@6: record schema"):
            reader.records_of([piece(0, 0, 3), piece(1, 5, 7)])

        # A truncated partition is refused, naming the offset needed and the log start.
        admin = AdminClient(kafka_cluster.client_config())
        for future in admin.delete_records([TopicPartition(topic, 1, 2)]).values():
            future.result(30)
        with pytest.raises(ChangelogTruncatedError) as truncated:
            reader.records_of([piece(0, 0, 3), piece(1, 0, 3)])
        assert str(truncated.value) == (
            f"changelog {topic}[1] was truncated: the handle needs offset 0 but the log "
            "starts at offset 2")
