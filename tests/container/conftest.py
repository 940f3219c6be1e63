"""A container broker shared by the container test modules that do not harm it.

Modules that kill or pause their broker use the plugin's module-scoped
``container_kafka_cluster`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_changelog.testing.container import ContainerKafkaCluster
from kafka_changelog.testing.docker_engine import DockerEngine

#: The log cleaner looks for work every 100 ms (the store tests wait for compaction).
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}


@pytest.fixture(scope="session")
def shared_container_cluster(
    docker_engine: DockerEngine, kafka_image: str
) -> Iterator[ContainerKafkaCluster]:
    """One container broker (``kafka_image``) for the whole session; never killed or paused."""
    with ContainerKafkaCluster(image=kafka_image, engine=docker_engine,
                               broker_overrides=FAST_CLEANER) as cluster:
        yield cluster
