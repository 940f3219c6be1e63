"""The small interface every test cluster (local, container, external) offers."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from confluent_kafka.admin import AdminClient


@runtime_checkable
class KafkaCluster(Protocol):
    """A Kafka cluster tests can connect to."""

    def start(self) -> KafkaCluster:
        """Bring the cluster up (no-op for an external one); returns self."""
        ...

    def stop(self) -> None:
        """Tear the cluster down; safe to call more than once."""
        ...

    @property
    def bootstrap_servers(self) -> str:
        """Comma-separated ``host:port`` list for ``bootstrap.servers``."""
        ...

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings (at least ``bootstrap.servers``) to connect with full rights."""
        ...

    def admin_client(self) -> AdminClient:
        """A new AdminClient connected with :meth:`client_config`."""
        ...
