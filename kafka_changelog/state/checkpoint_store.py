"""The checkpoint metadata store: completed checkpoints per application, with retention.

A checkpoint is complete once :meth:`CheckpointStore.commit` returns (its record
is acknowledged). Retention keeps the newest ``retain`` checkpoints of an
application; ``commit`` returns the older ones still stored, the caller frees
what only they need and then calls :meth:`CheckpointStore.discard`, which
removes them for good. Until discarded they stay readable, so a caller that
crashed half-way through garbage collection is told again by the next commit.

:class:`KafkaCheckpointStore` keeps everything in one compacted, single-partition
topic (layout in ``docs/snapshots-and-checkpoints.md``) and rebuilds its view by
reading that topic, so a fresh process sees exactly what was committed.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ..errors import ChangelogError, KafkaAccessError, TopicConfigError
from ..kafka.access import connect_admin
from ..kafka.client_settings import KafkaClientSettings
from ..kafka.errors import describe, is_access_error
from ..kafka.topics import TopicInfo
from ..serialization import decode, encode
from .checkpoint import CompletedCheckpoint, LogFloor
from .errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointOrderError,
    CheckpointStoreError,
)
from .kafka_io import (
    AckedProducer,
    OutRecord,
    check_infinite_retention,
    ensure_topic,
    watermarks,
)

#: The fewest checkpoints retention may keep (the latest and the one before it).
MIN_RETAIN = 2
DEFAULT_RETAIN = 3

CHECKPOINT_SCHEMA_HEADER = "checkpoint/1"
POINTER_SCHEMA = "checkpoint_pointer"
POINTER_SCHEMA_HEADER = f"{POINTER_SCHEMA}/1"
HEADER_SCHEMA = "kc.schema"

#: Largest checkpoint record the store writes (topic ``max.message.bytes`` when created).
MAX_CHECKPOINT_RECORD_BYTES = 8 * 1024 * 1024

_CHECKPOINT_KEY = re.compile(r"^(?P<application>.+)/checkpoint/(?P<checkpoint_id>\d{20})$")
_GUARD_KEY = re.compile(r"^(?P<application>.+)/guard/(?P<guard_id>[0-9a-f]{32})$")
_LATEST_SUFFIX = "/latest"
GUARD_SCHEMA = "changelog_guard"
GUARD_SCHEMA_HEADER = f"{GUARD_SCHEMA}/1"


def checkpoint_key(application: str, checkpoint_id: int) -> str:
    """Record key of a checkpoint: ``{application}/checkpoint/{checkpoint_id:020d}``."""
    return f"{application}/checkpoint/{checkpoint_id:020d}"


def guard_key(application: str, guard_id: str) -> str:
    """Record key of a changelog guard: ``{application}/guard/{guard_id}``."""
    return f"{application}/guard/{guard_id}"


def latest_key(application: str) -> str:
    """Record key of an application's latest-checkpoint pointer: ``{application}/latest``."""
    return f"{application}{_LATEST_SUFFIX}"


def check_retain(retain: int) -> None:
    """Raise ``ValueError`` unless ``retain`` is at least :data:`MIN_RETAIN`."""
    if retain < MIN_RETAIN:
        raise ValueError(
            f"retain must be at least {MIN_RETAIN} (the latest checkpoint and the one before "
            f"it), got {retain}"
        )


_Store = TypeVar("_Store", bound="CheckpointStore")


