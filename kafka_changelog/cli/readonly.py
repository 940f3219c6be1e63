"""Read-only access to the checkpoint and snapshot topics (READ/DESCRIBE ACLs suffice).

:class:`~kafka_changelog.state.checkpoint_store.KafkaCheckpointStore` and
:class:`~kafka_changelog.state.snapshot_store.KafkaSnapshotStore` create (or
validate) their topics and start idempotent producers; looking at an application
needs neither. These classes keep the stores' own reading, verification and
errors and refuse every write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer

from ..kafka.access import connect_admin
from ..serialization import decode
from ..state.checkpoint import CompletedCheckpoint, LogFloor
from ..state.checkpoint_store import (
    GUARD_SCHEMA,
    CheckpointStore,
    CheckpointStoreConfig,
    KafkaCheckpointStore,
)
from ..state.errors import CheckpointStoreError
from ..state.kafka_io import OutRecord
from ..state.snapshot_store import (
    SnapshotStore,
    SnapshotStoreConfig,
    _KafkaSource,
    _RecordSource,
)
from .options import CliError, Connection


@dataclass(frozen=True)
class Guard:
    """A changelog guard: an application's first writes, before its first checkpoint."""

    guard_id: str
    #: When it was written (epoch ms; None if the record did not say).
    timestamp_ms: int | None
    floors: tuple[LogFloor, ...]


class CheckpointTopicView(KafkaCheckpointStore):
    """The checkpoint store's view of its topic, without creating anything or writing.

    Beyond the store's queries it tells guards (with their times) and every
    application that has any record in the topic.
    """

    def __init__(self, config: CheckpointStoreConfig) -> None:
        CheckpointStore.__init__(self, config.retain)  # not KafkaCheckpointStore's
        self.config = config
        self.topic = config.topic
        self._consumer = Consumer(config.consumer())
        self._position: int | None = None
        self._closed = False
        self._guard_times: dict[tuple[str, str], int] = {}
        try:
            with self._lock:
                self._refresh()
        except BaseException:
            self.close()
            raise

    def _apply_guard(self, application: str, guard_id: str, value: bytes | None,
                     where: str) -> None:
        super()._apply_guard(application, guard_id, value, where)
        if value is not None:
            record = decode(GUARD_SCHEMA, value)
            self._guard_times[(application, guard_id)] = int(record["timestamp_ms"])

    def guards(self, application: str) -> list[Guard]:
        """The application's guards (it has no checkpoint yet, or a crash left them)."""
        with self._lock:
            self._refresh()
            return [Guard(g, self._guard_times.get((application, g)), floors)
                    for g, floors in sorted(self._guards.get(application, {}).items())]

    def known_applications(self) -> list[str]:
        """Every application with a checkpoint, a latest pointer or a guard, sorted."""
        with self._lock:
            self._refresh()
            found = {a for a, stored in self._checkpoints.items() if stored}
            found |= set(self._pointers)
            found |= {a for a, guards in self._guards.items() if guards}
            return sorted(found)

    def has_pointer(self, application: str) -> bool:
        """Whether the topic holds a latest pointer of ``application``."""
        with self._lock:
            self._refresh()
            return application in self._pointers

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        raise CheckpointStoreError(
            f"cannot commit checkpoint {checkpoint.checkpoint_id}: checkpoint topic "
            f"{self.topic} is open read-only")

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        raise CheckpointStoreError(
            f"cannot discard checkpoint {checkpoint_id}: checkpoint topic {self.topic} is "
            "open read-only")

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        raise CheckpointStoreError(
            f"cannot guard application {application!r}: checkpoint topic {self.topic} is "
            "open read-only")

    def close(self) -> None:
        """Close the consumer (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._consumer.close()


class SnapshotChunkReader(SnapshotStore):
    """A snapshot store that only reads chunks (seek, key/field/CRC-32 checks, errors)."""

    def __init__(self, config: SnapshotStoreConfig) -> None:
        super().__init__(config.topic, config.partitions, config.max_parallelism,
                         config.max_chunk_bytes)
        self.config = config

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        raise CliError(f"cannot write {what}: snapshot topic {self.topic} is open read-only")

    def _open_source(self, topic: str) -> _RecordSource:
        return _KafkaSource(self.config, topic)


def existing_topics(connection: Connection) -> set[str]:
    """Names of the topics the brokers show (DESCRIBE is enough)."""
    _, metadata = connect_admin(connection.settings(), connection.request_timeout_s)
    return set(metadata.topics)


def open_view(connection: Connection, topic: str) -> CheckpointTopicView:
    """A read-only view of checkpoint topic ``topic``; :class:`CliError` if it is missing."""
    topics = existing_topics(connection)
    if topic not in topics:
        shown = ", ".join(sorted(t for t in topics if not t.startswith("_"))) or "none"
        raise CliError(
            f"checkpoint topic {topic!r} does not exist on {connection.bootstrap_servers} "
            f"(option --checkpoint-topic); topics there: {shown}")
    return CheckpointTopicView(connection.checkpoint_config(topic))


def select_checkpoint(view: CheckpointTopicView, application: str,
                      checkpoint_id: int | None) -> CompletedCheckpoint:
    """The requested (default: latest) checkpoint, or :class:`CliError` naming what exists."""
    ids = view.checkpoint_ids(application)
    if not ids:
        known = ", ".join(view.applications()) or "none"
        raise CliError(
            f"application {application!r} has no checkpoint in checkpoint topic {view.topic}; "
            f"applications with checkpoints there: {known}")
    if checkpoint_id is None:
        latest = view.latest(application)
        assert latest is not None  # it has checkpoints
        return latest
    if checkpoint_id not in ids:
        raise CliError(
            f"application {application!r} has no checkpoint {checkpoint_id} in checkpoint "
            f"topic {view.topic}; stored checkpoints: {', '.join(map(str, ids))}")
    return view.get(application, checkpoint_id)


def check_operator(checkpoint: CompletedCheckpoint, operator: str) -> None:
    """:class:`CliError` unless the checkpoint has state of ``operator``."""
    known = checkpoint.operators()
    if operator not in known:
        raise CliError(
            f"checkpoint {checkpoint.checkpoint_id} of application {checkpoint.application!r} "
            f"has no operator {operator!r}; its operators: {', '.join(known) or 'none'}")
