"""A Structured Streaming source for Kafka topics, in Python (``format("kafka-topic")``).

Spark's own Kafka source needs the JVM connector jars of the exact Spark version; this
source needs nothing but confluent-kafka, and gives rows with the same columns
(``key, value, topic, partition, offset, timestamp``), so a query can switch between
the two by changing the format. Offsets are ``{"partition": next offset}``; a
micro-batch reads ``[start, end)`` of every partition, and Spark's offset log makes a
re-run batch read the same records again.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from kafka_changelog.errors import ChangelogError

SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


@dataclass(frozen=True)
class TopicSlice(InputPartition):
    """Offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int


def _client_settings(options: Mapping[str, str]) -> dict[str, Any]:
    settings = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in settings:
        raise ChangelogError("format('kafka-topic') needs the option kafka.bootstrap.servers")
    return settings


class KafkaTopicSource(DataSource):
    """Options: ``kafka.bootstrap.servers`` (and any ``kafka.<librdkafka setting>``),
    ``subscribe`` (one topic), ``startingOffsets`` (``earliest`` | ``latest``),
    ``maxOffsetsPerTrigger`` (records per micro-batch across partitions)."""

    @classmethod
    def name(cls) -> str:
        return "kafka-topic"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> KafkaTopicStreamReader:
        # Spark's options are case-insensitive: keep its mapping (dict() would lower-case keys).
        return KafkaTopicStreamReader(self.options)


class KafkaTopicStreamReader(DataSourceStreamReader):
    """Micro-batches of a topic's partitions."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.settings = _client_settings(options)
        topic = options.get("subscribe")
        if not topic:
            raise ChangelogError("format('kafka-topic') needs the option subscribe=<topic>")
        self.topic = topic
        self.starting = options.get("startingOffsets", "earliest")
        self.max_per_trigger = int(options["maxOffsetsPerTrigger"]) if (
            "maxOffsetsPerTrigger" in options) else None
        # Where the next batch starts, as far as this reader instance has seen (Spark may
        # call latestOffset() without the start offset).
        self._next_start: dict[str, int] | None = None

    def _consumer(self) -> Consumer:
        return Consumer({**self.settings, "group.id": "kafka-topic-source",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.wait.max.ms": 20})

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        consumer = self._consumer()
        try:
            metadata = consumer.list_topics(self.topic, timeout=30)
            found = metadata.topics.get(self.topic)
            if found is None or found.error is not None:
                raise ChangelogError(f"topic {self.topic} is not available: "
                                     f"{found.error if found else 'missing'}")
            return {
                str(p): consumer.get_watermark_offsets(TopicPartition(self.topic, p), 30)
                for p in sorted(found.partitions)
            }
        finally:
            consumer.close()

    def initialOffset(self) -> dict[str, int]:
        marks = self._watermarks()
        use = 1 if self.starting == "latest" else 0
        self._next_start = {p: int(m[use]) for p, m in marks.items()}
        return dict(self._next_start)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None
                     ) -> dict[str, int]:
        latest = {p: int(high) for p, (_, high) in self._watermarks().items()}
        start = start if start is not None else self._next_start
        if self.max_per_trigger is None or start is None:
            return latest
        # Spread the per-trigger budget over the partitions, in partition order.
        budget = self.max_per_trigger
        capped = dict(start)
        for p in sorted(latest, key=int):
            begin = int(start.get(p, 0))
            take = min(budget, latest[p] - begin)
            capped[p] = begin + max(0, take)
            budget -= max(0, take)
        return capped

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[TopicSlice]:
        self._next_start = dict(end)
        return [TopicSlice(int(p), int(start.get(p, 0)), int(e))
                for p, e in sorted(end.items(), key=lambda kv: int(kv[0]))
                if int(e) > int(start.get(p, 0))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicSlice)
        consumer = self._consumer()
        try:
            consumer.assign([TopicPartition(self.topic, partition.partition, partition.start)])
            position = partition.start
            while position < partition.end:
                messages = consumer.consume(min(1000, partition.end - position), timeout=1.0)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise ChangelogError(
                            f"reading {self.topic}[{partition.partition}] at {position}: "
                            f"{error.str()}")
                    offset = message.offset() or 0
                    if offset >= partition.end:
                        position = partition.end
                        break
                    position = offset + 1
                    _, millis = message.timestamp()
                    yield (message.key(), message.value(), self.topic, partition.partition,
                           offset, dt.datetime.fromtimestamp(millis / 1000, dt.timezone.utc))
        finally:
            consumer.close()

    def commit(self, end: dict[str, int]) -> None:
        """Spark's checkpoint location keeps the offsets; only remember where we are."""
        self._next_start = dict(end)


def offsets_json(offsets: dict[str, int]) -> str:
    """Offsets as JSON (for logs)."""
    return json.dumps(offsets, sort_keys=True)
