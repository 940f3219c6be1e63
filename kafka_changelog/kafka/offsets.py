"""Offsets of topic partitions: watermarks, offsets by spec, and deleting records below one.

Every call retries transient broker errors (leader changes, stale metadata) within its
time budget (:mod:`kafka_changelog.kafka.admin_retry`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from .admin_retry import admin_futures, retry_call

#: librdkafka fails a ListOffsets or DeleteRecords request with ``_NOENT`` ("Failed
#: to query partition leaders: No leaders found") when none of its partitions has a
#: leader in the client's metadata: a replicated topic whose leaders are not elected
#: yet, or are being re-elected. For these two requests that is a wait, not a final
#: answer; elsewhere ``_NOENT`` means "not found", so it stays out of the shared rules.
LEADERLESS_CODES: frozenset[int] = frozenset({KafkaError._NOENT})


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

    # After a leader dies the consumer asks the dead leader again until its metadata is
    # refreshed: ask for the topic's metadata between attempts.
    return retry_call(f"read the offsets of {topic}[{partition}]", attempt, timeout_s,
                      refresh=lambda: consumer.list_topics(topic, timeout=1.0))


def list_offsets(
    admin: AdminClient, topic: str, partitions: int, spec: OffsetSpec, timeout_s: float
) -> dict[int, int]:
    """Offsets of every partition for ``spec`` (earliest or latest).

    Leader changes (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, a dead
    leader's connection) and partitions without a leader yet (a topic created a
    moment ago on several brokers) are retried with fresh metadata for up to
    ``timeout_s``.
    """
    request = {TopicPartition(topic, p): spec for p in range(partitions)}
    answers = admin_futures(
        f"list offsets of {topic} (ListOffsets)",
        lambda budget: admin.list_offsets(request, request_timeout=budget),
        timeout_s, refresh=_metadata_refresh(admin, topic),
        check=lambda tp, info: _no_offset(tp, info.offset),
        transient_codes=LEADERLESS_CODES)
    return {tp.partition: int(info.offset) for tp, info in answers.items()}


def delete_below(
    admin: AdminClient, topic: str, offsets: Mapping[int, int], timeout_s: float
) -> dict[int, int]:
    """``DeleteRecords`` below each offset; returns each partition's new log start.

    Retrying is safe: deleting below an offset already deleted below changes
    nothing. Transient errors are retried as in :func:`list_offsets`.
    """
    if not offsets:
        return {}
    request = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    answers = admin_futures(
        f"delete records of {topic} below offsets {dict(sorted(offsets.items()))} "
        "(DeleteRecords)",
        lambda budget: admin.delete_records(request, request_timeout=budget),
        timeout_s, refresh=_metadata_refresh(admin, topic),
        check=lambda tp, deleted: _no_offset(tp, deleted.low_watermark),
        transient_codes=LEADERLESS_CODES)
    return {tp.partition: int(deleted.low_watermark) for tp, deleted in answers.items()}


def _metadata_refresh(admin: AdminClient, topic: str) -> Callable[[], object]:
    # Asking for the topic's metadata updates the client's cache, so the next
    # attempt goes to the partition's current leader with its current epoch.
    return lambda: admin.list_topics(topic=topic, timeout=5.0)


def _no_offset(tp: TopicPartition, offset: int) -> str | None:
    # A request that timed out on a dead leader may come back without an error but
    # with a negative offset (OFFSET_INVALID, -1001): that is no answer, ask again.
    if offset < 0:
        return f"{tp.topic}[{tp.partition}] answered offset {offset} (no offset known)"
    return None