class CheckpointStore(ABC):
    """Completed checkpoints per application (see the module docstring).

    Thread-safe. Implementations provide durable writes and, for shared storage,
    catching up with what other instances wrote (:meth:`_refresh`).
    """

    def __init__(self, retain: int = DEFAULT_RETAIN) -> None:
        check_retain(retain)
        self.retain = retain
        self._lock = threading.RLock()
        self._checkpoints: dict[str, dict[int, CompletedCheckpoint]] = {}
        self._pointers: dict[str, int] = {}
        self._guards: dict[str, dict[str, tuple[LogFloor, ...]]] = {}

    # -- the operations ------------------------------------------------------------------

    def commit(
        self,
        checkpoint: CompletedCheckpoint,
        persist: Callable[[CompletedCheckpoint], None] | None = None,
    ) -> list[CompletedCheckpoint]:
        """Store ``checkpoint`` as the application's latest; the checkpoints retention subsumed.

        Blocks until the checkpoint is durable: it is complete only when this
        returns. The returned checkpoints (oldest first) are beyond the newest
        ``retain``; they stay stored until :meth:`discard`. Raises
        :class:`CheckpointOrderError` unless the id is greater than the latest.
        ``persist`` replaces the store's own durable write (a transactional commit
        that writes the store's records with others, see ``transactional_commit``);
        it must make the checkpoint durable or raise.
        """
        application = checkpoint.application
        with self._lock:
            self._refresh()
            latest = self._latest_id(application)
            if latest is not None and checkpoint.checkpoint_id <= latest:
                raise CheckpointOrderError(application, checkpoint.checkpoint_id, latest)
            (persist or self._persist_commit)(checkpoint)
            # The commit records tombstone the application's guards (its checkpoints'
            # log floors protect its writes from now on).
            self._guards.pop(application, None)
            stored = self._checkpoints.setdefault(application, {})
            stored[checkpoint.checkpoint_id] = checkpoint
            self._pointers[application] = checkpoint.checkpoint_id
            ids = sorted(stored)
            return [stored[i] for i in ids[: max(0, len(ids) - self.retain)]]

    def latest(self, application: str) -> CompletedCheckpoint | None:
        """The application's latest completed checkpoint (None before the first)."""
        with self._lock:
            self._refresh()
            latest = self._latest_id(application)
            if latest is None:
                return None
            found = self._checkpoints.get(application, {}).get(latest)
            if found is None:
                raise CheckpointStoreError(
                    f"the latest pointer of application {application!r} names checkpoint "
                    f"{latest}, which is not stored (stored: {self._ids(application)}); "
                    "was it deleted by hand?"
                )
            return found

    def get(self, application: str, checkpoint_id: int) -> CompletedCheckpoint:
        """A stored checkpoint; :class:`CheckpointNotFoundError` names the stored ids if missing."""
        with self._lock:
            self._refresh()
            found = self._checkpoints.get(application, {}).get(checkpoint_id)
            if found is None:
                raise CheckpointNotFoundError(application, checkpoint_id,
                                              self._ids(application))
            return found

    def checkpoint_ids(self, application: str) -> list[int]:
        """Ids of the stored checkpoints (subsumed, undiscarded ones too), ascending."""
        with self._lock:
            self._refresh()
            return self._ids(application)

    def applications(self) -> list[str]:
        """Applications with at least one stored checkpoint, sorted."""
        with self._lock:
            self._refresh()
            return sorted(app for app, stored in self._checkpoints.items() if stored)

    def all_checkpoints(self) -> list[CompletedCheckpoint]:
        """Every stored checkpoint of every application (garbage collection of a shared
        changelog topic must keep what any of them needs)."""
        with self._lock:
            self._refresh()
            return [cp for stored in self._checkpoints.values() for cp in stored.values()]

    def guard(self, application: str, floors: Sequence[LogFloor]) -> str:
        """Record that ``application`` (which has no checkpoint yet) may write changelog
        records at or above ``floors``; returns the guard's id.

        Call it before creating the application's first writers: until the application
        commits a checkpoint, garbage collection by any application sharing the topic
        keeps those offsets (see :meth:`log_floors`).
        """
        guard_id = uuid.uuid4().hex
        with self._lock:
            self._persist_guard(application, guard_id, tuple(floors))
            self._guards.setdefault(application, {})[guard_id] = tuple(floors)
        return guard_id

    def log_floors(self) -> list[LogFloor]:
        """Offsets below which no application may still write records it will reference.

        Per application: the log floors of its latest checkpoint, or, before its first
        checkpoint, those of its guards.
        """
        with self._lock:
            self._refresh()
            floors: list[LogFloor] = []
            for application in set(self._checkpoints) | set(self._guards):
                latest_id = self._latest_id(application)
                latest = (self._checkpoints.get(application, {}).get(latest_id)
                          if latest_id is not None else None)
                if latest is not None:
                    floors.extend(latest.log_floors)
                elif latest_id is None:
                    for guard in self._guards.get(application, {}).values():
                        floors.extend(guard)
            return floors

    def discard(self, application: str, checkpoint_id: int) -> None:
        """Remove a subsumed checkpoint for good (blocking); nothing happens if it is gone.

        The latest checkpoint cannot be discarded (:class:`CheckpointStoreError`).
        """
        with self._lock:
            self._refresh()
            if checkpoint_id == self._latest_id(application):
                raise CheckpointStoreError(
                    f"cannot discard checkpoint {checkpoint_id} of application "
                    f"{application!r}: it is the latest; only subsumed checkpoints "
                    f"({self._ids(application)[:-1]}) can be discarded"
                )
            stored = self._checkpoints.get(application, {})
            if checkpoint_id not in stored:
                return
            self._persist_discard(application, checkpoint_id)
            del stored[checkpoint_id]

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

    # -- the view --------------------------------------------------------------------------

    def _ids(self, application: str) -> list[int]:
        return sorted(self._checkpoints.get(application, {}))

    def _latest_id(self, application: str) -> int | None:
        candidates = list(self._checkpoints.get(application, {}))
        pointer = self._pointers.get(application)
        if pointer is not None:
            candidates.append(pointer)
        return max(candidates) if candidates else None

    # -- what implementations provide ------------------------------------------------------

    @abstractmethod
    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        """Make the checkpoint and the latest pointer durable (blocking)."""

    @abstractmethod
    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        """Remove the checkpoint durably (blocking)."""

    @abstractmethod
    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        """Make a guard durable (blocking)."""

    def _refresh(self) -> None:  # noqa: B027 - a store that is its own truth has nothing to do
        """Bring the view up to date with the durable storage."""


