"""Helpers shared by the Kafka storage tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
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
    """The changes of a Kafka handle, read with a reader of ``config``'s cluster; the
    column-wise read, when it decodes the handle, gives exactly the same."""
    assert handle is not None
    with KafkaChangelogReader(config) as reader:
        changes = list(reader.read(handle))
        columns = reader.read_columns([handle])
        if columns is not None:
            assert list(columns.changes()) == changes
        return changes


def check_appends_bounded_while_paused(cluster: Any, pause: Callable[[], None],
                                       resume: Callable[[], None]) -> None:
    """With the broker paused (``pause``, ``resume``), appends of 1000-byte changes block,
    then time out with ``BackpressureTimeoutError`` within 30 s, having buffered only
    about the 64 KiB in-flight bound plus a persist threshold; after ``resume`` a persist
    holds every change appended, the one whose append timed out included."""
    import time

    import pytest

    from kafka_changelog import BackpressureTimeoutError, KeyGroupRange
    from kafka_changelog.kafka import KafkaChangelogStorage

    config = storage_config(
        cluster, partitions=1, max_in_flight_bytes=64 * 1024,
        preemptive_persist_threshold_bytes=16 * 1024, append_timeout_s=2.0,
        max_record_bytes=8 * 1024,
    )
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        appended = []
        pause()
        try:
            started = time.monotonic()
            with pytest.raises(BackpressureTimeoutError, match="max_in_flight_bytes=65536"):
                for i in range(10_000):
                    payload = b"%05d" % i + b"." * 995
                    appended.append(payload)
                    writer.append(i % 128, payload)
            assert time.monotonic() - started < 30
            assert storage.producer.in_flight_bytes <= 64 * 1024 + 8 * 1024
            # Only about the in-flight bound plus one threshold was ever buffered.
            assert len(appended) < (64 + 16 + 16) + 5
        finally:
            resume()
        handle = writer.persist(writer.initial_sequence_number(), 1).result(60).job_owned
        assert [c.payload for c in changes_of(handle, config)] == appended
