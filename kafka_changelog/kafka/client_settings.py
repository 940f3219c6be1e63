"""librdkafka settings of every client the library creates, shared by the Kafka configs.

The configs (:class:`~kafka_changelog.kafka.KafkaChangelogConfig`, the snapshot and
checkpoint store configs) each declare ``bootstrap_servers`` and the four pass-through
dicts as documented fields; this mixin turns them into client settings the same way
for all: ``client_config`` for every client, then per client kind the config's
defaults, then ``producer_config``/``consumer_config``/``admin_config``. What
durability depends on (``acks=all``, idempotence) is applied last and cannot be
overridden.
"""

from __future__ import annotations

from typing import Any

#: Producer settings no pass-through dict may change.
ENFORCED_PRODUCER_SETTINGS: dict[str, Any] = {"acks": "all", "enable.idempotence": True}


class KafkaClientSettings:
    """Builds client settings from a config's connection fields (a mixin of the configs)."""

    bootstrap_servers: str
    client_config: dict[str, Any]
    producer_config: dict[str, Any]
    consumer_config: dict[str, Any]
    admin_config: dict[str, Any]

    def _check_bootstrap_servers(self) -> None:
        if not self.bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one broker")

    def common(self) -> dict[str, Any]:
        """Settings shared by every client."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_config}

    def admin(self) -> dict[str, Any]:
        """Admin client settings."""
        return {**self.common(), **self.admin_config}

    def _producer_settings(self, linger_ms: float, compression: str, delivery_timeout_ms: int,
                           max_record_bytes: int) -> dict[str, Any]:
        # The client's own limits must admit the largest record the config produces.
        size = max(1_000_000, max_record_bytes + 64 * 1024)
        return {
            **self.common(),
            "linger.ms": linger_ms,
            "compression.type": compression,
            "delivery.timeout.ms": delivery_timeout_ms,
            "message.max.bytes": size,
            "batch.size": size,
            **self.producer_config,
            **ENFORCED_PRODUCER_SETTINGS,
        }

    def _reader_settings(self, group_id: str, **defaults: Any) -> dict[str, Any]:
        """A consumer of assigned partitions: no group membership, no commits."""
        return {
            **self.common(),
            # Required by librdkafka even without subscribing; nothing is ever committed.
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            # Transactional checkpoint commits: see only committed records, read up to the
            # last stable offset (librdkafka's default, stated because it matters here).
            "isolation.level": "read_committed",
            # Reads are short and targeted: do not let an idle long-poll delay the next fetch.
            "fetch.wait.max.ms": 20,
            **defaults,
            **self.consumer_config,
        }
