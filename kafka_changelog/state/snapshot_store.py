"""Snapshot stores: write a materialization as immutable chunks, read a handle back exactly.

Every chunk is a record keyed ``{backend_id}/{key_group}/{materialization_id}/{chunk_no}``
(never overwritten), and the handle remembers its partition and offset. Reading
seeks straight to those offsets and checks key, fields and CRC-32, so an old
handle reads exactly what it was written with, whatever newer materializations
or the log cleaner did since; a discarded chunk (tombstoned, then cleaned)
raises :class:`SnapshotMissingError`. See ``docs/snapshots-and-checkpoints.md``.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..errors import ChangelogError, KafkaAccessError, TopicConfigError
from ..kafka.access import connect_admin
from ..kafka.client_settings import KafkaClientSettings
from ..kafka.errors import describe, is_access_error
from ..kafka.partitioning import partition_for_key_group
from ..kafka.topics import TopicInfo
from ..keygroups import KeyGroupRange
from ..serialization import decode, encode
from .errors import SnapshotCorruptError, SnapshotMissingError, SnapshotWriteError
from .kafka_io import (
    AckedProducer,
    OutRecord,
    check_infinite_retention,
    ensure_topic,
    watermarks,
)
from .snapshot import ChunkRef, SnapshotHandle, chunk_key

CHUNK_SCHEMA = "snapshot_chunk"
CHUNK_SCHEMA_VERSION = 1
HEADER_SCHEMA = "kc.schema"
HEADER_CRC32 = "kc.crc32"
SCHEMA_HEADER_VALUE = f"{CHUNK_SCHEMA}/{CHUNK_SCHEMA_VERSION}"

KIB = 1024
DEFAULT_MAX_CHUNK_BYTES = 512 * KIB
#: Bytes a chunk record may need beyond its data (key, Avro fields, headers, batch framing).
RECORD_OVERHEAD_BYTES = 16 * KIB
#: The broker's default ``max.message.bytes`` of a topic.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


_Store = TypeVar("_Store", bound="SnapshotStore")


class StoredRecord(NamedTuple):
    """A record as found at an offset: key, value (None: tombstone) and headers."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


class _RecordSource(ABC):
    """Fetches single records of one topic by (partition, offset)."""

    @abstractmethod
    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        """The record at ``offset``, or a description of what is there instead."""

    @abstractmethod
    def close(self) -> None:
        """Release what the source holds."""


