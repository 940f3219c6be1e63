"""Kafka plumbing shared by the snapshot and checkpoint stores.

Producing records and blocking until each one is acknowledged, reading
watermarks with retries, and the retention check of compacted topics. Topics
are created and described by :mod:`kafka_changelog.kafka.topics` (re-exported
here as :func:`ensure_topic`); what a store accepts as its topic is decided by
the store (its ``validate`` function).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from ..errors import ChangelogError, KafkaAccessError, TopicConfigError
from ..kafka.admin_retry import retry_call
from ..kafka.errors import describe, is_access_error
from ..kafka.topics import INFINITE_RETENTION, TopicInfo, ensure_topic

__all__ = [
    "AckedProducer",
    "OutRecord",
    "TopicInfo",
    "check_infinite_retention",
    "ensure_topic",
    "watermarks",
]


class OutRecord(NamedTuple):
    """A record to produce: ``value=None`` is a tombstone."""

    partition: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


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
        for key in INFINITE_RETENTION:
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
    """(log start offset, high watermark) of a partition, waiting out leader changes.

    Transient errors are retried for up to ``timeout_s`` (see
    :func:`~kafka_changelog.kafka.admin_retry.retry_call`); access errors raise
    :class:`KafkaAccessError` at once.
    """

    def attempt(budget: float) -> tuple[int, int]:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=budget, cached=False)
        return int(low), int(high)

    return retry_call(f"read the offsets of {topic}[{partition}]", attempt, timeout_s)
