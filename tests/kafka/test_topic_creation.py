"""Fresh topics on a three-node cluster come up at once (issue 9, item 5).

A topic the controller has just created is not yet known to every broker: the
metadata or ``DescribeConfigs`` answer of a broker that lags says
``UNKNOWN_TOPIC_OR_PART``. Creating a store must wait that out itself.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.local_kafka.broker import LocalKafkaCluster

from .kafka_helpers import storage_config

pytestmark = [pytest.mark.broker, pytest.mark.three_nodes]

ROUNDS = 15


def client_fields(cluster: LocalKafkaCluster) -> dict[str, Any]:
    settings = dict(cluster.client_config())
    return {"bootstrap_servers": settings.pop("bootstrap.servers"), "client_config": settings}


def test_fresh_rf3_changelog_topics_come_up(kafka_cluster_3: LocalKafkaCluster) -> None:
    for _ in range(ROUNDS):
        config = storage_config(kafka_cluster_3, partitions=8, replication_factor=3,
                                min_insync_replicas=2)
        with KafkaChangelogStorage(config) as storage:
            assert storage.topic.partitions == 8
            assert storage.topic.replication_factor == 3
            assert storage.topic.configs["min.insync.replicas"] == "2"
            assert storage.topic.configs["retention.ms"] == "-1"


def test_fresh_rf3_snapshot_topics_come_up(kafka_cluster_3: LocalKafkaCluster) -> None:
    for _ in range(ROUNDS):
        config = SnapshotStoreConfig(**client_fields(kafka_cluster_3),
                                     topic=f"snapshots-{uuid.uuid4().hex[:10]}", partitions=8,
                                     replication_factor=3)
        with KafkaSnapshotStore(config) as store:
            assert store.topic_info.partitions == 8
            assert store.topic_info.replication_factor == 3


def test_fresh_rf3_checkpoint_topics_come_up(kafka_cluster_3: LocalKafkaCluster) -> None:
    for _ in range(ROUNDS):
        config = CheckpointStoreConfig(**client_fields(kafka_cluster_3),
                                       topic=f"checkpoints-{uuid.uuid4().hex[:10]}",
                                       replication_factor=3)
        with KafkaCheckpointStore(config) as store:
            assert store.topic_info.partitions == 1
            assert store.topic_info.replication_factor == 3