class InMemoryCheckpointStore(CheckpointStore):
    """Checkpoints in a dict, for tests: the same rules as the Kafka store."""

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        pass

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        pass

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        pass


@dataclass(frozen=True)
class CheckpointStoreConfig(KafkaClientSettings):
    """How :class:`KafkaCheckpointStore` connects, its topic and its retention.

    Client settings work as in :class:`~kafka_changelog.kafka.KafkaChangelogConfig`;
    ``topic_overrides`` are extra topic configs used when creating the topic.
    """

    #: Kafka bootstrap servers, ``host:port[,host:port]``.
    bootstrap_servers: str
    #: Checkpoint topic (one partition, ``cleanup.policy=compact``); created if missing.
    topic: str = "kafka-changelog-checkpoints"
    #: Checkpoints kept per application (at least 2).
    retain: int = DEFAULT_RETAIN
    #: Replication factor to create the topic with (None: the broker's default).
    replication_factor: int | None = None
    #: Seconds for admin operations, connecting and reading the topic.
    request_timeout_s: float = 30.0
    #: Extra librdkafka settings for every client.
    client_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the producer only.
    producer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the consumer only.
    consumer_config: dict[str, Any] = field(default_factory=dict)
    #: Extra librdkafka settings for the admin client only.
    admin_config: dict[str, Any] = field(default_factory=dict)
    #: Extra topic configs when creating the topic.
    topic_overrides: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_bootstrap_servers()
        check_retain(self.retain)

    def producer(self) -> dict[str, Any]:
        """Producer settings (``acks=all`` and idempotence enforced)."""
        return self._producer_settings(0, "lz4", 120_000, MAX_CHECKPOINT_RECORD_BYTES)

    def consumer(self) -> dict[str, Any]:
        """Settings of the consumer that reads the topic."""
        return self._reader_settings("kafka-changelog-state-reader")

    def topic_configs(self) -> dict[str, str]:
        """Configs the topic is created with."""
        return {
            "cleanup.policy": "compact",
            "max.message.bytes": str(MAX_CHECKPOINT_RECORD_BYTES + 64 * 1024),
            **self.topic_overrides,
        }


def validate_checkpoint_topic(info: TopicInfo, config: CheckpointStoreConfig) -> None:
    """Refuse a checkpoint topic that is not compacted or not single-partition."""
    check_infinite_retention(info, "checkpoint topic")
    if info.partitions != 1:
        raise TopicConfigError(
            f"checkpoint topic {info.name} has {info.partitions} partitions; expected exactly "
            "1 (one ordered log: a checkpoint record before its latest pointer)"
        )
    wanted = config.replication_factor
    if wanted is not None and info.replication_factor < wanted:
        raise TopicConfigError(
            f"checkpoint topic {info.name} has replication factor {info.replication_factor}; "
            f"expected at least {wanted}"
        )


