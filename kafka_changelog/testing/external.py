"""A Kafka cluster someone else runs, described by environment variables."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafka_changelog.local_kafka.errors import BrokerStartError, KafkaHarnessError
from kafka_changelog.local_kafka.probe import quiet

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
"""Environment variable with the ``bootstrap.servers`` of an external cluster."""

CLIENT_CONFIG_ENV = "KAFKA_CHANGELOG_CLIENT_CONFIG"
"""Environment variable with extra librdkafka settings (a JSON object), e.g. SASL ones."""


class ExternalKafkaCluster:
    """An already running cluster: ``start()`` checks that it answers, ``stop()`` does nothing."""

    def __init__(
        self,
        bootstrap_servers: str,
        extra_config: Mapping[str, Any] | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        if not bootstrap_servers.strip():
            raise ValueError("bootstrap_servers must not be empty")
        self._bootstrap_servers = bootstrap_servers.strip()
        self.extra_config = dict(extra_config or {})
        self.startup_timeout = startup_timeout

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExternalKafkaCluster | None:
        """The cluster named by ``KAFKA_BOOTSTRAP_SERVERS``, or None if it is not set.

        Extra client settings come from ``KAFKA_CHANGELOG_CLIENT_CONFIG`` (JSON object).
        """
        env = os.environ if environ is None else environ
        servers = env.get(BOOTSTRAP_ENV, "").strip()
        if not servers:
            return None
        raw = env.get(CLIENT_CONFIG_ENV, "").strip()
        extra: Any = {}
        if raw:
            try:
                extra = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise KafkaHarnessError(f"{CLIENT_CONFIG_ENV} is not valid JSON: {exc}") from exc
            if not isinstance(extra, dict):
                raise KafkaHarnessError(
                    f"{CLIENT_CONFIG_ENV} must be a JSON object of librdkafka settings, "
                    f"not {type(extra).__name__}"
                )
        return cls(servers, extra)

    def __repr__(self) -> str:
        return f"ExternalKafkaCluster(bootstrap={self._bootstrap_servers})"

    def __enter__(self) -> ExternalKafkaCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        """The configured ``bootstrap.servers``."""
        return self._bootstrap_servers

    def client_config(self) -> dict[str, Any]:
        """``bootstrap.servers`` plus the extra settings from the environment."""
        return {"bootstrap.servers": self._bootstrap_servers, **self.extra_config}

    def admin_client(self) -> AdminClient:
        """A new AdminClient for this cluster."""
        return AdminClient(self.client_config())

    def start(self) -> ExternalKafkaCluster:
        """Check that the cluster answers a metadata request within ``startup_timeout``."""
        admin = AdminClient(quiet(self.client_config()))
        deadline = time.monotonic() + self.startup_timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            try:
                if admin.list_topics(timeout=max(0.5, deadline - time.monotonic())).brokers:
                    return self
            except KafkaException as exc:
                last_error = str(exc.args[0])
            time.sleep(0.5)
        raise BrokerStartError(
            f"the external Kafka cluster at {self._bootstrap_servers} ({BOOTSTRAP_ENV}) did not "
            f"answer within {self.startup_timeout:.0f} s: {last_error}"
        )

    def stop(self) -> None:
        """Nothing to do: the cluster is not ours."""
