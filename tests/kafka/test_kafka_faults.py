"""A broker that stops answering: persists fail with the cause, memory stays bounded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_changelog import KeyGroupRange, PersistError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.local_kafka.broker import LocalKafkaCluster

from .kafka_helpers import changes_of, check_appends_bounded_while_paused, storage_config

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
    check_appends_bounded_while_paused(pausable_cluster, lambda: pausable_cluster.pause_node(0),
                                       lambda: pausable_cluster.resume_node(0))

