"""A failed materialization's chunks are tombstoned; a completed one's are not (real broker).

The chunks a materialization wrote before failing are in no checkpoint (no handle of it
exists), so the coordinator's garbage collection never sees them: the writer tombstones
them itself, before the failure is reported.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.state.snapshots.snapshot_store import finish_or_abandon

pytestmark = pytest.mark.broker


def latest_values(config: SnapshotStoreConfig) -> dict[bytes, bytes | None]:
    """The last value of every key of the snapshot topic (None: a tombstone)."""
    consumer = Consumer(config.consumer())  # partition-end events end each partition
    latest: dict[bytes, bytes | None] = {}
    try:
        for partition in range(config.partitions):
            consumer.assign([TopicPartition(config.topic, partition, OFFSET_BEGINNING)])
            done = False
            while not done:
                for m in consumer.consume(500, timeout=0.2):  # returns after the timeout
                    error = m.error()
                    if error is not None:
                        assert error.code() == KafkaError._PARTITION_EOF, error
                        done = True
                    else:
                        latest[m.key() or b""] = m.value()
    finally:
        consumer.close()
    return latest


def test_a_failed_materialization_tombstones_the_chunks_it_wrote(kafka_cluster: Any) -> None:
    settings = dict(kafka_cluster.client_config())
    config = SnapshotStoreConfig(
        bootstrap_servers=settings.pop("bootstrap.servers"), client_config=settings,
        topic=f"snapshots-{uuid.uuid4().hex[:10]}", partitions=4, max_parallelism=16,
        max_chunk_bytes=1000, request_timeout_s=15.0)
    with KafkaSnapshotStore(config) as store:
        kept = store.write("backend", 1, KeyGroupRange.of(0, 15), {1: os.urandom(2500)}, {}, 5)
        writer = store.begin_write("backend", 2, KeyGroupRange.of(0, 15), 9)
        for key_group in (2, 7, 12):
            writer.add(key_group, os.urandom(2500))  # three chunks each
        writer.add(4, b"delta", delta=True)
        with pytest.raises(ValueError, match="no earlier layers"):
            finish_or_abandon(writer, {})  # the delta has nothing to go on: it fails
        latest = latest_values(config)
    failed = {k: v for k, v in latest.items() if k.split(b"/")[2] == b"2"}
    assert len(failed) == 3 * 3 + 1
    assert all(v is None for v in failed.values()), "chunks of the failed job left"
    for chunk in kept.chunks:  # the completed materialization's chunks are untouched
        assert latest[chunk.record_key("backend").encode()] is not None
