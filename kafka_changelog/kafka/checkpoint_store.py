"""The checkpoint store in a compacted, single-partition Kafka topic.

The records and the view built from them are
``kafka_changelog.state.checkpoints.checkpoint_store``'s (layout in
``docs/snapshots-and-checkpoints.md``); this module reads and writes them.
:class:`KafkaCheckpointView` only reads (the Spark reader and the command line use it);
:class:`KafkaCheckpointStore` also creates the topic and writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import Consumer, KafkaError

from ..errors import ChangelogError, TopicConfigError
from ..gc_types import LogFloor
from ..state.checkpoints.checkpoint import CompletedCheckpoint
from ..state.checkpoints.checkpoint_store import (
    DEFAULT_GUARD_LIFETIME_S,
    DEFAULT_RETAIN,
    MAX_CHECKPOINT_RECORD_BYTES,
    PARTITION,
    CheckpointStore,
    check_guard_lifetime,
    check_retain,
    check_retain_for,
)
from ..state.checkpoints.driver_claim import DriverIdentity
from ..state.checkpoints.subtask_commit import SubtaskCommit, parse_subtask_commit_key
from ..state.errors import CheckpointStoreError
from .access import connect_admin
from .client_settings import KafkaConnection
from .consume import PartitionTail, consume_range, end_of_partition
from .error_text import access_error, describe, is_access_error
from .live_clients import new_consumer
from .offsets import watermarks
from .producer import AckedProducer
from .topics import TopicInfo, check_infinite_retention, check_size, ensure_topic

if TYPE_CHECKING:
    from ..state.checkpoints.driver_claim import DriverClaim
    from ..state.records import OutRecord


class ApplicationLease(Protocol):
    """What the store needs of a driver's hold on an application (``driver_lease.py``)."""

    #: The claim held (None: not, or no longer, held).
    claim: DriverClaim | None

    def write(self, records: list[OutRecord], what: str) -> None:
        """Write ``records`` as the holder (raises once another driver took over)."""

    def release(self) -> None:
        """Free the application."""


@dataclass(frozen=True)
class CheckpointStoreConfig(KafkaConnection):
    """How :class:`KafkaCheckpointStore` connects, its topic and its retention.

    Client settings work as in :class:`~kafka_changelog.kafka.KafkaChangelogConfig`;
    ``topic_overrides`` are extra topic configs used when creating the topic.
    """

    #: Checkpoint topic (one partition, ``cleanup.policy=compact``); created if missing.
    topic: str = "kafka-changelog-checkpoints"
    #: Checkpoints kept per application (at least 2).
    retain: int = DEFAULT_RETAIN
    #: Older checkpoints are kept too while younger than this (seconds; None: by count
    #: only). See ``CheckpointStore.subsumed_ids``.
    retain_for_s: float | None = None
    #: How long (seconds) a guard of an application without a checkpoint keeps other
    #: applications' GC off its changelog offsets (None: until its first commit or reset).
    guard_lifetime_s: float | None = DEFAULT_GUARD_LIFETIME_S
    #: Replication factor to create the topic with (None: the broker's default).
    replication_factor: int | None = None
    #: Extra topic configs when creating the topic.
    topic_overrides: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_bootstrap_servers()
        check_retain(self.retain)
        check_retain_for(self.retain_for_s)
        check_guard_lifetime(self.guard_lifetime_s)

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
    check_size(info, "checkpoint topic", 1, config.replication_factor)


#: Header naming the driver that wrote a record through its lease (``driver_lease.py``).
WRITER_HEADER = "kafka-changelog-writer"


def writer_of(message: Any) -> bytes | None:
    """The :data:`WRITER_HEADER` of a consumed record (None without one)."""
    for name, value in message.headers() or ():
        if name == WRITER_HEADER:
            return bytes(value)
    return None


def high_watermark(config: CheckpointStoreConfig, consumer: Consumer | None = None) -> int:
    """The checkpoint topic's high watermark: the end of everything written, committed or
    not (a ``read_committed`` consumer's watermark stops at the first open transaction).
    ``consumer`` must read ``read_uncommitted``; leader changes are waited out."""
    own = consumer is None
    reader = consumer or new_consumer({**config.consumer(), "isolation.level": "read_uncommitted"},
                                       f"high watermark of checkpoint topic {config.topic}")
    try:
        return watermarks(reader, config.topic, PARTITION, config.request_timeout_s)[1]
    finally:
        if own:
            reader.close()


