"""Create and delete topics on a cluster, waiting until they are really usable."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_changelog.local_kafka.errors import KafkaHarnessError

_UNKNOWN_TOPIC = KafkaError.UNKNOWN_TOPIC_OR_PART


def unique_topic_name(prefix: str = "test") -> str:
    """A topic name that no other test uses: ``<prefix>-<random hex>``, legal in Kafka."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", prefix).strip("-.")[:180] or "test"
    return f"{cleaned}-{uuid.uuid4().hex[:12]}"


def create_topic(
    admin: AdminClient,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create topic ``name`` and wait until every partition has a leader.

    ``replication_factor=None`` takes the broker default (``default.replication.factor``).
    """
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout)
    except KafkaException as exc:
        raise KafkaHarnessError(f"could not create topic {name!r}: {exc.args[0]}") from exc
    wait_for_leaders(admin, name, partitions, timeout=timeout)


def wait_for_leaders(admin: AdminClient, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Block until metadata shows ``partitions`` partitions of ``name``, each with a leader.

    The controller acknowledges a creation before every broker has applied it;
    producing right away could otherwise see ``UNKNOWN_TOPIC_OR_PART``.
    """
    deadline = time.monotonic() + timeout
    state = "no metadata yet"
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(name, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            state = str(exc)
        else:
            topic = meta.topics.get(name)
            if topic is not None and topic.error is None:
                leaders = {p.id: p.leader for p in topic.partitions.values()}
                if len(leaders) == partitions and all(lead >= 0 for lead in leaders.values()):
                    return
                state = f"partition leaders {leaders}"
            elif topic is not None:
                state = str(topic.error)
        time.sleep(0.1)
    raise KafkaHarnessError(f"topic {name!r} was not ready within {timeout:.0f} s: {state}")


def delete_topics(admin: AdminClient, names: Iterable[str], timeout: float = 30.0) -> None:
    """Delete ``names``; topics that are already gone are fine."""
    names = list(names)
    if not names:
        return
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    failures: dict[str, Any] = {}
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if not (isinstance(error, KafkaError) and error.code() == _UNKNOWN_TOPIC):
                failures[name] = error
    if failures:
        raise KafkaHarnessError(f"could not delete topics: {failures}")