class KafkaCheckpointStore(CheckpointStore):
    """Checkpoints in a compacted single-partition Kafka topic (created or validated).

    Its view is read from the topic: from the log start up to the high watermark
    on first use, then from where it stopped before every operation, so commits
    of other instances are seen too.
    """

    PARTITION = 0

    def __init__(self, config: CheckpointStoreConfig) -> None:
        super().__init__(config.retain)
        self.config = config
        self.topic = config.topic
        admin, _ = connect_admin(config.admin(), config.request_timeout_s)
        info = ensure_topic(admin, config.topic, 1, config.replication_factor,
                            config.topic_configs(), config.request_timeout_s,
                            "checkpoint topic")
        validate_checkpoint_topic(info, config)
        #: The topic as found (or created).
        self.topic_info = info
        self._producer = AckedProducer(config.producer(), config.topic, CheckpointStoreError,
                                       config.request_timeout_s)
        self._consumer = Consumer(config.consumer())
        self._position: int | None = None
        self._closed = False
        try:
            with self._lock:
                self._refresh()
        except BaseException:
            self.close()
            raise

    # -- writes ------------------------------------------------------------------------------

    def commit_records(self, checkpoint: CompletedCheckpoint) -> list[OutRecord]:
        """The records (to :attr:`topic`) that make ``checkpoint`` complete once durable:
        the checkpoint itself, then the application's latest pointer."""
        application, checkpoint_id = checkpoint.application, checkpoint.checkpoint_id
        pointer = encode(POINTER_SCHEMA, {
            "application": application, "checkpoint_id": checkpoint_id,
            "timestamp_ms": checkpoint.timestamp_ms})
        with self._lock:
            guards = sorted(self._guards.get(application, {}))
        return [
            OutRecord(self.PARTITION, checkpoint_key(application, checkpoint_id).encode(),
                      checkpoint.to_bytes(),
                      [(HEADER_SCHEMA, CHECKPOINT_SCHEMA_HEADER.encode())]),
            OutRecord(self.PARTITION, latest_key(application).encode(), pointer,
                      [(HEADER_SCHEMA, POINTER_SCHEMA_HEADER.encode())]),
            *(OutRecord(self.PARTITION, guard_key(application, g).encode(), None, [])
              for g in guards),
        ]

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        self._check_open()
        self._written(self._producer.produce_all(
            self.commit_records(checkpoint),
            f"checkpoint {checkpoint.checkpoint_id} of application {checkpoint.application!r}"))

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        self._check_open()
        self._written(self._producer.produce_all(
            [OutRecord(self.PARTITION, checkpoint_key(application, checkpoint_id).encode(),
                       None, [])],
            f"tombstone of checkpoint {checkpoint_id} of application {application!r}",
        ))

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        self._check_open()
        value = encode(GUARD_SCHEMA, {
            "application": application, "timestamp_ms": int(time.time() * 1000),
            "floors": [{"topic": f.topic, "partition": f.partition, "offset": f.offset}
                       for f in floors]})
        self._written(self._producer.produce_all(
            [OutRecord(self.PARTITION, guard_key(application, guard_id).encode(), value,
                       [(HEADER_SCHEMA, GUARD_SCHEMA_HEADER.encode())])],
            f"changelog guard of application {application!r}"))

    def _written(self, offsets: list[int]) -> None:
        # The caller applies its own records to the view; skip re-reading them unless
        # another writer's records came first (then the next refresh reads them all).
        if offsets and offsets[0] == self._position and offsets == list(
            range(offsets[0], offsets[0] + len(offsets))
        ):
            self._position = offsets[-1] + 1

    def _check_open(self) -> None:
        if self._closed:
            raise ChangelogError(f"checkpoint store of topic {self.topic} is closed")

    # -- reading the view --------------------------------------------------------------------

    def _refresh(self) -> None:
        self._check_open()
        timeout = self.config.request_timeout_s
        low, high = watermarks(self._consumer, self.topic, self.PARTITION, timeout)
        if self._position is None or self._position < low:
            # First read, or the log was truncated under us: rebuild from the log start.
            self._checkpoints.clear()
            self._pointers.clear()
            self._guards.clear()
            self._position = low
        if self._position >= high:
            return
        self._consumer.assign([TopicPartition(self.topic, self.PARTITION, self._position)])
        deadline = time.monotonic() + timeout
        try:
            while self._position < high:
                messages = self._consumer.consume(500, timeout=0.2)
                if not messages and time.monotonic() > deadline:
                    raise CheckpointStoreError(
                        f"timed out reading checkpoint topic {self.topic}[{self.PARTITION}] "
                        f"at offset {self._position} (high watermark {high})"
                    )
                if messages:
                    deadline = time.monotonic() + timeout
                for message in messages:
                    error = message.error()
                    offset = message.offset() or 0
                    if error is None:
                        if offset >= self._position:
                            self._apply(offset, message.key(), message.value())
                            self._position = offset + 1
                        continue
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Compaction leaves gaps: the end of the log is where we are.
                        self._position = max(self._position, offset)
                    elif error.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
                        cls = KafkaAccessError if is_access_error(error) else CheckpointStoreError
                        raise cls(
                            f"reading checkpoint topic {self.topic}[{self.PARTITION}] at offset "
                            f"{self._position} failed: {describe(error)}"
                        )
        finally:
            self._consumer.unassign()

    def _apply(self, offset: int, key_bytes: bytes | None, value: bytes | None) -> None:
        where = f"checkpoint topic {self.topic}[{self.PARTITION}]@{offset}"
        key = (key_bytes or b"").decode(errors="replace")
        if key.endswith(_LATEST_SUFFIX):
            application = key[: -len(_LATEST_SUFFIX)]
            if value is None:
                self._pointers.pop(application, None)
                return
            try:
                pointer = decode(POINTER_SCHEMA, value)
            except Exception as exc:
                raise CheckpointFormatError(
                    f"cannot decode the latest pointer {key!r} at {where}: {exc}") from exc
            self._pointers[application] = int(pointer["checkpoint_id"])
            return
        guard = _GUARD_KEY.match(key)
        if guard is not None:
            self._apply_guard(guard["application"], guard["guard_id"], value, where)
            return
        match = _CHECKPOINT_KEY.match(key)
        if match is None:
            raise CheckpointFormatError(
                f"unexpected record key {key!r} at {where}; expected "
                "'{application}/checkpoint/{id:020d}', '{application}/latest' or "
                "'{application}/guard/{id}'"
            )
        application = match["application"]
        checkpoint_id = int(match["checkpoint_id"])
        if value is None:
            self._checkpoints.get(application, {}).pop(checkpoint_id, None)
            return
        try:
            checkpoint = CompletedCheckpoint.from_bytes(value)
        except CheckpointFormatError as exc:
            raise CheckpointFormatError(f"record {key!r} at {where}: {exc}") from exc
        if (checkpoint.application, checkpoint.checkpoint_id) != (application, checkpoint_id):
            raise CheckpointFormatError(
                f"record {key!r} at {where} holds checkpoint {checkpoint.checkpoint_id} of "
                f"application {checkpoint.application!r}; expected checkpoint {checkpoint_id} "
                f"of application {application!r}"
            )
        self._checkpoints.setdefault(application, {})[checkpoint_id] = checkpoint

    def _apply_guard(self, application: str, guard_id: str, value: bytes | None,
                     where: str) -> None:
        if value is None:
            self._guards.get(application, {}).pop(guard_id, None)
            return
        try:
            record = decode(GUARD_SCHEMA, value)
        except Exception as exc:
            raise CheckpointFormatError(
                f"cannot decode the changelog guard at {where}: {exc}") from exc
        self._guards.setdefault(application, {})[guard_id] = tuple(
            LogFloor(f["topic"], f["partition"], f["offset"]) for f in record["floors"])

    def close(self) -> None:
        """Release the producer and consumer (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._producer.close(self.config.request_timeout_s)
            self._consumer.close()
