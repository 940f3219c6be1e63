"""Which checkpoint topic a changelog or snapshot topic belongs to: one, always.

Garbage collection by an application keeps what every application in *its* checkpoint
topic needs; an application of another checkpoint topic writing to the same changelog or
snapshot topic is invisible to it, and its records would be deleted under it. So
applications that share a changelog or snapshot topic must share the checkpoint topic.

A small compacted registry topic (:data:`REGISTRY_TOPIC`, one partition, key: the data
topic, value: its checkpoint topic) records the owner. Before a driver uses its topics
(:func:`claim_topics`) it reads the registry; a topic registered to another checkpoint
topic in which some application's checkpoints or guards still name the topic is refused
with :class:`SharedTopicError` naming both. A registration nobody there needs any more
(every such application reset) is taken over. Two drivers of different checkpoint topics
registering the same new topic at the same moment are not told apart (the later
registration stands, and the other is refused from its next start).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError

from ..errors import ChangelogError, KafkaAccessError
from ..state.records import OutRecord
from .access import connect_admin
from .checkpoint_store import CheckpointStoreConfig, KafkaCheckpointView
from .client_settings import KafkaConnection
from .consume import consume_range, end_of_partition
from .error_text import access_error, describe, is_access_error
from .live_clients import new_consumer
from .offsets import watermarks
from .producer import AckedProducer
from .topics import ensure_topic

logger = logging.getLogger(__name__)

#: The registry of data topics' checkpoint topics.
REGISTRY_TOPIC = "kafka-changelog-topic-owners"


class SharedTopicError(ChangelogError):
    """A changelog or snapshot topic is in use by applications of another checkpoint topic."""


def claim_topics(connection: KafkaConnection, checkpoint_topic: str,
                 topics: Mapping[str, str]) -> None:
    """Register ``topics`` (kind -> topic, e.g. ``{"changelog": ...}``) as used with
    ``checkpoint_topic``, or raise :class:`SharedTopicError` (module docstring).

    Without the ACLs to read or write the registry, a WARNING says that the check was
    skipped (it guards against a mistake, and must not stop a secured deployment).
    """
    try:
        owners = _read_registry(connection)
        claims = []
        for kind, topic in sorted(topics.items()):
            owner = owners.get(topic)
            if owner == checkpoint_topic:
                continue
            if owner is not None and _still_used(connection, owner, topic):
                raise SharedTopicError(
                    f"{kind} topic {topic!r} is used by applications whose checkpoint topic "
                    f"is {owner!r}, not {checkpoint_topic!r}: applications sharing a changelog "
                    "or snapshot topic must share the checkpoint topic, or the garbage "
                    "collection of one deletes what the other needs. Set checkpoint_topic="
                    f"{owner!r}, or give this application topics of its own")
            claims.append(OutRecord(0, topic.encode(), checkpoint_topic.encode(), []))
        if claims:
            producer = AckedProducer(_registry(connection).producer(), REGISTRY_TOPIC,
                                     ChangelogError, connection.request_timeout_s)
            try:
                producer.produce_all(claims, f"the owners of {sorted(topics.values())}")
            finally:
                producer.close(connection.request_timeout_s)
    except KafkaAccessError as exc:
        logger.warning("cannot check that %s are used with checkpoint topic %s only (no access "
                       "to %s: %s); make sure that applications sharing them share it",
                       sorted(topics.values()), checkpoint_topic, REGISTRY_TOPIC, exc)


def _read_registry(connection: KafkaConnection) -> dict[str, str]:
    timeout = connection.request_timeout_s
    admin, _ = connect_admin(connection.admin(), timeout)
    ensure_topic(admin, REGISTRY_TOPIC, 1, None, {"cleanup.policy": "compact"}, timeout,
                 "topic owner registry")
    consumer = new_consumer(_registry(connection).consumer(), f"topic owners {REGISTRY_TOPIC}")

    def on_error(error: KafkaError, position: int) -> int:
        if end_of_partition(error):
            return position
        if is_access_error(error):
            raise access_error(error, f"reading {REGISTRY_TOPIC}[0]", operation="READ",
                               resource=REGISTRY_TOPIC)
        raise ChangelogError(f"reading {REGISTRY_TOPIC}[0] at offset {position} failed: "
                             f"{describe(error)}")

    try:
        low, high = watermarks(consumer, REGISTRY_TOPIC, 0, timeout)
        owners: dict[str, str] = {}
        for message in consume_range(consumer, REGISTRY_TOPIC, 0, low, high, timeout,
                                     on_error):
            topic = (message.key() or b"").decode(errors="replace")
            value = message.value()
            if value is None:
                owners.pop(topic, None)
            else:
                owners[topic] = value.decode(errors="replace")
        return owners
    finally:
        consumer.close()


def _registry(connection: KafkaConnection) -> CheckpointStoreConfig:
    """Client settings for the registry (a compacted single-partition topic, like the
    checkpoint topic)."""
    return CheckpointStoreConfig.on(connection, topic=REGISTRY_TOPIC)


def _still_used(connection: KafkaConnection, checkpoint_topic: str, topic: str) -> bool:
    """Whether a checkpoint or guard of ``checkpoint_topic`` names ``topic``."""
    admin, _ = connect_admin(connection.admin(), connection.request_timeout_s)
    if checkpoint_topic not in admin.list_topics(timeout=connection.request_timeout_s).topics:
        return False
    view = KafkaCheckpointView(CheckpointStoreConfig.on(connection, topic=checkpoint_topic))
    try:
        for checkpoint in view.all_checkpoints():
            if topic in checkpoint.topics().all:
                return True
            if any(f.topic == topic for f in checkpoint.log_floors):
                return True
        return any(f.topic == topic for application in view.known_applications()
                   for guard in view.guards(application) for f in guard.floors)
    finally:
        view.close()


__all__ = ["REGISTRY_TOPIC", "SharedTopicError", "claim_topics"]