class SnapshotStore(ABC):
    """Where materializations put their chunks (see the module docstring).

    Implementations provide appending records and fetching a record by offset;
    chunking, handles, verification and errors are the same for all.
    """

    def __init__(self, topic: str, partitions: int, max_parallelism: int,
                 max_chunk_bytes: int) -> None:
        if max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        if not 1 <= max_parallelism <= 1 << 15:
            raise ValueError(f"max_parallelism must be in [1, 32768], got {max_parallelism}")
        self.topic = topic
        self.partitions = partitions
        self.max_parallelism = max_parallelism
        self.max_chunk_bytes = max_chunk_bytes

    # -- the operations ------------------------------------------------------------------

    def write(
        self,
        backend_id: str,
        materialization_id: int,
        key_group_range: KeyGroupRange,
        states: Mapping[int, bytes],
        reused: Mapping[int, Sequence[ChunkRef]],
        materialized_sequence_number: int,
    ) -> SnapshotHandle:
        """Write ``states`` as chunks and return the handle once every chunk is acknowledged.

        ``states`` maps a key group to its serialized state (split into chunks of
        at most ``max_chunk_bytes``; ``b""`` is stored as one empty chunk);
        ``reused`` maps a key group to the chunks of an earlier materialization to
        refer to instead (unchanged key groups). Key groups in neither are empty.
        """
        _check_write(backend_id, materialization_id, key_group_range, states, reused,
                     self.max_parallelism)
        planned: list[tuple[ChunkRef, OutRecord]] = []
        for key_group in sorted(states):
            planned.extend(self._chunk_records(
                backend_id, materialization_id, key_group, states[key_group]))
        offsets = self._append(
            [record for _, record in planned],
            f"{len(planned)} snapshot chunks of backend {backend_id} materialization "
            f"{materialization_id}",
        ) if planned else []
        written = [
            ChunkRef(ref.key_group, ref.materialization_id, ref.chunk_no, ref.chunk_count,
                     ref.partition, offset, ref.size, ref.crc32)
            for (ref, _), offset in zip(planned, offsets, strict=True)
        ]
        kept = [chunk for key_group in sorted(reused) for chunk in reused[key_group]]
        return SnapshotHandle(
            backend_id=backend_id,
            materialization_id=materialization_id,
            key_group_range=key_group_range,
            topic=self.topic,
            chunks=tuple(written + kept),
            materialized_sequence_number=materialized_sequence_number,
        )

    def read(
        self, handle: SnapshotHandle, key_group_range: KeyGroupRange | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """(key group, serialized state) for each non-empty key group, ascending.

        Restricted to ``key_group_range`` when given. Raises
        :class:`SnapshotMissingError` for a chunk that is gone and
        :class:`SnapshotCorruptError` for one whose content does not match.
        """
        target = handle if key_group_range is None else handle.intersection(key_group_range)
        if target is None or not target.chunks:
            return
        source = self._open_source(handle.topic)
        try:
            for key_group in target.key_groups:
                parts = [
                    verify_chunk(handle.topic, handle.backend_id, chunk,
                                 source.fetch(chunk.partition, chunk.offset))
                    for chunk in target.chunks_of(key_group)
                ]
                yield key_group, b"".join(parts)
        finally:
            source.close()

    def delete(self, chunks: Iterable[ChunkRef], backend_id: str) -> None:
        """Tombstone the chunks' keys (blocks until acknowledged) so the log cleaner frees them.

        Deleting a chunk that is already gone is harmless.
        """
        unique = {(c.partition, c.record_key(backend_id)) for c in chunks}
        records = [OutRecord(partition, key.encode(), None, [])
                   for partition, key in sorted(unique)]
        if records:
            self._append(records, f"{len(records)} chunk tombstones of backend {backend_id}")

    def close(self) -> None:  # noqa: B027 - nothing to release unless overridden
        """Release clients (idempotent)."""

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what implementations provide ------------------------------------------------------

    @abstractmethod
    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        """Append ``records`` durably, in order; their offsets."""

    @abstractmethod
    def _open_source(self, topic: str) -> _RecordSource:
        """A reader of single records of ``topic``."""

    # -- chunking ----------------------------------------------------------------------------

    def _chunk_records(
        self, backend_id: str, materialization_id: int, key_group: int, state: bytes
    ) -> list[tuple[ChunkRef, OutRecord]]:
        partition = partition_for_key_group(key_group, self.partitions, self.max_parallelism)
        pieces = split_chunks(state, self.max_chunk_bytes)
        out = []
        for chunk_no, data in enumerate(pieces):
            crc = zlib.crc32(data)
            ref = ChunkRef(key_group, materialization_id, chunk_no, len(pieces), partition,
                           0, len(data), crc)
            value = encode(CHUNK_SCHEMA, {
                "backend_id": backend_id,
                "key_group": key_group,
                "materialization_id": materialization_id,
                "chunk_no": chunk_no,
                "chunk_count": len(pieces),
                "data": data,
            })
            headers = [(HEADER_SCHEMA, SCHEMA_HEADER_VALUE.encode()),
                       (HEADER_CRC32, str(crc).encode())]
            key = chunk_key(backend_id, key_group, materialization_id, chunk_no).encode()
            out.append((ref, OutRecord(partition, key, value, headers)))
        return out


def split_chunks(state: bytes, max_chunk_bytes: int) -> list[bytes]:
    """``state`` in pieces of at most ``max_chunk_bytes`` (one empty piece for ``b""``)."""
    if not state:
        return [b""]
    view = memoryview(state)
    return [bytes(view[i:i + max_chunk_bytes]) for i in range(0, len(state), max_chunk_bytes)]


def _check_write(
    backend_id: str,
    materialization_id: int,
    key_group_range: KeyGroupRange,
    states: Mapping[int, bytes],
    reused: Mapping[int, Sequence[ChunkRef]],
    max_parallelism: int,
) -> None:
    if not backend_id:
        raise ValueError("backend_id must not be empty")
    if materialization_id < 0:
        raise ValueError(f"materialization id must be >= 0, got {materialization_id}")
    for key_group in itertools.chain(states, reused):
        if not key_group_range.contains(key_group) or key_group >= max_parallelism:
            raise ValueError(
                f"key group {key_group} of backend {backend_id} is outside the written "
                f"key-group range {key_group_range} (max parallelism {max_parallelism})"
            )
    both = sorted(set(states) & set(reused))
    if both:
        raise ValueError(
            f"key groups {both} of backend {backend_id} are both written and reused; "
            "expected each key group in at most one of states and reused"
        )
    for key_group, chunks in reused.items():
        wrong = [c for c in chunks if c.key_group != key_group]
        if wrong:
            raise ValueError(
                f"chunks reused for key group {key_group} belong to key group "
                f"{wrong[0].key_group}"
            )
        newer = [c for c in chunks if c.materialization_id >= materialization_id]
        if newer:
            raise ValueError(
                f"chunks reused for key group {key_group} of materialization {materialization_id}"
                f" were written by materialization {newer[0].materialization_id}; expected an "
                "earlier one"
            )


def verify_chunk(
    topic: str, backend_id: str, chunk: ChunkRef, found: StoredRecord | str
) -> bytes:
    """The chunk's data after checking key, fields, size and CRC-32 against ``chunk``."""
    where: dict[str, Any] = {
        "topic": topic, "partition": chunk.partition, "offset": chunk.offset,
        "backend_id": backend_id, "key_group": chunk.key_group,
        "materialization_id": chunk.materialization_id, "chunk_no": chunk.chunk_no,
    }
    if isinstance(found, str):
        raise SnapshotMissingError(**where, found=found)
    expected_key = chunk.record_key(backend_id)
    if found.key != expected_key.encode():
        shown = found.key.decode(errors="replace") if found.key is not None else None
        raise SnapshotMissingError(
            **where, found=f"a record with key {shown!r} instead of {expected_key!r}")
    if found.value is None:
        raise SnapshotMissingError(**where, found=f"a tombstone of key {expected_key!r}")
    schema = dict(found.headers).get(HEADER_SCHEMA)
    if schema is not None and schema != SCHEMA_HEADER_VALUE.encode():
        raise SnapshotCorruptError(**where, what=f"{HEADER_SCHEMA} header",
                                   expected=SCHEMA_HEADER_VALUE,
                                   found=schema.decode(errors="replace"))
    try:
        record = decode(CHUNK_SCHEMA, found.value)
    except Exception as exc:
        raise SnapshotCorruptError(**where, what="record value",
                                   expected=f"a {CHUNK_SCHEMA} record",
                                   found=f"undecodable bytes ({exc})") from exc
    expected_fields = {
        "backend_id": backend_id, "key_group": chunk.key_group,
        "materialization_id": chunk.materialization_id, "chunk_no": chunk.chunk_no,
        "chunk_count": chunk.chunk_count,
    }
    for name, value in expected_fields.items():
        if record[name] != value:
            raise SnapshotCorruptError(**where, what=f"field {name}", expected=value,
                                       found=record[name])
    data: bytes = record["data"]
    if len(data) != chunk.size:
        raise SnapshotCorruptError(**where, what="data size", expected=chunk.size,
                                   found=len(data))
    crc = zlib.crc32(data)
    if crc != chunk.crc32:
        raise SnapshotCorruptError(**where, what="CRC-32 of the data",
                                   expected=f"{chunk.crc32:#010x}", found=f"{crc:#010x}")
    return data


# -- in memory -------------------------------------------------------------------------------


class InMemorySnapshotStore(SnapshotStore):
    """A dict-backed store with the semantics of the Kafka one, for fast tests.

    Offsets come from one counter; deleting a chunk removes it at once (as if the
    log cleaner ran immediately), so reading it raises :class:`SnapshotMissingError`.
    """

    def __init__(
        self,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        partitions: int = 16,
        max_parallelism: int = 128,
        topic: str = "in-memory-snapshots",
    ) -> None:
        super().__init__(topic, partitions, max_parallelism, max_chunk_bytes)
        self._lock = threading.Lock()
        self._offsets = itertools.count()
        self._log: dict[tuple[int, int], StoredRecord] = {}
        self._by_key: dict[tuple[int, bytes], set[int]] = {}

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        offsets = []
        with self._lock:
            for record in records:
                offset = next(self._offsets)
                if record.value is None:  # a tombstone: compacted away at once
                    for old in self._by_key.pop((record.partition, record.key), set()):
                        self._log.pop((record.partition, old), None)
                else:
                    self._by_key.setdefault((record.partition, record.key), set()).add(offset)
                self._log[(record.partition, offset)] = StoredRecord(
                    record.key, record.value, list(record.headers))
                offsets.append(offset)
        return offsets

    def _open_source(self, topic: str) -> _RecordSource:
        return _MemorySource(self, topic)

    def put_record(self, partition: int, offset: int, record: StoredRecord | None) -> None:
        """Replace (or with None remove) the record at an offset: fault injection for tests."""
        with self._lock:
            if record is None:
                self._log.pop((partition, offset), None)
            else:
                self._log[(partition, offset)] = record

    def record_at(self, partition: int, offset: int) -> StoredRecord | None:
        """The record stored at an offset, if any (for tests)."""
        with self._lock:
            return self._log.get((partition, offset))

    @property
    def record_count(self) -> int:
        """Records held (tombstones included)."""
        with self._lock:
            return len(self._log)


class _MemorySource(_RecordSource):
    def __init__(self, store: InMemorySnapshotStore, topic: str) -> None:
        self._store = store
        self._topic = topic

    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        if self._topic != self._store.topic:
            return f"nothing: this in-memory store holds topic {self._store.topic!r} only"
        record = self._store.record_at(partition, offset)
        if record is None:
            return f"no record at offset {offset} (deleted)"
        return record

    def close(self) -> None:
        pass


# -- Kafka -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotStoreConfig(KafkaClientSettings):
    """How :class:`KafkaSnapshotStore` connects, and the topic it keeps chunks in.

    ``client_config`` passes librdkafka settings (security included) to every
    client; ``producer_config``/``consumer_config``/``admin_config`` override per
    client kind (``acks=all`` and idempotence cannot be overridden).
    ``topic_overrides`` are extra topic configs used when creating the topic.
    """

    #: Kafka bootstrap servers, ``host:port[,host:port]``.
    bootstrap_servers: str
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
    #: Seconds for admin operations, for connecting, and for one chunk to arrive when reading.
    request_timeout_s: float = 30.0
    #: Extra librdkafka settings for every client.
    client_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the producer only.
    producer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for consumers only.
    consumer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the admin client only.
    admin_config: dict[str, Any] = field(default_factory=dict)
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
               "queued.max.messages.kbytes": max(4096, fetch // KIB)})

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
    if info.partitions < config.partitions:
        raise TopicConfigError(
            f"snapshot topic {info.name} has {info.partitions} partitions; expected at "
            f"least {config.partitions}"
        )
    wanted = config.replication_factor
    if wanted is not None and info.replication_factor < wanted:
        raise TopicConfigError(
            f"snapshot topic {info.name} has replication factor {info.replication_factor}; "
            f"expected at least {wanted}"
        )
    limit = info.configs.get("max.message.bytes")
    if limit is not None and int(limit) < config.max_record_bytes:
        raise TopicConfigError(
            f"snapshot topic {info.name} has max.message.bytes={limit}; expected at least "
            f"{config.max_record_bytes} for chunks of max_chunk_bytes={config.max_chunk_bytes}"
        )


class KafkaSnapshotStore(SnapshotStore):
    """Chunks in a compacted Kafka topic (created, or validated, on construction)."""

    def __init__(self, config: SnapshotStoreConfig) -> None:
        super().__init__(config.topic, config.partitions, config.max_parallelism,
                         config.max_chunk_bytes)
        self.config = config
        admin, _ = connect_admin(config.admin(), config.request_timeout_s)
        info = ensure_topic(admin, config.topic, config.partitions, config.replication_factor,
                            config.topic_configs(), config.request_timeout_s, "snapshot topic")
        validate_snapshot_topic(info, config)
        #: The topic as found (or created).
        self.topic_info = info
        self._producer = AckedProducer(config.producer(), config.topic, SnapshotWriteError,
                                       config.request_timeout_s)
        self._closed = False

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        if self._closed:
            raise ChangelogError(f"snapshot store of topic {self.topic} is closed")
        return self._producer.produce_all(records, what)

    def _open_source(self, topic: str) -> _RecordSource:
        return _KafkaSource(self.config, topic)

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


class _KafkaSource(_RecordSource):
    """Reads records by offset with one consumer, seeking only when not already there."""

    def __init__(self, config: SnapshotStoreConfig, topic: str) -> None:
        self._topic = topic
        self._timeout = config.request_timeout_s
        self._consumer = Consumer(config.consumer())
        self._next: tuple[int, int] | None = None

    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        if self._next != (partition, offset):
            self._consumer.assign([TopicPartition(self._topic, partition, offset)])
        self._next = None
        deadline = time.monotonic() + self._timeout
        while True:
            messages = self._consumer.consume(1, timeout=0.2)
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
                found = self._after_error(partition, offset, message, error)
                if found is None:
                    continue
                return found
            at = message.offset() or 0
            if at < offset:
                continue  # prefetched before the seek
            if at > offset:
                shown = (message.key() or b"").decode(errors="replace")
                kind = "a tombstone" if message.value() is None else "a record"
                return (f"no record at offset {offset}: it was removed by compaction (the "
                        f"next record, at offset {at}, is {kind} with key {shown!r})")
            self._next = (partition, offset + 1)
            return StoredRecord(message.key(), message.value(), header_list(message))

    def _after_error(
        self, partition: int, offset: int, message: Message, error: KafkaError
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
            low, high = watermarks(self._consumer, self._topic, partition, self._timeout)
            return (f"no record at offset {offset}: the log holds offsets {low} to {high - 1} "
                    "(deleted records or a recreated topic)")
        if is_access_error(error):
            raise KafkaAccessError(
                f"reading {self._topic}[{partition}] failed: {describe(error)}")
        raise ChangelogError(
            f"reading {self._topic}[{partition}] at offset {offset} failed: {describe(error)}"
        )

    def close(self) -> None:
        self._consumer.close()
