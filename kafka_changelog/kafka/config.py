"""Settings of the Kafka changelog storage, with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .client_settings import KafkaConnection

MB = 1024 * 1024


@dataclass(frozen=True)
class KafkaChangelogConfig(KafkaConnection):
    """How the Kafka storage connects, which topic it uses and how it batches.

    ``client_config`` passes any librdkafka setting (security included, e.g.
    ``security.protocol``, ``sasl.mechanism``, ``sasl.username``) to every client
    the storage creates; ``producer_config``/``consumer_config``/``admin_config``
    override per client kind. Settings the durability rules depend on
    (``acks=all``, idempotence) cannot be overridden.
    """

    #: Changelog topic (``cleanup.policy=delete``); created if missing.
    topic: str = "kafka-changelog"
    #: Partitions to create the topic with; an existing topic must have at least this many.
    partitions: int = 16
    #: Replication factor to create the topic with (None: the broker's default);
    #: an existing topic must have at least this many replicas.
    replication_factor: int | None = None
    #: ``min.insync.replicas`` for a topic the storage creates (None: broker default).
    min_insync_replicas: int | None = None
    #: ``retention.ms`` of the topic: must be -1 (forever). Records go away only through
    #: garbage collection (DeleteRecords), never while a checkpoint needs them; an
    #: existing topic with finite ``retention.ms`` or ``retention.bytes`` is refused.
    #: Kept so configurations that spell out -1 still load; any other value is refused.
    retention_ms: int = -1
    #: Key groups in all (the state's max parallelism); key group kg goes to
    #: partition ``kg * partitions // max_parallelism``.
    max_parallelism: int = 128
    #: Unpersisted bytes of one writer that start a background persist (DSTL: 5 MB).
    preemptive_persist_threshold_bytes: int | None = 5 * MB
    #: Bytes produced but not yet acknowledged, across the storage; appends block beyond it.
    max_in_flight_bytes: int = 100 * MB
    #: Seconds an append waits for in-flight bytes to drain before raising.
    append_timeout_s: float = 60.0
    #: Upper bound of one record's value; keep below the topic's ``max.message.bytes``.
    max_record_bytes: int = 900 * 1024
    #: Producer compression: ``none``, ``lz4``, ``zstd``, ``snappy`` or ``gzip``.
    compression: str = "lz4"
    #: Producer ``linger.ms``: how long the shared producer waits to batch records. 0: a
    #: persist's records go out at once (each is a batch of changes already; a linger
    #: would only delay every persist by it).
    linger_ms: float = 0.0
    #: Producer ``delivery.timeout.ms``: a persist fails after this long without acks.
    delivery_timeout_ms: int = 120_000

    def __post_init__(self) -> None:
        self._check_bootstrap_servers()
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        if self.retention_ms != -1:
            raise ValueError(
                "retention_ms must be -1 (records kept until garbage collection deletes "
                f"them), got {self.retention_ms}: time-based retention would delete changelog "
                "records that checkpoints still need"
            )
        if not 1 <= self.max_parallelism <= 1 << 15:
            raise ValueError(f"max_parallelism must be in [1, 32768], got {self.max_parallelism}")
        if self.max_record_bytes < 1024:
            raise ValueError(f"max_record_bytes must be >= 1024, got {self.max_record_bytes}")
        if self.max_in_flight_bytes < self.max_record_bytes:
            raise ValueError(
                f"max_in_flight_bytes ({self.max_in_flight_bytes}) must be at least "
                f"max_record_bytes ({self.max_record_bytes})"
            )
        if self.compression not in {"none", "lz4", "zstd", "snappy", "gzip"}:
            raise ValueError(f"unknown compression {self.compression!r}")

    def producer(self) -> dict[str, Any]:
        """librdkafka settings of the shared producer (durability settings enforced)."""
        return self._producer_settings(self.linger_ms, self.compression,
                                       self.delivery_timeout_ms, self.max_record_bytes)

    def consumer(self) -> dict[str, Any]:
        """librdkafka settings of readers (no group management, no commits)."""
        return self._reader_settings("kafka-changelog-reader")
