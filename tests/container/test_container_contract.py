"""The storage contract, unchanged, for the Kafka storage against a container broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.testing.container import ContainerKafkaCluster
from kafka_changelog.testing.contract import ChangelogStorageContract

pytestmark = [pytest.mark.broker, pytest.mark.container]


class TestContainerStorageContract(ChangelogStorageContract):
    config: KafkaChangelogConfig

    @pytest.fixture
    def storage(
        self, shared_container_cluster: ContainerKafkaCluster
    ) -> Iterator[KafkaChangelogStorage]:
        self.config = KafkaChangelogConfig(
            bootstrap_servers=shared_container_cluster.bootstrap_servers,
            topic=f"contract-{uuid.uuid4().hex[:10]}",
            partitions=4,
            max_parallelism=128,
        )
        with KafkaChangelogStorage(self.config) as storage:
            yield storage
