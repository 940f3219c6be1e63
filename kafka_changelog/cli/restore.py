"""Loading keyed state of a checkpoint into memory without writing anything.

A backend's restore creates a changelog writer and may materialize (write
chunks); the commands only look, so they load snapshot chunks and replay the
changelog into a :class:`~kafka_changelog.state.tables.memory.StateTable` exactly as a
restore does (:func:`~kafka_changelog.state.backend.restore.load_keyed_state`).
"""

from __future__ import annotations

from types import TracebackType

from ..kafka.reader import KafkaChangelogReader
from ..keygroups import KeyGroupRange
from ..state.backend.restore import load_keyed_state
from ..state.checkpoints.checkpoint import CompletedCheckpoint, KeyedStateHandle
from ..state.tables.memory import StateTable
from .options import Connection
from .readonly import SnapshotChunkReader


class StateLoader:
    """Reads an operator's keyed state at a checkpoint, for any key-group range.

    One changelog consumer and one chunk reader are reused for every load.
    """

    def __init__(self, connection: Connection, checkpoint: CompletedCheckpoint,
                 changelog_topic: str, snapshot_topic: str) -> None:
        self.checkpoint = checkpoint
        self.chunks = SnapshotChunkReader(
            connection.snapshot_config(snapshot_topic, checkpoint.max_parallelism))
        self.changelog = KafkaChangelogReader(connection.changelog_config(
            changelog_topic, max_parallelism=checkpoint.max_parallelism))

    def handles(self, operator: str) -> list[KeyedStateHandle]:
        """The operator's keyed state handles (one per subtask that has keyed state)."""
        return [s.keyed for s in self.checkpoint.subtasks_of(operator) if s.keyed is not None]

    def load(self, operator: str, key_groups: KeyGroupRange) -> StateTable:
        """The operator's state in ``key_groups``: snapshot chunks, then the changelog.

        Raises what a restore raises: ``ChangelogTruncatedError``,
        ``SnapshotMissingError``, ``SnapshotCorruptError``, ``RecordDecodeError``...
        """
        table = StateTable()
        for handle in self.handles(operator):
            narrowed = handle.intersection(key_groups)
            if narrowed is not None:
                load_keyed_state(table, narrowed, key_groups, self.chunks, self.changelog)
        return table

    def close(self) -> None:
        """Close the changelog consumer (chunk sources are closed after each read)."""
        self.changelog.close()

    def __enter__(self) -> StateLoader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
