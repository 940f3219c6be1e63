"""Topics: create if missing, wait until usable, describe; refuse a changelog topic that loses data.

One module for every topic the library keeps. :func:`ensure_topic` and
:func:`describe_topic_info` serve the changelog topic (here) and the snapshot
and checkpoint topics (``kafka_changelog.state``); each owner validates the
:class:`TopicInfo` with its own rules (:func:`validate` for the changelog).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ConfigResource,
    NewTopic,
    TopicMetadata,
)

from ..errors import TopicConfigError
from .admin_retry import NotReady, admin_futures, retry_call
from .config import KafkaChangelogConfig

logger = logging.getLogger(__name__)

#: Retention settings that must be -1 on a topic whose records only deletion by
#: the library may remove (the broker would otherwise drop records still needed).
INFINITE_RETENTION = ("retention.ms", "retention.bytes")


@dataclass(frozen=True)
class TopicInfo:
    """A topic as described by the brokers: partitions, replication and effective configs."""

    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]


def ensure_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    replication_factor: int | None,
    configs: dict[str, str],
    timeout_s: float,
    purpose: str,
    metadata: ClusterMetadata | None = None,
) -> TopicInfo:
    """Create topic ``name`` with ``configs`` unless it exists, then describe it once usable.

    ``purpose`` names the topic in errors ("snapshot topic"); ``metadata`` is
    cluster metadata already at hand (else it is read). A topic another client
    creates at the same moment is fine. Validating the result is the caller's job.
    Raises :class:`TopicConfigError` (or :class:`KafkaAccessError`) naming the
    topic, the call and the broker's error.
    """
    deadline = time.monotonic() + timeout_s
    if metadata is None:
        metadata = retry_call(
            f"list topics to find {purpose} {name} (Metadata)",
            lambda budget: admin.list_topics(timeout=budget), timeout_s,
            error_type=TopicConfigError)
    if name not in metadata.topics:
        new_topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor or -1,
            config=dict(configs),
        )
        # A retry after a timed-out creation may find the topic created: that is success.
        logger.info("creating %s %s (%d partitions, replication factor %s, %s)", purpose, name,
                    partitions, replication_factor or "broker default", configs)
        admin_futures(
            f"create {purpose} {name} (CreateTopics)",
            lambda budget: admin.create_topics([new_topic], request_timeout=budget),
            _remaining(deadline), error_type=TopicConfigError,
            done_on={KafkaError.TOPIC_ALREADY_EXISTS})
    return describe_topic_info(admin, name, _remaining(deadline), purpose)


def describe_topic_info(
    admin: AdminClient, name: str, timeout_s: float, purpose: str
) -> TopicInfo:
    """Partitions, replication factor and configs of ``name``, once it is usable.

    Waits until the metadata shows every partition with a leader and
    ``DescribeConfigs`` answers: right after creation a broker may not know the
    topic yet (``UNKNOWN_TOPIC_OR_PART``). Transient errors are retried for up
    to ``timeout_s``; then :class:`TopicConfigError` names the call and the last error.
    """
    deadline = time.monotonic() + timeout_s

    def leaders_known(budget: float) -> TopicMetadata:
        topic = admin.list_topics(topic=name, timeout=budget).topics.get(name)
        if topic is None:
            raise NotReady("the topic is not in the metadata")
        if topic.error is not None:
            raise KafkaException(topic.error)
        if not topic.partitions:
            raise NotReady("the metadata shows no partitions")
        leaderless = sorted(p.id for p in topic.partitions.values() if p.leader < 0)
        if leaderless:
            raise NotReady(f"partitions {leaderless} have no leader")
        return topic

    topic = retry_call(f"read the metadata of {purpose} {name} (Metadata)", leaders_known,
                       timeout_s, error_type=TopicConfigError)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = admin_futures(
        f"describe the configs of {purpose} {name} (DescribeConfigs)",
        lambda budget: admin.describe_configs([resource], request_timeout=budget),
        _remaining(deadline), error_type=TopicConfigError)
    entries = described[resource]
    configs = {key: entry.value for key, entry in entries.items()}
    replication = min(len(p.replicas) for p in topic.partitions.values())
    return TopicInfo(name, len(topic.partitions), replication, configs)


def _remaining(deadline: float) -> float:
    # Later steps share the caller's bound; a step never gets less than a moment.
    return max(1.0, deadline - time.monotonic())


# -- the changelog topic ----------------------------------------------------------------------

CHANGELOG_TOPIC = "changelog topic"


def changelog_topic_configs(config: KafkaChangelogConfig) -> dict[str, str]:
    """Topic-level settings the storage creates the changelog topic with.

    Both retention settings are -1 explicitly so a broker-wide default
    (``log.retention.bytes``, ``log.retention.hours``) never applies.
    """
    settings = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    if config.min_insync_replicas is not None:
        settings["min.insync.replicas"] = str(config.min_insync_replicas)
    return settings


def ensure_changelog_topic(
    admin: AdminClient, metadata: ClusterMetadata | None, config: KafkaChangelogConfig
) -> TopicInfo:
    """Create the changelog topic if missing, then describe and validate it (:func:`validate`)."""
    info = ensure_topic(admin, config.topic, config.partitions, config.replication_factor,
                        changelog_topic_configs(config), config.request_timeout_s,
                        CHANGELOG_TOPIC, metadata)
    validate(info, config)
    return info


def describe_topic(admin: AdminClient, config: KafkaChangelogConfig) -> TopicInfo:
    """Describe the existing changelog topic and validate it (``kafka-changelog topics``)."""
    info = describe_topic_info(admin, config.topic, config.request_timeout_s, CHANGELOG_TOPIC)
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
    check_size(info, "changelog topic", config.partitions, config.replication_factor)
    for key in INFINITE_RETENTION:
        found = info.configs.get(key)
        if found != "-1":
            raise TopicConfigError(
                f"changelog topic {info.name} has {key}={found}; expected {key}=-1. The "
                "broker would delete records that checkpoints still need; only garbage "
                "collection (DeleteRecords below what is retained) may remove changelog "
                f"records. Set it with: kafka-configs --alter --entity-type topics "
                f"--entity-name {info.name} --add-config {key}=-1"
            )


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


def check_size(info: TopicInfo, purpose: str, partitions: int,
               replication_factor: int | None) -> None:
    """Refuse a topic with fewer partitions or replicas than wanted (expected vs found)."""
    if info.partitions < partitions:
        raise TopicConfigError(
            f"{purpose} {info.name} has {info.partitions} partitions; expected at least "
            f"{partitions}")
    if replication_factor is not None and info.replication_factor < replication_factor:
        raise TopicConfigError(
            f"{purpose} {info.name} has replication factor {info.replication_factor}; "
            f"expected at least {replication_factor}")


#: Characters Kafka allows in a topic name.
_TOPIC_CHARACTERS = re.compile(r"[^a-zA-Z0-9._-]")
#: Kafka's longest topic name.
_MAX_TOPIC_LENGTH = 249


def application_topics(application: str) -> tuple[str, str]:
    """The default changelog and snapshot topics of ``application``:
    ``kafka-changelog-<application>-changelog`` and ``...-snapshots``.

    An application of its own topics pins only its own records: a stopped application that
    was never reset keeps what its checkpoints need, and no other application's log grows
    for it. Characters Kafka does not allow become ``-``, and an application name changed
    that way, or too long, gets a hash of the name, so two names never share topics.
    """
    name = _TOPIC_CHARACTERS.sub("-", application)
    longest = _MAX_TOPIC_LENGTH - len("kafka-changelog--snapshots") - 9
    if name != application or len(name) > longest:
        digest = hashlib.sha256(application.encode()).hexdigest()[:8]
        name = f"{name[:longest]}-{digest}"
    return f"kafka-changelog-{name}-changelog", f"kafka-changelog-{name}-snapshots"
