"""``docker pause`` of the broker during persists: the writer's in-flight bound holds and
nothing is lost; persists succeed after ``docker unpause``.

The same assertions as ``tests/kafka/test_kafka_faults.py`` (which pauses a local JVM with
SIGSTOP), with the container frozen by the cgroup freezer: its connections stay open and
nothing answers.
"""

from __future__ import annotations

import time

import pytest

from kafka_changelog import KeyGroupRange, PersistError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.testing.container import ContainerKafkaCluster
from tests.kafka.kafka_helpers import (
    changes_of,
    check_appends_bounded_while_paused,
    storage_config,
)

pytestmark = [pytest.mark.broker, pytest.mark.container]


def test_appends_block_then_time_out_with_bounded_memory_while_paused(
    container_kafka_cluster: ContainerKafkaCluster,
) -> None:
    cluster = container_kafka_cluster

    def pause() -> None:
        cluster.pause()
        assert cluster.status() == "paused"

    check_appends_bounded_while_paused(cluster, pause, cluster.unpause)


def test_a_persist_during_a_pause_fails_with_the_cause_and_a_later_one_succeeds(
    container_kafka_cluster: ContainerKafkaCluster,
) -> None:
    cluster = container_kafka_cluster
    config = storage_config(cluster, partitions=1, delivery_timeout_ms=3000,
                            producer_config={"request.timeout.ms": 1000})
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append(1, b"before")
        writer.persist(writer.initial_sequence_number(), 1).result(30)
        cluster.pause()
        try:
            writer.append(2, b"during")
            future = writer.persist(writer.initial_sequence_number(), 2)
            with pytest.raises(PersistError) as caught:
                future.result(60)
            assert f"{config.topic}[0]" in str(caught.value)
            assert "timed out" in str(caught.value).lower()
        finally:
            cluster.unpause()
        handle = writer.persist(writer.initial_sequence_number(), 3).result(60).job_owned
        assert [c.payload for c in changes_of(handle, config)] == [b"before", b"during"]


def test_a_persist_in_flight_when_paused_completes_after_unpause(
    container_kafka_cluster: ContainerKafkaCluster,
) -> None:
    """Paused for less than the delivery timeout: the persist waits, then succeeds."""
    cluster = container_kafka_cluster
    config = storage_config(cluster, partitions=2, delivery_timeout_ms=60_000)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        expected = [b"x%03d" % i for i in range(200)]
        for i, payload in enumerate(expected[:100]):
            writer.append(i % 128, payload)
        cluster.pause()
        try:
            for i, payload in enumerate(expected[100:], start=100):
                writer.append(i % 128, payload)
            future = writer.persist(writer.initial_sequence_number(), 1)
            time.sleep(3)
            assert not future.done(), "a persist completed while the broker was paused"
        finally:
            cluster.unpause()
        handle = future.result(60).job_owned
        by_group: dict[int, list[bytes]] = {}
        for change in changes_of(handle, config):
            by_group.setdefault(change.key_group, []).append(change.payload)
        want: dict[int, list[bytes]] = {}
        for i, payload in enumerate(expected):
            want.setdefault(i % 128, []).append(payload)
        assert by_group == want
