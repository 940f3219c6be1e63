"""An existing changelog topic whose retention would delete records is refused (issue 9, item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_changelog.errors import TopicConfigError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.local_kafka.topics import create_topic

from .kafka_helpers import storage_config

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    ("setting", "value"),
    [("retention.ms", "86400000"), ("retention.bytes", "1000000")],
)
def test_existing_topic_with_finite_retention_is_refused(
    kafka_cluster: Any, setting: str, value: str
) -> None:
    config = storage_config(kafka_cluster, partitions=2)
    # Everything else is what the storage itself would create: only retention is wrong.
    topic_config = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
                    setting: value}
    create_topic(kafka_cluster.admin_client(), config.topic, partitions=2, config=topic_config)
    with pytest.raises(TopicConfigError) as caught:
        KafkaChangelogStorage(config)
    message = str(caught.value)
    assert f"changelog topic {config.topic} " in message
    assert f"{setting}={value}; expected {setting}=-1" in message


def test_topic_the_storage_creates_keeps_records_forever(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=1)
    with KafkaChangelogStorage(config) as storage:
        assert storage.topic.configs["retention.ms"] == "-1"
        assert storage.topic.configs["retention.bytes"] == "-1"
    # Opening the topic it created again passes the same checks.
    with KafkaChangelogStorage(config) as again:
        assert again.topic.partitions == 1
