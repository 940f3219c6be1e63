"""The Kafka storage against a SASL_SSL (SCRAM over TLS) broker with ACLs: clear, fast
access errors naming the missing ACL."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from kafka_changelog import (
    KafkaAccessError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    KeyGroupRange,
)
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.transactional_commit import TransactionalCommitter
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.testing.pytest_plugin import SECURE_USERS
from tests.kafka.kafka_helpers import changes_of

pytestmark = [pytest.mark.broker, pytest.mark.security]


def secure_config(cluster: Any, user: str, password: str, topic: str) -> KafkaChangelogConfig:
    settings = dict(cluster.client_config(user=user, password=password))
    bootstrap = settings.pop("bootstrap.servers")
    return KafkaChangelogConfig(
        bootstrap_servers=bootstrap, client_config=settings, topic=topic, partitions=2,
        request_timeout_s=10, delivery_timeout_ms=10_000,
    )


@pytest.fixture
def topic(secure_kafka_cluster: Any) -> str:
    """A changelog topic created by the admin (a super user)."""
    name = f"secure-{uuid.uuid4().hex[:8]}"
    admin = secure_config(secure_kafka_cluster, "admin", SECURE_USERS["admin"], name)
    KafkaChangelogStorage(admin).close()
    return name


def test_wrong_password_fails_fast_with_a_clear_error(secure_kafka_cluster: Any) -> None:
    config = secure_config(secure_kafka_cluster, "alice", "wrong-password", "any")
    started = time.monotonic()
    with pytest.raises(KafkaAuthenticationError) as caught:
        KafkaChangelogStorage(config)
    assert time.monotonic() - started < 8
    message = str(caught.value)
    assert "refused" in message and "'alice'" in message
    assert "wrong-password" not in message
    assert "uthentication" in message


def test_missing_write_acl_fails_the_persist_with_the_topic_named(
    secure_kafka_cluster: Any, topic: str
) -> None:
    secure_kafka_cluster.grant("alice", "TOPIC", topic, ["DESCRIBE", "DESCRIBE_CONFIGS", "READ"])
    config = secure_config(secure_kafka_cluster, "alice", SECURE_USERS["alice"], topic)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append(1, b"x")
        started = time.monotonic()
        with pytest.raises(KafkaAuthorizationError) as caught:
            writer.persist(writer.initial_sequence_number(), 1).result(30)
        assert time.monotonic() - started < 15
        cause = caught.value
        assert type(cause) is KafkaAuthorizationError
        assert f"producing to {topic}[" in str(cause)
        # An idempotent producer without WRITE on the topic is refused its producer id.
        assert ("SASL_SSL user 'alice' lacks the ACL IDEMPOTENT_WRITE on Cluster "
                f"'kafka-cluster', or WRITE on Topic '{topic}', which implies it") in str(cause)
        assert (cause.operation, cause.resource_type, cause.resource) == (
            "IDEMPOTENT_WRITE", "Cluster", "kafka-cluster")

        # Granting WRITE makes the retried persist go through.
        secure_kafka_cluster.grant("alice", "TOPIC", topic, ["WRITE"])
        handle = writer.persist(writer.initial_sequence_number(), 2).result(30).job_owned
        assert [c.payload for c in changes_of(handle, config)] == [b"x"]


def test_a_persist_without_write_on_the_changelog_topic_raises_the_acl_error_at_once(
    secure_kafka_cluster: Any, topic: str
) -> None:
    """As an application's principal: WRITE on another topic (its checkpoint topic, say)
    gives the producer its id, and the changelog topic refuses the records. With the
    default delivery timeout (2 minutes), the persist fails as soon as the broker refuses,
    with the documented type itself (not a PersistError around it)."""
    secure_kafka_cluster.grant("alice", "TOPIC", topic, ["DESCRIBE", "DESCRIBE_CONFIGS", "READ"])
    secure_kafka_cluster.grant("alice", "TOPIC", f"{topic}-checkpoints", ["WRITE"])
    settings = dict(secure_kafka_cluster.client_config(user="alice",
                                                       password=SECURE_USERS["alice"]))
    config = KafkaChangelogConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                  client_config=settings, topic=topic, partitions=2)
    assert config.delivery_timeout_ms == 120_000
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        for key_group in range(128):  # both partitions of the topic
            writer.append(key_group, b"x" * 100)
        started = time.monotonic()
        with pytest.raises(KafkaAuthorizationError) as caught:
            writer.persist(writer.initial_sequence_number(), 1).result(60)
        assert time.monotonic() - started < 20
    error = caught.value
    assert type(error) is KafkaAuthorizationError
    assert (error.operation, error.resource_type, error.resource) == ("WRITE", "Topic", topic)
    # Whichever partition's record the broker refused first.
    assert re.fullmatch(
        rf"producing to {topic}\[[01]\] failed: SASL_SSL user 'alice' lacks the ACL WRITE on "
        rf"Topic '{topic}' \(TOPIC_AUTHORIZATION_FAILED: [^)]*Topic authorization failed\)",
        str(error)), str(error)


def test_missing_read_acl_fails_the_restore_with_the_topic_named(
    secure_kafka_cluster: Any, topic: str
) -> None:
    secure_kafka_cluster.grant("bob", "TOPIC", topic, ["DESCRIBE", "DESCRIBE_CONFIGS", "WRITE"])
    config = secure_config(secure_kafka_cluster, "bob", SECURE_USERS["bob"], topic)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append(1, b"x")
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    started = time.monotonic()
    with pytest.raises(KafkaAuthorizationError) as caught:
        changes_of(handle, config)
    assert time.monotonic() - started < 15
    assert f"reading {topic}[" in str(caught.value)
    assert f"lacks the ACL READ on Topic '{topic}'" in str(caught.value)


def wait_until_visible(settings: dict[str, Any], topic: str, timeout_s: float = 15) -> None:
    """Wait until the client of ``settings`` sees ``topic`` in its metadata."""
    admin = AdminClient(settings)
    deadline = time.monotonic() + timeout_s
    while topic not in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, f"{topic} not visible within {timeout_s} s"
        time.sleep(0.2)


def test_a_transactional_sink_without_its_transactional_id_acl_is_named(
    secure_kafka_cluster: Any,
) -> None:
    name = f"secure-checkpoints-{uuid.uuid4().hex[:8]}"
    settings = dict(secure_kafka_cluster.client_config(user="admin",
                                                       password=SECURE_USERS["admin"]))
    admin_config = CheckpointStoreConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                         client_config=settings, topic=name,
                                         request_timeout_s=10)
    KafkaCheckpointStore(admin_config).close()  # the admin creates the topic
    secure_kafka_cluster.grant("bob", "TOPIC", name,
                               ["DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE"])
    settings = dict(secure_kafka_cluster.client_config(user="bob", password=SECURE_USERS["bob"]))
    # Brokers apply a new ACL a moment later: until bob may describe the topic, it does not
    # exist for him (and a store would try to create it).
    wait_until_visible(settings, name)
    config = CheckpointStoreConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                   client_config=settings, topic=name, request_timeout_s=10)
    tid = f"tx-{name}"
    with KafkaCheckpointStore(config) as store:
        started = time.monotonic()
        with pytest.raises(KafkaAccessError, match=(
                rf"^starting transactions with transactional id '{tid}' failed: .* lacks the "
                rf"ACL WRITE on TransactionalId '{tid}' \(TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
                )) as refused:
            TransactionalCommitter(store, tid)
        assert time.monotonic() - started < 15
        assert isinstance(refused.value, KafkaAuthorizationError)
        assert (refused.value.operation, refused.value.resource_type,
                refused.value.resource) == ("WRITE", "TransactionalId", tid)
        # Granted, the same committer commits (brokers apply a new ACL a moment later).
        secure_kafka_cluster.grant("bob", "TRANSACTIONAL_ID", tid, ["WRITE", "DESCRIBE"])
        deadline = time.monotonic() + 15
        while True:
            try:
                committer = TransactionalCommitter(store, tid)
                break
            except KafkaAccessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        with committer:
            checkpoint = CompletedCheckpoint("app", 1, 1, 128, ())
            committer.commit(checkpoint, [])
        assert store.latest("app") == checkpoint
