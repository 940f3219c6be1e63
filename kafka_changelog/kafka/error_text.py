"""Readable errors from librdkafka error codes."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from ..errors import KafkaAccessError, PersistError

_AUTH_CODES = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
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


def delivery_error(topic: str, partition: int, error: KafkaError) -> Exception:
    """The exception a failed record delivery turns into."""
    message = f"producing to {topic}[{partition}] failed: {describe(error)}"
    if is_access_error(error):
        return KafkaAccessError(message)
    return PersistError(message)


def principal_of(settings: dict[str, Any]) -> str:
    """Who the settings authenticate as, for error messages (never the password)."""
    user = settings.get("sasl.username")
    protocol = settings.get("security.protocol", "PLAINTEXT")
    return f"{protocol} user {user!r}" if user else str(protocol)
