"""Read-only access to the checkpoint and snapshot topics (READ/DESCRIBE ACLs suffice).

The kafka layer's read-only views (:class:`~kafka_changelog.kafka.KafkaCheckpointView`,
:class:`~kafka_changelog.kafka.KafkaSnapshotView`) create no topic and start no producer;
they keep the stores' own reading, verification and errors and refuse every write.
"""

from __future__ import annotations

from ..kafka.access import connect_admin
from ..kafka.checkpoint_store import KafkaCheckpointView
from ..kafka.snapshot_store import KafkaSnapshotView
from ..state.checkpoints.checkpoint import CompletedCheckpoint
from ..state.checkpoints.checkpoint_store import Guard
from .options import CliError, Connection

#: The checkpoint store's view of its topic (no topic created, no producer); beyond the
#: store's queries it tells guards with their times and every application with a record.
CheckpointTopicView = KafkaCheckpointView
#: A snapshot store that only reads chunks (seek, key/field/CRC-32 checks, errors).
SnapshotChunkReader = KafkaSnapshotView

__all__ = ["CheckpointTopicView", "Guard", "SnapshotChunkReader"]


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
