"""Keyed and operator state over the changelog: materialization, checkpoints, restore.

Everything here is storage-independent (no Kafka client): the Kafka snapshot and
checkpoint stores live in :mod:`kafka_changelog.kafka`. The names an application
needs are importable from this package.
"""

from typing import TYPE_CHECKING

from ..lazy_exports import install as _install_lazy_exports
from .errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointOrderError,
    CheckpointStoreError,
    KeyNotInBatchError,
    MaterializationFailedError,
    MaxParallelismMismatchError,
    NoCurrentKeyError,
    SnapshotCorruptError,
    SnapshotMissingError,
    SnapshotWriteError,
    StateMismatchError,
)

if TYPE_CHECKING:  # imported when first read (lazy_exports.py)
    from .backend.bulk_state import BulkState
    from .backend.config import BackendKind, StateBackendConfig
    from .backend.keyed_backend import ChangelogKeyedStateBackend
    from .backend.local_recovery import LocalRecoveryStore
    from .backend.operator_state import OperatorStateBackend
    from .backend.restore import load_keyed_state, restore_backend
    from .checkpoints.checkpoint import (
        CompletedCheckpoint,
        KeyedStateHandle,
        OperatorStateHandle,
        SubtaskState,
    )
    from .checkpoints.checkpoint_store import CheckpointStore, InMemoryCheckpointStore
    from .checkpoints.driver_claim import ApplicationHeldError, DriverFencedError
    from .history.coordinator import CheckpointCoordinator, GarbageReport
    from .history.rewind import REWOUND_FROM_PROPERTY, execute_rewind, plan_rewind
    from .rocksdb.options import RocksDBOptions
    from .schema.descriptors import (
        StateDescriptor,
        StateKind,
        aggregating_state,
        list_state,
        map_state,
        reducing_state,
        value_state,
    )
    from .schema.serializers import BYTES, FLOAT64, INT64, JSON, UTF8, AvroSerializer, Serializer
    from .schema.ttl import StateTtl
    from .snapshots.materialization import MaterializationStats
    from .snapshots.materializer import MaterializationConfig
    from .snapshots.snapshot_store import InMemorySnapshotStore, SnapshotStore
    from .time.timers import TimeDomain

__all__ = [
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
    "REWOUND_FROM_PROPERTY",
    "UTF8",
    "ApplicationHeldError",
    "AvroSerializer",
    "BackendKind",
    "BulkState",
    "ChangelogKeyedStateBackend",
    "CheckpointCoordinator",
    "CheckpointFormatError",
    "CheckpointNotFoundError",
    "CheckpointOrderError",
    "CheckpointStore",
    "CheckpointStoreError",
    "CompletedCheckpoint",
    "DriverFencedError",
    "GarbageReport",
    "InMemoryCheckpointStore",
    "InMemorySnapshotStore",
    "KeyNotInBatchError",
    "KeyedStateHandle",
    "LocalRecoveryStore",
    "MaterializationConfig",
    "MaterializationFailedError",
    "MaterializationStats",
    "MaxParallelismMismatchError",
    "NoCurrentKeyError",
    "OperatorStateBackend",
    "OperatorStateHandle",
    "RocksDBOptions",
    "Serializer",
    "SnapshotCorruptError",
    "SnapshotMissingError",
    "SnapshotStore",
    "SnapshotWriteError",
    "StateBackendConfig",
    "StateDescriptor",
    "StateKind",
    "StateMismatchError",
    "StateTtl",
    "SubtaskState",
    "TimeDomain",
    "aggregating_state",
    "execute_rewind",
    "list_state",
    "load_keyed_state",
    "map_state",
    "plan_rewind",
    "reducing_state",
    "restore_backend",
    "value_state",
]

_install_lazy_exports(globals())
