"""The Kafka changelog storage: one shared producer, one topic, many writers."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka.admin import AdminClient, OffsetSpec

from ..errors import ChangelogError
from ..gc_types import GarbageCollectionResult, LogFloor, StillNeeded
from ..handle import ChangelogHandle
from ..keygroups import KeyGroupRange
from ..registry import ChangelogRegistry
from ..storage import StateChangelogStorage
from .access import connect_admin
from .config import KafkaChangelogConfig
from .gc import lowest_needed_offsets
from .handle import KafkaChangelogHandle
from .offsets import delete_below, list_offsets
from .producer import SharedProducer
from .reader import KafkaChangelogReader
from .topics import TopicInfo, ensure_changelog_topic
from .writer import KafkaChangelogWriter, KafkaLocation

logger = logging.getLogger(__name__)


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
        admin, metadata = connect_admin(config.admin(), config.request_timeout_s,
                                        f"changelog topic {config.topic}")
        #: Dropped by :meth:`close` (an admin client ends when it is freed).
        self._admin: AdminClient | None = admin
        self.topic: TopicInfo = ensure_changelog_topic(admin, metadata, config)
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

    def uncommitted_floors(self) -> list[LogFloor]:
        """Per partition of the topic, the lowest offset this process may still reference
        later: the end of the log, or lower where a live writer holds persisted records.

        Read before a checkpoint commit, it bounds everything the application writes
        until its next one (see ``CompletedCheckpoint.log_floors``).
        """
        needed = self._needed_by_this_process("tell the log floors of")
        return [LogFloor(self.config.topic, p, o) for p, o in sorted(needed.items())]

    def collect_garbage(
        self,
        retained: Iterable[ChangelogHandle] | Callable[[], StillNeeded] = (),
    ) -> GarbageCollectionResult:
        """Delete records below what live writers of this process and ``retained`` need.

        ``retained`` is either the handles that must stay readable, or a function
        returning them with the log floors of every application sharing the topic
        (``(handles, floors)``): it is called after the high watermarks were read, so
        that whatever anyone writes later lies above them. Safe when every writer of
        the topic outside this process is covered by those handles and floors. Handles
        of other storages or topics are ignored.
        """
        name, partitions = self.config.topic, self.topic.partitions
        needed = self._needed_by_this_process("collect garbage of")
        handles, floors = retained() if callable(retained) else (retained, ())
        mine = [h for h in handles if isinstance(h, KafkaChangelogHandle)]
        needed = lowest_needed_offsets(needed, (), mine, name)
        for floor in floors:
            if floor.topic == name and floor.partition in needed:
                needed[floor.partition] = min(needed[floor.partition], floor.offset)
        timeout = self.config.request_timeout_s
        low = list_offsets(self._admin_client(), name, partitions, OffsetSpec.earliest(), timeout)
        to_delete = {p: o for p, o in needed.items() if o > low[p]}
        deleted = delete_below(self._admin_client(), name, to_delete, timeout)
        for partition, offset in sorted(deleted.items()):
            logger.info("changelog %s[%d]: deleted records below offset %d", name, partition,
                        offset)
        return GarbageCollectionResult(name, {**low, **deleted})

    def _needed_by_this_process(self, doing: str) -> dict[int, int]:
        """Per partition: the high watermark, lowered to what live writers of this process
        hold. Waits for records produced before the watermarks were read to be
        acknowledged (and so registered) first."""
        timeout = self.config.request_timeout_s
        name, partitions = self.config.topic, self.topic.partitions
        high = list_offsets(self._admin_client(), name, partitions, OffsetSpec.latest(), timeout)
        if not self._producer.wait_for_records_before_now(timeout):
            raise ChangelogError(
                f"cannot {doing} {name}: records still unacknowledged after {timeout:.0f} s")
        return lowest_needed_offsets(high, self._registry.live_entries(), (), name)

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            raise ChangelogError(f"the storage of changelog topic {self.config.topic} is closed")
        return self._admin

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._admin = None
        self._producer.close(timeout=self.config.request_timeout_s)
