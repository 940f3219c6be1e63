"""Creating the changelog topic, and refusing an existing one that would lose data."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic

from ..errors import KafkaAccessError, TopicConfigError
from .config import KafkaChangelogConfig
from .errors import describe, is_access_error


@dataclass(frozen=True)
class TopicInfo:
    """What the storage needs to know of its topic."""

    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]


def changelog_topic_configs(config: KafkaChangelogConfig) -> dict[str, str]:
    """Topic-level settings the storage creates the changelog topic with."""
    settings = {"cleanup.policy": "delete", "retention.ms": str(config.retention_ms)}
    if config.min_insync_replicas is not None:
        settings["min.insync.replicas"] = str(config.min_insync_replicas)
    return settings


def ensure_changelog_topic(
    admin: AdminClient, metadata: ClusterMetadata, config: KafkaChangelogConfig
) -> TopicInfo:
    """Create the changelog topic if missing, then validate it (see :func:`validate`)."""
    if config.topic not in metadata.topics:
        new_topic = NewTopic(
            config.topic,
            num_partitions=config.partitions,
            replication_factor=config.replication_factor or -1,
            config=changelog_topic_configs(config),
        )
        future = admin.create_topics([new_topic], request_timeout=config.request_timeout_s)[
            config.topic]
        try:
            future.result(timeout=config.request_timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                cls = KafkaAccessError if is_access_error(error) else TopicConfigError
                raise cls(f"cannot create changelog topic {config.topic}: {describe(error)}") \
                    from exc
    return describe_topic(admin, config)


def describe_topic(admin: AdminClient, config: KafkaChangelogConfig) -> TopicInfo:
    """Read the topic's partitions, replication and configs, and validate them."""
    deadline = time.monotonic() + config.request_timeout_s
    while True:
        metadata = admin.list_topics(topic=config.topic, timeout=config.request_timeout_s)
        topic = metadata.topics.get(config.topic)
        if topic is not None and topic.error is None and all(
            p.leader >= 0 for p in topic.partitions.values()
        ):
            break
        if topic is not None and topic.error is not None and is_access_error(topic.error):
            raise KafkaAccessError(
                f"cannot describe changelog topic {config.topic}: {describe(topic.error)}")
        if time.monotonic() > deadline:
            reason = describe(topic.error) if topic is not None and topic.error else (
                "missing" if topic is None else "partitions without a leader")
            raise TopicConfigError(f"changelog topic {config.topic} is not usable: {reason}")
        # A topic created a moment ago takes a little while to show up everywhere.
        time.sleep(0.1)
    resource = ConfigResource(ConfigResource.Type.TOPIC, config.topic)
    described = admin.describe_configs([resource], request_timeout=config.request_timeout_s)
    entries = described[resource].result(timeout=config.request_timeout_s)
    configs = {name: entry.value for name, entry in entries.items()}
    replication = min(len(p.replicas) for p in topic.partitions.values())
    info = TopicInfo(config.topic, len(topic.partitions), replication, configs)
    validate(info, config)
    return info


def validate(info: TopicInfo, config: KafkaChangelogConfig) -> None:
    """Refuse a topic the changelog cannot use safely, naming expected vs found."""
    policy = info.configs.get("cleanup.policy", "delete")
    if "compact" in policy.split(","):
        raise TopicConfigError(
            f"changelog topic {info.name} has cleanup.policy={policy}; expected 'delete'. "
            "Compaction keeps only the newest record per key (the log id), which would "
            "drop persisted changes, and DeleteRecords is refused on compacted topics."
        )
    if info.partitions < config.partitions:
        raise TopicConfigError(
            f"changelog topic {info.name} has {info.partitions} partitions; expected at "
            f"least {config.partitions}"
        )
    wanted = config.replication_factor
    if wanted is not None and info.replication_factor < wanted:
        raise TopicConfigError(
            f"changelog topic {info.name} has replication factor {info.replication_factor}; "
            f"expected at least {wanted}"
        )
