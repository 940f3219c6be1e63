"""The snapshot store in a compacted Kafka topic (chunk layout: ``kafka_changelog.state``)."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..errors import ChangelogError, TopicConfigError
from ..state.errors import SnapshotWriteError
from ..state.records import OutRecord, RecordAppender, RecordSource, StoredRecord
from ..state.snapshots.snapshot_store import (
    BROKER_DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_CHUNK_BYTES,
    KIB,
    RECORD_OVERHEAD_BYTES,
    LiveKey,
    SnapshotStore,
)
from .access import connect_admin
from .client_settings import KafkaConnection
from .consume import consume_range, end_of_partition
from .error_text import access_error, describe, is_access_error
from .live_clients import new_consumer
from .offsets import watermarks
from .producer import AckedProducer
from .topics import TopicInfo, check_infinite_retention, check_size, ensure_topic

#: Chunk bytes a materialization written key group by key group may have produced and
#: not yet seen acknowledged: beyond this, the next key group waits (bounded memory).
MAX_UNACKED_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class SnapshotStoreConfig(KafkaConnection):
    """How :class:`KafkaSnapshotStore` connects, and the topic it keeps chunks in.

    ``client_config`` passes librdkafka settings (security included) to every
    client; ``producer_config``/``consumer_config``/``admin_config`` override per
    client kind (``acks=all`` and idempotence cannot be overridden).
    ``topic_overrides`` are extra topic configs used when creating the topic.
    """

    #: Chunk topic (``cleanup.policy=compact,delete``, infinite retention); created if missing.
    topic: str = "kafka-changelog-snapshots"
    #: Partitions to create the topic with; an existing topic must have at least this many.
    partitions: int = 16
    #: Replication factor to create the topic with (None: the broker's default).
    replication_factor: int | None = None
    #: Key groups in all; key group kg's chunks go to ``kg * partitions // max_parallelism``.
    max_parallelism: int = 128
    #: Largest chunk of state data in one record.
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    #: Extra topic configs when creating the topic (e.g. fast compaction in tests).
    topic_overrides: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_bootstrap_servers()
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        if not 1 <= self.max_parallelism <= 1 << 15:
            raise ValueError(f"max_parallelism must be in [1, 32768], got {self.max_parallelism}")
        if self.max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {self.max_chunk_bytes}")

    @property
    def max_record_bytes(self) -> int:
        """Upper bound of a chunk record (data plus overhead)."""
        return self.max_chunk_bytes + RECORD_OVERHEAD_BYTES

    def producer(self) -> dict[str, Any]:
        """Producer settings (``acks=all`` and idempotence enforced)."""
        return self._producer_settings(5, "lz4", 120_000, self.max_record_bytes)

    def consumer(self) -> dict[str, Any]:
        """Settings of chunk readers (assigned partitions, no commits)."""
        fetch = max(1_048_576, self.max_record_bytes + 64 * KIB)
        return self._reader_settings(
            "kafka-changelog-state-reader",
            **{"fetch.max.bytes": max(52_428_800, fetch),
               "max.partition.fetch.bytes": fetch,
               # A seek discards what was prefetched: keep the prefetch small.
               "queued.max.messages.kbytes": max(4096, fetch // KIB),
               # Chunks are read where a handle says they are, then the next run of
               # offsets is assigned: the new assignment's fetch waits for the one in
               # flight, which the broker holds up to this long once the consumer has
               # read to a partition's end (ten records of eight partitions, one
               # consumer: 200 ms with the 20 ms of other readers, 16 ms with 1 ms; so
               # is a full prefetch queue's backoff). Readers close after their reads.
               "fetch.wait.max.ms": 1, "fetch.queue.backoff.ms": 1})

    def topic_configs(self) -> dict[str, str]:
        """Configs the topic is created with."""
        configs = {
            "cleanup.policy": "compact,delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
        }
        if self.max_record_bytes > BROKER_DEFAULT_MAX_MESSAGE_BYTES:
            configs["max.message.bytes"] = str(self.max_record_bytes + 64 * KIB)
        configs.update(self.topic_overrides)
        return configs


def validate_snapshot_topic(info: TopicInfo, config: SnapshotStoreConfig) -> None:
    """Refuse a chunk topic that could lose live chunks or cannot hold them (expected vs found)."""
    check_infinite_retention(info, "snapshot topic")
    check_size(info, "snapshot topic", config.partitions, config.replication_factor)
    limit = info.configs.get("max.message.bytes")
    if limit is not None and int(limit) < config.max_record_bytes:
        raise TopicConfigError(
            f"snapshot topic {info.name} has max.message.bytes={limit}; expected at least "
            f"{config.max_record_bytes} for chunks of max_chunk_bytes={config.max_chunk_bytes}"
        )


class KafkaSnapshotView(SnapshotStore):
    """A read-only snapshot store over Kafka: reads and verifies chunks, writes nothing.

    Needs READ and DESCRIBE on the topic only: no topic check, no producer (the Spark
    reader and the command line use it). Writing raises :class:`ChangelogError`.
    """

    def __init__(self, config: SnapshotStoreConfig) -> None:
        super().__init__(config.topic, config.partitions, config.max_parallelism,
                         config.max_chunk_bytes)
        self.config = config

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        raise ChangelogError(f"cannot write {what}: snapshot topic {self.topic} is open "
                             "read-only")

    def _open_source(self, topic: str) -> RecordSource:
        return KafkaRecordSource(self.config, topic)

    def _begin_append(self, what: str) -> RecordAppender:
        raise ChangelogError(f"cannot write {what}: snapshot topic {self.topic} is open "
                             "read-only")

    def live_keys(self) -> list[LiveKey]:
        live: dict[tuple[int, bytes], int] = {}
        consumer = new_consumer({**self.config.consumer(), "enable.partition.eof": True},
                                f"scan of snapshot topic {self.config.topic}")
        timeout = self.config.request_timeout_s
        try:
            for partition in range(self.partitions):
                low, high = watermarks(consumer, self.topic, partition, timeout)

                def on_error(error: KafkaError, position: int, partition: int = partition,
                             high: int = high) -> int:
                    if end_of_partition(error):
                        return high  # read up to what is visible: nothing beyond counts
                    if is_access_error(error):
                        raise access_error(error, f"reading {self.topic}[{partition}]",
                                           operation="READ", resource=self.topic)
                    raise ChangelogError(f"reading {self.topic}[{partition}] at offset "
                                         f"{position} failed: {describe(error)}")

                for message in consume_range(consumer, self.topic, partition, low, high,
                                             timeout, on_error):
                    key = (partition, message.key() or b"")
                    if message.value() is None:
                        live.pop(key, None)
                    else:
                        live[key] = message.timestamp()[1]
        finally:
            consumer.close()
        return sorted(LiveKey(partition, key.decode(errors="replace"), written)
                      for (partition, key), written in live.items())


class KafkaSnapshotStore(KafkaSnapshotView):
    """Chunks in a compacted Kafka topic (created, or validated, on construction)."""

    def __init__(self, config: SnapshotStoreConfig) -> None:
        admin, _ = connect_admin(config.admin(), config.request_timeout_s)
        info = ensure_topic(admin, config.topic, config.partitions, config.replication_factor,
                            config.topic_configs(), config.request_timeout_s, "snapshot topic")
        validate_snapshot_topic(info, config)
        super().__init__(config)
        #: The topic as found (or created).
        self.topic_info = info
        self._producer = AckedProducer(config.producer(), config.topic, SnapshotWriteError,
                                       config.request_timeout_s)
        self._closed = False

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        if self._closed:
            raise ChangelogError(f"snapshot store of topic {self.topic} is closed")
        return self._producer.produce_all(records, what)

    def _begin_append(self, what: str) -> RecordAppender:
        if self._closed:
            raise ChangelogError(f"snapshot store of topic {self.topic} is closed")
        return self._producer.session(what, MAX_UNACKED_CHUNK_BYTES)

    def close(self) -> None:
        """Wait for anything queued, then release the producer (idempotent)."""
        if not self._closed:
            self._closed = True
            self._producer.close(self.config.request_timeout_s)


def header_list(message: Message) -> list[tuple[str, bytes]]:
    """A message's headers as (name, bytes) pairs."""
    headers = message.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(name, value.encode() if isinstance(value, str) else value or b"")
            for name, value in pairs]


