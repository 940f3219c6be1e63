"""How the library connects to Kafka: one connection config every Kafka config extends.

:class:`KafkaConnection` holds the brokers, the request timeout and the four
pass-through dicts of librdkafka settings (security included); the changelog, snapshot
and checkpoint configs extend it with their topic's settings, so one connection
(:meth:`KafkaConnection.connection`) builds all three. Client settings are made the
same way for all: ``client_config`` for every client, then per client kind the
config's defaults, then ``producer_config``/``consumer_config``/``admin_config``. What
durability depends on (``acks=all``, idempotence) is applied last and cannot be
overridden.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

#: librdkafka settings every client gets unless ``client_config`` says otherwise.
CLIENT_DEFAULTS: dict[str, Any] = {
    # A new client drops its bootstrap connection once it learns the brokers' ids, and a
    # request sent on it (the first metadata, a producer's transactional init) is sent
    # again only after librdkafka's pause between connection attempts, half of this
    # backoff (at least 11 ms): with the default 100 ms, a new client's first request
    # took ~55 ms instead of ~2 ms against a local broker, once per client a task makes.
    # Reconnects after a failure back off exponentially from here as before.
    "reconnect.backoff.ms": 20,
}

#: Producer settings no pass-through dict may change.
ENFORCED_PRODUCER_SETTINGS: dict[str, Any] = {"acks": "all", "enable.idempotence": True}


C = TypeVar("C", bound="KafkaConnection")


@dataclass(frozen=True)
class KafkaConnection:
    """Where the brokers are and how every client talks to them.

    Any librdkafka setting passes through: ``client_config`` to every client (security:
    ``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``,
    ...), the others to one client kind.
    """

    #: Kafka bootstrap servers, ``host:port[,host:port]``.
    bootstrap_servers: str
    #: Seconds for admin operations, connecting, and reading a record.
    request_timeout_s: float = 30.0
    #: Seconds a transactional call that Kafka answers with a retriable error (a timeout
    #: of a broker slow under load) is made again before it fails, from its first attempt
    #: (see :mod:`kafka_changelog.kafka.transaction_calls`).
    retry_bound_s: float = 120.0
    #: Extra librdkafka settings for every client.
    client_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for producers only.
    producer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for consumers (readers) only.
    consumer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the admin client only.
    admin_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_bootstrap_servers()

    def _check_bootstrap_servers(self) -> None:
        if not self.bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one broker")
        if not self.retry_bound_s >= 0:
            raise ValueError(f"retry_bound_s must be 0 or more, got {self.retry_bound_s!r}")

    def connection(self) -> KafkaConnection:
        """The connection part of this config alone."""
        return KafkaConnection(**{f.name: getattr(self, f.name)
                                  for f in fields(KafkaConnection)})

    @classmethod
    def on(cls: type[C], connection: KafkaConnection, **settings: Any) -> C:
        """This kind of config on ``connection``, with its own ``settings``."""
        shared = {f.name: getattr(connection, f.name) for f in fields(KafkaConnection)}
        return cls(**{**shared, **settings})

    def common(self) -> dict[str, Any]:
        """Settings shared by every client."""
        return {"bootstrap.servers": self.bootstrap_servers, **CLIENT_DEFAULTS,
                **self.client_config}

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
            # A reader that falls behind (decoding what it fetched) fills its prefetch
            # queue; librdkafka then postpones the partition's next fetch by this much
            # (default 1000 ms), which a restore waited out once per partition.
            "fetch.queue.backoff.ms": 5,
            **defaults,
            **self.consumer_config,
        }
