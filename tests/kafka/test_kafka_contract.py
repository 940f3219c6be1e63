"""The storage contract, unchanged, for the Kafka storage against a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.testing.contract import ChangelogStorageContract

pytestmark = pytest.mark.broker


class TestKafkaStorageContract(ChangelogStorageContract):
    config: KafkaChangelogConfig

    @pytest.fixture
    def storage(self, kafka_cluster: Any) -> Iterator[KafkaChangelogStorage]:
        settings = dict(kafka_cluster.client_config())
        bootstrap = settings.pop("bootstrap.servers")
        self.config = KafkaChangelogConfig(
            bootstrap_servers=bootstrap,
            client_config=settings,
            topic=f"contract-{uuid.uuid4().hex[:10]}",
            partitions=4,
            max_parallelism=128,
        )
        with KafkaChangelogStorage(self.config) as storage:
            yield storage