class KafkaRecordSource(RecordSource):
    """Reads records by offset with one consumer, seeking only when not already there.

    :meth:`fetch_all` reads a known plan with up to :data:`FETCH_DEPTH` consumers in turn:
    while one reads a run of offsets (a partition from one offset on), the others are
    already fetching the next runs, so a plan of many short runs (a catch-up's delta
    layers, one record each) does not wait a fetch round trip per run.
    """

    def __init__(self, config: SnapshotStoreConfig, topic: str) -> None:
        self._config = config
        self._topic = topic
        self._timeout = config.request_timeout_s
        self._consumer = new_consumer(config.consumer(), f"snapshot topic {config.topic}")
        self._spares: list[Consumer] = []
        self._next: tuple[int, int] | None = None

    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        if self._next != (partition, offset):
            self._consumer.assign([TopicPartition(self._topic, partition, offset)])
        self._next = None
        found = self._read(self._consumer, partition, offset)
        if not isinstance(found, str):
            self._next = (partition, offset + 1)
        return found

    def fetch_all(self, locations: Sequence[tuple[int, int]]
                  ) -> Generator[StoredRecord | str, None, None]:
        runs = _runs(locations)
        if len(runs) < 2:
            yield from super().fetch_all(locations)
            return
        depth = min(len(runs), FETCH_DEPTH)
        while len(self._spares) < depth - 1:
            self._spares.append(new_consumer(self._config.consumer(),
                                             f"snapshot topic {self._config.topic}"))
        consumers = (self._consumer, *self._spares[:depth - 1])
        self._next = None

        def assign(index: int) -> None:
            partition, offsets = runs[index]
            consumers[index % depth].assign([TopicPartition(self._topic, partition, offsets[0])])

        try:
            for index in range(depth):  # the first runs are fetched at once
                assign(index)
            for index, (partition, offsets) in enumerate(runs):
                consumer = consumers[index % depth]
                for position, offset in enumerate(offsets):
                    found = self._read(consumer, partition, offset)
                    if isinstance(found, str) and position + 1 < len(offsets):
                        # Read past it: the run goes on from its next offset.
                        consumer.assign([TopicPartition(self._topic, partition,
                                                        offsets[position + 1])])
                    yield found
                if index + depth < len(runs):  # this consumer fetches a later run meanwhile
                    assign(index + depth)
        finally:
            for consumer in consumers:
                consumer.unassign()

    def _read(self, consumer: Consumer, partition: int, offset: int) -> StoredRecord | str:
        """The record at ``offset`` from ``consumer``, assigned at or before it."""
        deadline = time.monotonic() + self._timeout
        while True:
            messages = consumer.consume(1, timeout=0.2)
            if not messages:
                if time.monotonic() > deadline:
                    raise ChangelogError(
                        f"timed out reading {self._topic}[{partition}] at offset {offset} "
                        f"after {self._timeout:.0f} s"
                    )
                continue
            message = messages[0]
            if message.topic() != self._topic or message.partition() != partition:
                continue  # left over from an earlier assignment
            error = message.error()
            if error is not None:
                found = self._after_error(consumer, partition, offset, message, error)
                if found is None:
                    continue
                return found
            at = message.offset() or 0
            if at < offset:
                continue  # before the offset (prefetched before the seek, or skipped)
            if at > offset:
                shown = (message.key() or b"").decode(errors="replace")
                kind = "a tombstone" if message.value() is None else "a record"
                return (f"no record at offset {offset}: it was removed by compaction (the "
                        f"next record, at offset {at}, is {kind} with key {shown!r})")
            return StoredRecord(message.key(), message.value(), header_list(message))

    def _after_error(
        self, consumer: Consumer, partition: int, offset: int, message: Message,
        error: KafkaError
    ) -> str | None:
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            # Every chunk a handle names was acknowledged before the handle existed, so
            # reaching the log end without meeting the offset means it is gone.
            end = message.offset() or 0
            return (f"no record at offset {offset}: the log has no record from there to "
                    f"its end at offset {end} (removed by compaction, or the topic lost data)")
        if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return None  # readers never use the group; no group ACL is needed
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            low, high = watermarks(consumer, self._topic, partition, self._timeout)
            return (f"no record at offset {offset}: the log holds offsets {low} to {high - 1} "
                    "(deleted records or a recreated topic)")
        if is_access_error(error):
            raise access_error(error, f"reading {self._topic}[{partition}]",
                               operation="READ", resource=self._topic)
        raise ChangelogError(
            f"reading {self._topic}[{partition}] at offset {offset} failed: {describe(error)}"
        )

    def close(self) -> None:
        self._consumer.close()
        for spare in self._spares:
            spare.close()


#: Runs of a plan fetched at once at most (consumers of one :meth:`KafkaRecordSource.fetch_all`).
FETCH_DEPTH = 4

#: Offsets further apart than this in one partition start a new run (seeking beats
#: reading past the records in between).
RUN_GAP = 16


def _runs(locations: Sequence[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """The locations as runs: consecutive ones of one partition at rising offsets, at
    most ``RUN_GAP`` apart."""
    runs: list[tuple[int, list[int]]] = []
    for partition, offset in locations:
        if runs and runs[-1][0] == partition and 0 < offset - runs[-1][1][-1] <= RUN_GAP:
            runs[-1][1].append(offset)
        else:
            runs.append((partition, [offset]))
    return runs
