"""Decide whether a cluster really serves clients: metadata, a produce round trip, ISRs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from kafka_changelog.local_kafka.errors import KafkaHarnessError
from kafka_changelog.local_kafka.topics import create_topic, delete_topics, unique_topic_name

# librdkafka logs every refused connection while a broker boots; route that
# noise to a logger (pytest captures it) instead of the test's stderr.
PROBE_LOGGER = logging.getLogger("kafka_changelog.local_kafka.probe")

PROBE_TOPIC_PREFIX = "__kafka_changelog_probe"


class ProbeTimeout(KafkaHarnessError):
    """The cluster did not pass a readiness check in time; the message says which."""


def quiet(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with librdkafka's logging sent to :data:`PROBE_LOGGER`."""
    return {**config, "logger": PROBE_LOGGER}


def _remaining(deadline: float, cap: float) -> float:
    return max(0.1, min(cap, deadline - time.monotonic()))


def wait_for_brokers(
    admin: AdminClient,
    node_ids: Collection[int],
    deadline: float,
    check_alive: Callable[[], None],
) -> None:
    """Wait until cluster metadata lists all of ``node_ids`` as brokers."""
    seen: set[int] = set()
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        check_alive()
        try:
            meta = admin.list_topics(timeout=_remaining(deadline, 2.0))
        except KafkaException as exc:
            last_error = str(exc.args[0])
        else:
            seen = set(meta.brokers)
            if seen.issuperset(node_ids):
                return
            last_error = f"brokers in metadata: {sorted(seen)}"
        time.sleep(0.2)
    raise ProbeTimeout(f"not all of brokers {sorted(node_ids)} registered ({last_error})")


def produce_round_trip(
    admin: AdminClient,
    client_config: dict[str, Any],
    replication_factor: int,
    deadline: float,
    check_alive: Callable[[], None],
) -> None:
    """Create a probe topic, write one record with ``acks=all`` and wait for its ack."""
    topic = unique_topic_name(PROBE_TOPIC_PREFIX)
    last_error = "no attempt"
    while True:
        check_alive()
        try:
            create_topic(
                admin,
                topic,
                replication_factor=replication_factor,
                timeout=_remaining(deadline, 10.0),
            )
            break
        except KafkaHarnessError as exc:
            # Brokers may be registered but still fenced: "replication factor larger than
            # available brokers" until their first heartbeat is answered.
            last_error = str(exc)
        if "already exists" in last_error:
            break
        if time.monotonic() >= deadline:
            raise ProbeTimeout(f"could not create the probe topic: {last_error}")
        time.sleep(0.3)
    try:
        _produce_one(topic, client_config, deadline, check_alive)
    finally:
        try:
            delete_topics(admin, [topic], timeout=_remaining(deadline, 10.0))
        except KafkaHarnessError:
            PROBE_LOGGER.warning("could not delete probe topic %s", topic, exc_info=True)


def _produce_one(
    topic: str, client_config: dict[str, Any], deadline: float, check_alive: Callable[[], None]
) -> None:
    outcome: list[Any] = []
    producer = Producer(
        quiet(
            {
                **client_config,
                "acks": "all",
                "message.timeout.ms": int(_remaining(deadline, 60.0) * 1000),
            }
        )
    )
    producer.produce(topic, b"probe", on_delivery=lambda err, _msg: outcome.append(err))
    while not outcome and time.monotonic() < deadline:
        check_alive()
        producer.poll(0.2)
    if not outcome:
        producer.purge()
        raise ProbeTimeout(f"a produce with acks=all to {topic!r} was not acknowledged")
    if outcome[0] is not None:
        raise ProbeTimeout(f"a produce with acks=all to {topic!r} failed: {outcome[0]}")
    producer.flush(1)


def wait_for_isr(
    admin: AdminClient, node_id: int, deadline: float, check_alive: Callable[[], None]
) -> None:
    """Wait until ``node_id`` is a broker again and in the ISR of every partition it replicates."""
    lagging: list[str] = ["(no metadata yet)"]
    while time.monotonic() < deadline:
        check_alive()
        try:
            meta = admin.list_topics(timeout=_remaining(deadline, 2.0))
        except KafkaException as exc:
            lagging = [str(exc.args[0])]
        else:
            if node_id not in meta.brokers:
                lagging = [f"node id {node_id} not among brokers {sorted(meta.brokers)}"]
            else:
                lagging = [
                    f"{name}/{p.id}"
                    for name, topic in meta.topics.items()
                    for p in topic.partitions.values()
                    if node_id in p.replicas and node_id not in p.isrs
                ]
                if not lagging:
                    return
        time.sleep(0.25)
    shown = ", ".join(lagging[:10]) + (" ..." if len(lagging) > 10 else "")
    raise ProbeTimeout(f"node id {node_id} did not rejoin the ISR of: {shown}")
