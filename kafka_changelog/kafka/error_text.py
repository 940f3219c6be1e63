"""Readable errors from librdkafka error codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

from ..errors import (
    KafkaAccessError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    PersistError,
)

_AUTH_CODES = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
#: Per authorization error: the resource type and the operation its ACL must allow (a
#: topic's operation depends on what was done: the caller says).
_ACL_OF: dict[int, tuple[str, str]] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ("Topic", ""),
    KafkaError.GROUP_AUTHORIZATION_FAILED: ("Group", "READ"),
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ("TransactionalId", "WRITE"),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: ("Cluster", "IDEMPOTENT_WRITE"),
}
_AUTHZ_HINTS = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the principal lacks an ACL for this topic operation",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: (
        "the principal lacks a cluster ACL; an idempotent producer needs WRITE on a topic"
    ),
    KafkaError.GROUP_AUTHORIZATION_FAILED: "the principal lacks a READ ACL on the consumer group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the principal lacks a transactional-id ACL",
}


#: Codes worth retrying even when librdkafka does not flag the error retriable: a
#: leader moved or died (stale metadata, an old leader epoch), a topic created a
#: moment ago that not every broker knows yet, a broker that did not answer in time.
RETRIABLE_CODES: frozenset[int] = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER in newer Kafka
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.NOT_CONTROLLER,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    # The broker a request was waiting on left the metadata (it was killed) and
    # librdkafka dropped its handle: the next attempt asks the new leader.
    KafkaError._DESTROY_BROKER,
    KafkaError.THROTTLING_QUOTA_EXCEEDED,
})


def is_access_error(error: KafkaError) -> bool:
    """True for authentication and authorization failures (retrying will not help)."""
    return error.code() in _AUTH_CODES or error.code() in _AUTHZ_HINTS


def is_retriable(error: KafkaError) -> bool:
    """True for transient errors a later attempt (with fresh metadata) may not meet.

    Access errors and fatal errors never are, whatever librdkafka flags.
    """
    if is_access_error(error) or error.fatal():
        return False
    return error.code() in RETRIABLE_CODES or error.retriable()


def describe(error: KafkaError) -> str:
    """``NAME (code): message`` plus a hint for access errors."""
    text = f"{error.name()} ({error.code()}): {error.str()}"
    hint = _AUTHZ_HINTS.get(error.code())
    if hint:
        text += f" — {hint}"
    elif error.code() in _AUTH_CODES:
        text += " — check sasl.username / sasl.password / sasl.mechanism"
    return text


def access_error(error: KafkaError, doing: str, settings: Mapping[str, Any] | None = None,
                 *, operation: str = "", resource: str = "") -> KafkaAccessError:
    """The exception for an access error met while ``doing`` something:
    :class:`KafkaAuthenticationError` for credentials, :class:`KafkaAuthorizationError`
    naming the missing ACL (``operation`` on the resource: a topic's operation and name
    come from the caller; a transactional id, group or the cluster from ``settings``)."""
    known = settings is not None and any(
        k in settings for k in ("security.protocol", "sasl.username", "ssl.certificate.location"))
    who = principal_of(settings) if settings is not None and known else "the principal"
    if error.code() in _AUTH_CODES:
        return KafkaAuthenticationError(f"{doing} failed: Kafka refused {who}: "
                                        f"{describe(error)}")
    resource_type, acl_operation = _ACL_OF.get(error.code(), ("", ""))
    given = settings or {}
    name, also = "", ""
    if resource_type == "Topic":
        acl_operation, name = operation, resource
    elif resource_type == "Cluster":
        # An idempotent (or transactional) producer's id: WRITE on the topic implies it.
        name = "kafka-cluster"
        if operation == "WRITE" and resource:
            also = f", or WRITE on Topic {resource!r}, which implies it"
    elif resource_type == "TransactionalId":
        name = str(given.get("transactional.id", ""))
    elif resource_type == "Group":
        name = str(given.get("group.id", ""))
    operation, resource = acl_operation, name
    acl = (f"the ACL {operation}" if operation else "an ACL") + (
        f" on {resource_type}" if resource_type else "") + (f" {resource!r}" if resource else "")
    return KafkaAuthorizationError(
        f"{doing} failed: {who} lacks {acl}{also} ({error.name()}: {error.str()})",
        operation=operation, resource_type=resource_type, resource=resource)


def delivery_error(topic: str, partition: int, error: KafkaError,
                   settings: Mapping[str, Any] | None = None) -> Exception:
    """The exception a failed record delivery turns into."""
    doing = f"producing to {topic}[{partition}]"
    if is_access_error(error):
        return access_error(error, doing, settings, operation="WRITE", resource=topic)
    return PersistError(f"{doing} failed: {describe(error)}")


def principal_of(settings: Mapping[str, Any]) -> str:
    """Who the settings authenticate as, for error messages (never the password)."""
    user = settings.get("sasl.username")
    protocol = settings.get("security.protocol", "PLAINTEXT")
    if user:
        return f"{protocol} user {user!r}"
    certificate = settings.get("ssl.certificate.location")
    if certificate:
        return f"{protocol} client certificate {certificate}"
    return str(protocol)
