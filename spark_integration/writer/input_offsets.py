"""The input offsets a state write records (option ``startingOffsets``): where the streaming
query continues from the written state.

The value has the form of the Kafka source's ``startingOffsets`` JSON, partition by
partition: ``{"clicks": {"0": 1200, "1": -1}}``. An offset ``-1`` is the partition's latest
offset and ``-2`` its earliest, resolved when the write is planned, on the brokers of the
state (``kafka.bootstrap.servers``): the input topic must be there for those. Explicit
offsets are recorded as given (the input may live on other brokers).
"""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer

from kafka_changelog.kafka.live_clients import new_consumer
from kafka_changelog.kafka.offsets import watermarks
from kafka_changelog.state.checkpoints.source_offsets import (
    SourceOffsets,
    SourceOffsetsError,
    parse_offsets,
)
from kafka_changelog.state.history.entry_changes import StateWriteError

from ..reader.planning import ReaderOptions
from .options import STARTING_OFFSETS_OPTION

#: The Kafka source's offsets meaning "the latest" and "the earliest".
LATEST, EARLIEST = -1, -2


def written_input_offsets(raw: str, connection: ReaderOptions) -> SourceOffsets:
    """The offsets option ``startingOffsets`` gives (``raw``), ``-1``/``-2`` resolved
    (module docstring). :class:`StateWriteError` names what is wrong: not the JSON, an
    offset below ``-2``, a partition to resolve that the state's brokers do not have."""
    try:
        given = parse_offsets(raw, f"option {STARTING_OFFSETS_OPTION}")
    except SourceOffsetsError as exc:
        raise StateWriteError(str(exc)) from None
    if not given:
        raise StateWriteError(f"option {STARTING_OFFSETS_OPTION} names no topic: {raw!r}")
    for topic, partitions in sorted(given.items()):
        for partition, offset in sorted(partitions.items()):
            if offset < EARLIEST or partition < 0:
                raise StateWriteError(
                    f"option {STARTING_OFFSETS_OPTION}: {topic}[{partition}] offset {offset}; "
                    "an offset is the next one to read (>= 0), or -1 (latest) or -2 "
                    "(earliest)")
    if all(o >= 0 for partitions in given.values() for o in partitions.values()):
        return given
    return _resolved(given, connection)


def _resolved(given: SourceOffsets, connection: ReaderOptions) -> SourceOffsets:
    consumer = new_consumer(
        {**connection.client_settings(),
         "group.id": f"kafka-changelog-state-write-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False},
        f"the input offsets of a state write to application {connection.application!r}")
    try:
        resolved: SourceOffsets = {}
        for topic, partitions in sorted(given.items()):
            unknown = [p for p, o in partitions.items() if o < 0]
            if unknown:
                _check_partitions(consumer, topic, unknown, connection)
            resolved[topic] = {
                p: (o if o >= 0 else watermarks(consumer, topic, p, connection.request_timeout_s)
                    [0 if o == EARLIEST else 1])
                for p, o in sorted(partitions.items())}
        return resolved
    finally:
        consumer.close()


def _check_partitions(consumer: Consumer, topic: str, wanted: list[int],
                      connection: ReaderOptions) -> None:
    metadata = consumer.list_topics(topic, timeout=connection.request_timeout_s)
    found = metadata.topics.get(topic)
    have = sorted(found.partitions) if found is not None and found.error is None else []
    missing = sorted(p for p in wanted if p not in have)
    if missing:
        raise StateWriteError(
            f"option {STARTING_OFFSETS_OPTION}: {topic}{missing} at -1/-2 are resolved on "
            f"the state's brokers ({connection.bootstrap_servers}), where topic {topic!r} "
            + (f"has partitions {have}" if have else "does not exist")
            + "; give those offsets explicitly")


__all__ = ["EARLIEST", "LATEST", "written_input_offsets"]
