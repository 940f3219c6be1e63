"""The Kafka changelog storage: one shared producer, one topic, many writers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from confluent_kafka.admin import OffsetSpec

from ..errors import ChangelogError
from ..keygroups import KeyGroupRange
from ..registry import ChangelogRegistry
from ..storage import StateChangelogStorage
from .access import connect_admin
from .config import KafkaChangelogConfig
from .gc import GarbageCollectionResult, delete_below, list_offsets, lowest_needed_offsets
from .handle import KafkaChangelogHandle
from .producer import SharedProducer
from .reader import KafkaChangelogReader
from .topics import TopicInfo, ensure_changelog_topic
from .writer import KafkaChangelogWriter, KafkaLocation


class LogFloor(Protocol):
    """Where an application may still write (``kafka_changelog.state.checkpoint.LogFloor``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


#: What garbage collection must keep: handles to stay readable, and log floors.
StillNeeded = tuple[Iterable[KafkaChangelogHandle], Iterable[LogFloor]]


class KafkaChangelogStorage(StateChangelogStorage[KafkaChangelogHandle]):
    """Keeps changelogs in a Kafka topic.

    Build it from a :class:`KafkaChangelogConfig`, or from its fields as keyword
    arguments (which is what ``load_storage("kafka", bootstrap_servers=...)`` does).
    Connecting checks access (failing fast on bad credentials), creates the topic
    if missing and refuses a topic with unsafe settings.
    """

    name = "kafka"

    def __init__(self, config: KafkaChangelogConfig | None = None, **fields: Any) -> None:
        if config is None:
            config = KafkaChangelogConfig(**fields)
        elif fields:
            raise TypeError("pass either a KafkaChangelogConfig or its fields, not both")
        self.config = config
        self._admin, metadata = connect_admin(config.admin(), config.request_timeout_s)
        self.topic: TopicInfo = ensure_changelog_topic(self._admin, metadata, config)
        self._registry: ChangelogRegistry[KafkaLocation] = ChangelogRegistry()
        self._producer = SharedProducer(config)
        self._closed = False

    @property
    def registry(self) -> ChangelogRegistry[KafkaLocation]:
        return self._registry

    @property
    def producer(self) -> SharedProducer:
        """The producer shared by this storage's writers."""
        return self._producer

    def create_writer(
        self, operator_id: str, key_group_range: KeyGroupRange
    ) -> KafkaChangelogWriter:
        if self._closed:
            raise ChangelogError("cannot create a writer: the Kafka changelog storage is closed")
        max_p = self.config.max_parallelism
        if not key_group_range.is_empty and key_group_range.end >= max_p:
            raise ValueError(
                f"key-group range {key_group_range} exceeds max parallelism {max_p} "
                f"(key groups 0..{max_p - 1})"
            )
        return KafkaChangelogWriter(
            log_id=f"{operator_id}-{uuid.uuid4().hex[:12]}",
            key_group_range=key_group_range,
            registry=self._registry,
            producer=self._producer,
            topic=self.config.topic,
            partitions=self.topic.partitions,
            max_parallelism=max_p,
            max_record_bytes=self.config.max_record_bytes,
            preemptive_persist_threshold_bytes=self.config.preemptive_persist_threshold_bytes,
        )

    def reader(self) -> KafkaChangelogReader:
        """A reader for this storage's handles (close it, or use it as a context manager)."""
        return KafkaChangelogReader(self.config)

    def uncommitted_floor(self) -> dict[int, int]:
        """Per partition of the topic, the lowest offset this process may still reference
        later: the end of the log, or lower where a live writer holds persisted records.

        Read before a checkpoint commit, it bounds everything the application writes
        until its next one (see ``CompletedCheckpoint.log_floors``).
        """
        timeout = self.config.request_timeout_s
        name, partitions = self.config.topic, self.topic.partitions
        high = list_offsets(self._admin, name, partitions, OffsetSpec.latest(), timeout)
        if not self._producer.wait_for_records_before_now(timeout):
            raise ChangelogError(
                f"cannot tell the log floor of {name}: records still unacknowledged after "
                f"{timeout:.0f} s")
        needed = lowest_needed_offsets(high, self._registry.live_entries(), (), name)
        return needed

    def collect_garbage(
        self,
        retained: Iterable[KafkaChangelogHandle] | Callable[[], StillNeeded] = (),
    ) -> GarbageCollectionResult:
        """Delete records below what live writers of this process and ``retained`` need.

        ``retained`` is either the handles that must stay readable, or a function
        returning them with the log floors of every application sharing the topic
        (``(handles, floors)``): it is called after the high watermarks were read, so
        that whatever anyone writes later lies above them. Safe when every writer of
        the topic outside this process is covered by those handles and floors.
        """
        timeout = self.config.request_timeout_s
        name, partitions = self.config.topic, self.topic.partitions
        high = list_offsets(self._admin, name, partitions, OffsetSpec.latest(), timeout)
        # Records produced before the watermarks were read may be written but not yet
        # registered: wait for their acknowledgements before looking at the registry.
        if not self._producer.wait_for_records_before_now(timeout):
            raise ChangelogError(
                f"garbage collection of {name} skipped: records still unacknowledged after "
                f"{timeout:.0f} s"
            )
        handles, floors = retained() if callable(retained) else (retained, ())
        needed = lowest_needed_offsets(high, self._registry.live_entries(), handles, name)
        for floor in floors:
            if floor.topic == name and floor.partition in needed:
                needed[floor.partition] = min(needed[floor.partition], floor.offset)
        low = list_offsets(self._admin, name, partitions, OffsetSpec.earliest(), timeout)
        to_delete = {p: o for p, o in needed.items() if o > low[p]}
        deleted = delete_below(self._admin, name, to_delete, timeout)
        return GarbageCollectionResult(name, {**low, **deleted})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._producer.close(timeout=self.config.request_timeout_s)
