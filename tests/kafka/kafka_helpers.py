"""Helpers shared by the Kafka storage tests."""

from __future__ import annotations

import uuid
from typing import Any

from kafka_changelog import StateChange
from kafka_changelog.handle import ChangelogHandle
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogReader


def storage_config(cluster: Any, **overrides: Any) -> KafkaChangelogConfig:
    """A config for ``cluster`` with a fresh topic name unless one is given."""
    settings = dict(cluster.client_config())
    bootstrap = settings.pop("bootstrap.servers")
    fields: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_config": settings,
        "topic": f"changelog-{uuid.uuid4().hex[:10]}",
        "partitions": 4,
    }
    fields.update(overrides)
    return KafkaChangelogConfig(**fields)


def changes_of(handle: ChangelogHandle | None, config: KafkaChangelogConfig) -> list[StateChange]:
    """The changes of a Kafka handle, read with a reader of ``config``'s cluster."""
    assert handle is not None
    with KafkaChangelogReader(config) as reader:
        return list(reader.read(handle))
