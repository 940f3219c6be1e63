"""Everything of kafka-changelog that talks to Kafka: the changelog storage (registered
as ``kafka``), the snapshot and checkpoint stores, the transactional committer, garbage
collection, and the client plumbing they share."""

from typing import TYPE_CHECKING

from ..lazy_exports import install as _install_lazy_exports

if TYPE_CHECKING:  # imported when first read (lazy_exports.py)
    from .checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore, KafkaCheckpointView
    from .client_settings import KafkaConnection
    from .config import KafkaChangelogConfig
    from .handle import KafkaChangelogHandle, PartitionRange
    from .reader import KafkaChangelogReader
    from .snapshot_store import KafkaSnapshotStore, KafkaSnapshotView, SnapshotStoreConfig
    from .storage import KafkaChangelogStorage
    from .task_commit import OutputTopicMissingError
    from .topic_owners import SharedTopicError
    from .transaction_calls import TransactionAbortedError, TransactionFencedError
    from .transactional_commit import OutputRecord, TransactionalCommitter
    from .writer import KafkaChangelogWriter, KafkaLocation

__all__ = [
    "CheckpointStoreConfig",
    "KafkaChangelogConfig",
    "KafkaChangelogHandle",
    "KafkaChangelogReader",
    "KafkaChangelogStorage",
    "KafkaChangelogWriter",
    "KafkaCheckpointStore",
    "KafkaCheckpointView",
    "KafkaConnection",
    "KafkaLocation",
    "KafkaSnapshotStore",
    "KafkaSnapshotView",
    "OutputRecord",
    "OutputTopicMissingError",
    "PartitionRange",
    "SharedTopicError",
    "SnapshotStoreConfig",
    "TransactionAbortedError",
    "TransactionFencedError",
    "TransactionalCommitter",
]

_install_lazy_exports(globals())