class KafkaCheckpointView(CheckpointStore):
    """A read-only view of a checkpoint topic: what the store wrote, as the store sees it.

    Needs READ and DESCRIBE on the topic only: it creates no topic and no producer.
    Its view is read from the topic, from the log start up to the high watermark on
    first use, then from where it stopped before every operation, so commits of
    other instances are seen too. Writing raises :class:`CheckpointStoreError`.
    """

    PARTITION = PARTITION

    def __init__(self, config: CheckpointStoreConfig) -> None:
        super().__init__(config.retain, config.guard_lifetime_s, config.retain_for_s)
        self.config = config
        self.topic = config.topic
        # (Its fetches wait 20 ms at most: a longer wait delays what a transaction's
        # commit makes readable by the wait, measured at 500 ms.)
        self._consumer = new_consumer(config.consumer(), f"checkpoint topic {config.topic}")
        #: Reads the view's updates: stays assigned, so what other processes commit
        #: between two operations is fetched meanwhile (a read of it costs no assignment).
        self._tail = PartitionTail(self._consumer, self.topic, self.PARTITION)
        #: Asks for the topic's offsets: a connection of its own, since a broker answers
        #: a connection's requests in order and ``_consumer``'s has a fetch waiting
        #: (``fetch.wait.max.ms``) nearly always.
        self._offsets = new_consumer(config.consumer(),
                                     f"checkpoint topic {config.topic} (offsets)")
        #: Looks at records uncommitted (see :meth:`catch_up`); opened on first use.
        self._uncommitted: Consumer | None = None
        self._position: int | None = None
        self._closed = False

    def _read_only(self, doing: str) -> CheckpointStoreError:
        return CheckpointStoreError(
            f"cannot {doing}: checkpoint topic {self.topic} is open read-only")

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        raise self._read_only(f"commit checkpoint {checkpoint.checkpoint_id}")

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        raise self._read_only(f"discard checkpoint {checkpoint_id}")

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        raise self._read_only(f"guard application {application!r}")

    def _check_open(self) -> None:
        if self._closed:
            raise ChangelogError(f"checkpoint store of topic {self.topic} is closed")

    # -- reading the view --------------------------------------------------------------------

    def catch_up(self, wait_s: float, only_for: str | None = None) -> None:
        """Read everything written to the topic so far, waiting up to ``wait_s`` for open
        transactions (of streaming tasks) to end: a plain refresh stops at the first open
        one. For decisions that must see every committed record, such as which subtasks
        of a batch committed already.

        With ``only_for`` (an application), the records written since the view's position
        are first looked at uncommitted, and the wait happens only when one of them is
        that application's: an open transaction of *another* application never stalls it.
        """
        with self._lock:
            end = high_watermark(self.config, self._uncommitted_reader())
            if only_for is not None and not self._written_for(only_for, end):
                return
            self._refresh(until=end, wait_s=wait_s)

    @property
    def position(self) -> int:
        """The offset up to which the view has read the topic."""
        with self._lock:
            return self._position or 0

    def _written_for(self, application: str, end: int) -> bool:
        """Whether a record from the view's position up to ``end`` (committed, aborted or
        in an open transaction) may change what ``application``'s driver decides: one of
        its keys, except its driver's own writes and subtask commits of checkpoints it
        completed already."""
        if self._position is None:
            return True
        if self._position >= end:
            return False
        prefix = f"{application}/".encode()
        own = DriverIdentity.of_this_process().driver_id.encode()
        latest = self._latest_id(application)
        for message in consume_range(self._uncommitted_reader(), self.topic, self.PARTITION,
                                     self._position, end, self.config.request_timeout_s,
                                     self._on_read_error):
            key = message.key() or b""
            if not key.startswith(prefix) or writer_of(message) == own:
                continue
            value = message.value()
            if (latest is not None and value is not None
                    and parse_subtask_commit_key(key.decode(errors="replace"))
                    and SubtaskCommit.from_bytes(value, "-").checkpoint_id <= latest):
                continue
            return True
        return False

    def _uncommitted_reader(self) -> Consumer:
        """The view's ``read_uncommitted`` consumer (made on first use; unassigned between
        uses, so that its offset requests wait behind no fetch)."""
        if self._uncommitted is None:
            self._uncommitted = new_consumer(
                {**self.config.consumer(), "isolation.level": "read_uncommitted"},
                f"checkpoint topic {self.topic} (uncommitted)")
        return self._uncommitted

    def _refresh(self, until: int | None = None, wait_s: float | None = None) -> None:
        self._check_open()
        timeout = self.config.request_timeout_s
        low, high = watermarks(self._offsets, self.topic, self.PARTITION, timeout)
        if until is not None:
            high = max(high, until)
            timeout = wait_s if wait_s is not None else timeout
        if self._position is None or self._position < low:
            # First read, or the log was truncated under us: rebuild from the log start.
            self._checkpoints.clear()
            self._pointers.clear()
            self._guards.clear()
            self._subtask_commits.clear()
            self._claims.clear()
            self._position = low
        where = f"checkpoint topic {self.topic}[{self.PARTITION}]"
        for message in self._tail.read(self._position, high, timeout, self._on_read_error):
            offset = message.offset() or 0
            self.apply_record(message.key(), message.value(), f"{where}@{offset}")
            self._position = offset + 1
        # Compaction leaves gaps up to the end: the view is at the high watermark.
        self._position = max(self._position, high)

    def _on_read_error(self, error: KafkaError, position: int) -> int:
        if end_of_partition(error):
            return position  # the log's end
        where = f"checkpoint topic {self.topic}[{self.PARTITION}]"
        if is_access_error(error):
            raise access_error(error, f"reading {where}", operation="READ",
                               resource=self.topic)
        raise CheckpointStoreError(f"reading {where} at offset {position} failed: "
                                   f"{describe(error)}")

    def close(self) -> None:
        """Close the consumers (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_consumers()

    def _close_consumers(self) -> None:
        self._consumer.close()
        self._offsets.close()
        if self._uncommitted is not None:
            self._uncommitted.close()


class KafkaCheckpointStore(KafkaCheckpointView):
    """Checkpoints in a compacted single-partition Kafka topic (created or validated).

    The view is :class:`KafkaCheckpointView`'s; writes go through an idempotent
    producer and block until acknowledged.
    """

    def __init__(self, config: CheckpointStoreConfig) -> None:
        admin, _ = connect_admin(config.admin(), config.request_timeout_s)
        info = ensure_topic(admin, config.topic, 1, config.replication_factor,
                            config.topic_configs(), config.request_timeout_s,
                            "checkpoint topic")
        validate_checkpoint_topic(info, config)
        super().__init__(config)
        #: The topic as found (or created).
        self.topic_info = info
        self._producer = AckedProducer(config.producer(), config.topic, CheckpointStoreError,
                                       config.request_timeout_s)
        #: Per application, the driver lease this process holds it with
        #: (``driver_lease.py``): its records are written through the lease then.
        self.leases: dict[str, ApplicationLease] = {}
        try:
            with self._lock:
                self._refresh()
        except BaseException:
            self.close()
            raise

    @property
    def lock(self) -> Any:
        """The lock every operation of the view takes (re-entrant)."""
        return self._lock

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        self._write(checkpoint.application, self.commit_records(checkpoint),
                    f"checkpoint {checkpoint.checkpoint_id} of application "
                    f"{checkpoint.application!r}")

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        self._write(application, self.discard_records(application, checkpoint_id),
                    f"tombstone of checkpoint {checkpoint_id} of application {application!r}")

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        self._write(application, self.guard_records(application, guard_id, floors),
                    f"changelog guard of application {application!r}")

    def _write(self, application: str, records: list[OutRecord], what: str) -> None:
        """Write an application's records: through its driver lease when this process holds
        one (fails if another driver took over), else with the idempotent producer."""
        self._check_open()
        lease = self.leases.get(application)
        if lease is not None and lease.claim is not None:
            lease.write(records, what)
        else:
            self._written(self._producer.produce_all(records, what))

    def apply_own(self, record: OutRecord) -> None:
        """Apply a record this process wrote in a transaction to the view (a later
        refresh reads it again, which changes nothing)."""
        with self._lock:
            self.apply_record(record.key, record.value,
                              f"checkpoint topic {self.topic}[{self.PARTITION}] (own write)")

    def _written(self, offsets: list[int]) -> None:
        # The caller applies its own records to the view; skip re-reading them unless
        # another writer's records came first (then the next refresh reads them all).
        if offsets and offsets[0] == self._position and offsets == list(
            range(offsets[0], offsets[0] + len(offsets))
        ):
            self._position = offsets[-1] + 1

    def close(self) -> None:
        """Release the driver leases (their heartbeat threads ended), the producer and the
        consumers (idempotent)."""
        with self._lock:
            if self._closed:
                return
            leases = list(self.leases.values())
        # Outside the lock: a heartbeat waiting for it ends before its lease returns.
        for lease in leases:
            lease.release()
        with self._lock:
            if self._closed:
                return
            self.leases.clear()
            self._closed = True
            self._producer.close(self.config.request_timeout_s)
            self._close_consumers()
