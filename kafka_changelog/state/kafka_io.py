"""Kafka plumbing shared by the snapshot and checkpoint stores.

Creating (or describing) a compacted topic, producing records and blocking until
each one is acknowledged, and reading watermarks with retries. What a store
accepts as its topic is decided by the store (its ``validate`` function).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from ..errors import ChangelogError, KafkaAccessError, TopicConfigError
from ..kafka.errors import describe, is_access_error
from ..kafka.topics import TopicInfo

_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}


class OutRecord(NamedTuple):
    """A record to produce: ``value=None`` is a tombstone."""

    partition: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


def ensure_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    replication_factor: int | None,
    configs: dict[str, str],
    timeout_s: float,
    purpose: str,
) -> TopicInfo:
    """Create topic ``name`` with ``configs`` unless it exists, then describe it.

    ``purpose`` names the topic in errors (e.g. "snapshot topic"). Validation of
    an existing topic is the caller's job.
    """
    metadata = admin.list_topics(timeout=timeout_s)
    if name not in metadata.topics:
        new_topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor or -1,
            config=dict(configs),
        )
        future = admin.create_topics([new_topic], request_timeout=timeout_s)[name]
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                cls = KafkaAccessError if is_access_error(error) else TopicConfigError
                raise cls(f"cannot create {purpose} {name}: {describe(error)}") from exc
    return describe_topic(admin, name, timeout_s, purpose)


def describe_topic(admin: AdminClient, name: str, timeout_s: float, purpose: str) -> TopicInfo:
    """Partitions, replication factor and configs of ``name`` once every partition has a leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(topic=name, timeout=timeout_s)
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None and topic.partitions and all(
            p.leader >= 0 for p in topic.partitions.values()
        ):
            break
        if topic is not None and topic.error is not None and is_access_error(topic.error):
            raise KafkaAccessError(f"cannot describe {purpose} {name}: {describe(topic.error)}")
        if time.monotonic() > deadline:
            reason = describe(topic.error) if topic is not None and topic.error else (
                "missing" if topic is None else "partitions without a leader")
            raise TopicConfigError(f"{purpose} {name} is not usable: {reason}")
        # A topic created a moment ago takes a little while to show up everywhere.
        time.sleep(0.1)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = admin.describe_configs([resource], request_timeout=timeout_s)
    entries = described[resource].result(timeout=timeout_s)
    configs = {key: entry.value for key, entry in entries.items()}
    replication = min(len(p.replicas) for p in topic.partitions.values())
    return TopicInfo(name, len(topic.partitions), replication, configs)


def check_infinite_retention(info: TopicInfo, purpose: str) -> None:
    """Refuse a topic whose cleanup policy is not ``compact`` (with nothing deleted by age/size).

    With ``delete`` in the policy as well, ``retention.ms`` and ``retention.bytes``
    must both be -1, or time/size retention would delete records still referred to.
    """
    policy = info.configs.get("cleanup.policy", "delete")
    policies = {p.strip() for p in policy.split(",")}
    if "compact" not in policies:
        raise TopicConfigError(
            f"{purpose} {info.name} has cleanup.policy={policy}; expected 'compact' (or "
            "'compact,delete' with infinite retention): records are removed only by "
            "tombstones, never by age or size"
        )
    if "delete" in policies:
        for key in ("retention.ms", "retention.bytes"):
            found = info.configs.get(key)
            if found != "-1":
                raise TopicConfigError(
                    f"{purpose} {info.name} has cleanup.policy={policy} and {key}={found}; "
                    f"expected {key}=-1, or records still referred to would be deleted "
                    "by retention"
                )


class AckedProducer:
    """An idempotent ``acks=all`` producer whose :meth:`produce_all` blocks until acknowledged.

    Safe to share between threads: each call waits for its own records only.
    ``error_type`` is raised (naming topic, partition and ``what``) when a record fails.
    """

    def __init__(
        self,
        settings: dict[str, Any],
        topic: str,
        error_type: Callable[[str], ChangelogError],
        timeout_s: float,
    ) -> None:
        self._settings = {**settings, "acks": "all", "enable.idempotence": True}
        self._topic = topic
        self._error_type = error_type
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._fatal: KafkaError | None = None
        self._producer: Producer | None = self._new_producer()

    def _new_producer(self) -> Producer:
        return Producer({**self._settings, "error_cb": self._on_error})

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error

    def produce_all(self, records: Sequence[OutRecord], what: str) -> list[int]:
        """Produce ``records`` and wait until every one is acknowledged; their offsets.

        ``what`` names the records in errors ("snapshot chunks of backend b").
        """
        with self._lock:
            if self._producer is None:
                raise self._error_type(f"cannot produce {what} to {self._topic}: closed")
            if self._fatal is not None:
                # A fatal error (e.g. an idempotence sequence error) ends a producer's life.
                self._producer, self._fatal = self._new_producer(), None
            producer = self._producer
        offsets: list[int | None] = [None] * len(records)
        failures: list[tuple[int, KafkaError]] = []
        done = threading.Semaphore(0)

        def on_delivery(index: int) -> Callable[[KafkaError | None, Message], None]:
            def delivered(error: KafkaError | None, message: Message) -> None:
                if error is not None:
                    failures.append((index, error))
                else:
                    offsets[index] = message.offset()
                done.release()
            return delivered

        for index, record in enumerate(records):
            headers: list[tuple[str, str | bytes | None]] = list(record.headers)
            while True:
                try:
                    producer.produce(
                        self._topic, value=record.value, key=record.key,
                        partition=record.partition, headers=headers,
                        on_delivery=on_delivery(index),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)  # librdkafka's queue is full: let deliveries drain it
                except KafkaException as exc:
                    raise self._failure(record.partition, what, exc.args[0]) from exc
            producer.poll(0)
        waited = 0
        deadline = time.monotonic() + self._timeout_s + float(
            self._settings.get("delivery.timeout.ms", 300_000)) / 1000
        while waited < len(records):
            if done.acquire(blocking=False):
                waited += 1
                continue
            if time.monotonic() > deadline:
                raise self._error_type(
                    f"{len(records) - waited} of {len(records)} {what} to {self._topic} were "
                    "neither acknowledged nor failed in time: is the broker reachable?"
                )
            producer.poll(0.05)
        if failures:
            index, error = min(failures, key=lambda f: f[0])
            raise self._failure(records[index].partition, what, error)
        return [o for o in offsets if o is not None]

    def _failure(self, partition: int, what: str, error: KafkaError) -> ChangelogError:
        message = f"producing {what} to {self._topic}[{partition}] failed: {describe(error)}"
        if is_access_error(error):
            return KafkaAccessError(message)
        return self._error_type(message)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait up to ``timeout_s`` for anything still queued, then drop the producer."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout_s)


def watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float
) -> tuple[int, int]:
    """(log start offset, high watermark) of a partition, waiting out leader changes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if is_access_error(error):
                raise KafkaAccessError(
                    f"reading {topic}[{partition}] failed: {describe(error)}") from exc
            if (not error.retriable() and error.code() not in _TRANSIENT) or (
                time.monotonic() > deadline
            ):
                raise ChangelogError(
                    f"cannot read the offsets of {topic}[{partition}]: {describe(error)}"
                ) from exc
            time.sleep(0.2)
