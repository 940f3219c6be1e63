"""A broker that stops answering: persists fail with the cause, memory stays bounded."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kafka_changelog import BackpressureTimeoutError, KeyGroupRange, PersistError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.local_kafka.broker import LocalKafkaCluster

from .kafka_helpers import changes_of, storage_config

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def pausable_cluster() -> Iterator[LocalKafkaCluster]:
    """A broker of its own: pausing the shared one would stall other tests."""
    with LocalKafkaCluster(nodes=1) as cluster:
        yield cluster


def test_persist_fails_with_the_cause_and_a_later_persist_retries(
    pausable_cluster: LocalKafkaCluster,
) -> None:
    config = storage_config(pausable_cluster, partitions=1, delivery_timeout_ms=3000,
                            producer_config={"request.timeout.ms": 1000})
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append(1, b"before")
        writer.persist(writer.initial_sequence_number(), 1).result(30)
        pausable_cluster.pause_node(0)
        try:
            writer.append(2, b"during")
            future = writer.persist(writer.initial_sequence_number(), 2)
            with pytest.raises(PersistError) as caught:
                future.result(60)
            assert f"{config.topic}[0]" in str(caught.value)
            assert "timed out" in str(caught.value).lower()
        finally:
            pausable_cluster.resume_node(0)
        handle = writer.persist(writer.initial_sequence_number(), 3).result(60).job_owned
        assert [c.payload for c in changes_of(handle, config)] == [b"before", b"during"]


def test_appends_block_then_time_out_with_bounded_memory(
    pausable_cluster: LocalKafkaCluster,
) -> None:
    config = storage_config(
        pausable_cluster, partitions=1, max_in_flight_bytes=64 * 1024,
        preemptive_persist_threshold_bytes=16 * 1024, append_timeout_s=2.0,
        max_record_bytes=8 * 1024,
    )
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        appended = []
        pausable_cluster.pause_node(0)
        try:
            started = time.monotonic()
            with pytest.raises(BackpressureTimeoutError, match="max_in_flight_bytes=65536"):
                for i in range(10_000):
                    payload = b"%05d" % i + b"." * 995
                    appended.append(payload)
                    writer.append(i % 128, payload)
            assert time.monotonic() - started < 30
            assert storage.producer.in_flight_bytes <= 64 * 1024 + 8 * 1024
            # Only about the in-flight bound plus one threshold was ever buffered.
            assert len(appended) < (64 + 16 + 16) + 5
        finally:
            pausable_cluster.resume_node(0)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(60).job_owned
        # Nothing appended is lost, including the change whose append timed out.
        assert [c.payload for c in changes_of(handle, config)] == appended
