"""How client settings are composed: the library's defaults for every client, then the
user's pass-through dicts, which may change any of them but the durability settings."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig
from kafka_changelog.kafka.client_settings import CLIENT_DEFAULTS, KafkaConnection
from kafka_changelog.kafka.config import KafkaChangelogConfig
from kafka_changelog.kafka.snapshot_store import SnapshotStoreConfig

CONFIGS = [KafkaChangelogConfig, SnapshotStoreConfig, CheckpointStoreConfig]


def _clients(config: Any) -> dict[str, dict[str, Any]]:
    return {"producer": config.producer(), "consumer": config.consumer(),
            "admin": config.admin()}


@pytest.mark.parametrize("kind", CONFIGS, ids=lambda kind: kind.__name__)
def test_every_client_gets_the_library_defaults(kind: type[KafkaConnection]) -> None:
    config = kind(bootstrap_servers="broker:9092")
    for name, settings in _clients(config).items():
        for key, value in CLIENT_DEFAULTS.items():
            assert settings.get(key) == value, f"{kind.__name__}.{name}(): {key}"


@pytest.mark.parametrize("kind", CONFIGS, ids=lambda kind: kind.__name__)
def test_the_users_settings_win_over_the_defaults(kind: type[KafkaConnection]) -> None:
    config = kind(bootstrap_servers="broker:9092",
                  client_config={"reconnect.backoff.ms": 100},
                  consumer_config={"reconnect.backoff.ms": 250, "fetch.wait.max.ms": 7})
    clients = _clients(config)
    assert clients["producer"]["reconnect.backoff.ms"] == 100
    assert clients["admin"]["reconnect.backoff.ms"] == 100
    assert clients["consumer"]["reconnect.backoff.ms"] == 250
    assert clients["consumer"]["fetch.wait.max.ms"] == 7


def test_snapshot_readers_poll_briefly_and_other_readers_do_not() -> None:
    """Snapshot chunks are read where a handle says they are, run after run: the next
    assignment must not wait for a long poll in flight."""
    snapshot = SnapshotStoreConfig(bootstrap_servers="broker:9092").consumer()
    changelog = KafkaChangelogConfig(bootstrap_servers="broker:9092").consumer()
    assert (snapshot["fetch.wait.max.ms"], snapshot["fetch.queue.backoff.ms"]) == (1, 1)
    assert (changelog["fetch.wait.max.ms"], changelog["fetch.queue.backoff.ms"]) == (20, 5)


def test_durability_settings_cannot_be_overridden() -> None:
    config = KafkaChangelogConfig(bootstrap_servers="broker:9092",
                                  client_config={"acks": "1"},
                                  producer_config={"enable.idempotence": False})
    producer = config.producer()
    assert (producer["acks"], producer["enable.idempotence"]) == ("all", True)
