"""Keyed and operator state over the changelog: materialization, checkpoints, restore.

Everything here is storage-independent (no Kafka client): the Kafka snapshot and
checkpoint stores live in :mod:`kafka_changelog.kafka`. The names an application
needs are importable from this package.
"""

from .backend_config import BackendKind, StateBackendConfig
from .bulk_state import BulkState
from .checkpoint import CompletedCheckpoint, KeyedStateHandle, OperatorStateHandle, SubtaskState
from .checkpoint_store import CheckpointStore, InMemoryCheckpointStore
from .coordinator import CheckpointCoordinator, GarbageReport
from .descriptors import (
    StateDescriptor,
    StateKind,
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from .driver_claim import ApplicationHeldError, DriverFencedError
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
from .keyed_backend import ChangelogKeyedStateBackend
from .local_recovery import LocalRecoveryStore
from .materialization import MaterializationStats
from .materializer import MaterializationConfig
from .operator_state import OperatorStateBackend
from .restore import load_keyed_state, restore_backend
from .rocksdb_options import RocksDBOptions
from .serializers import BYTES, FLOAT64, INT64, JSON, UTF8, AvroSerializer, Serializer
from .snapshot_store import InMemorySnapshotStore, SnapshotStore
from .ttl import StateTtl

__all__ = [
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
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
    "aggregating_state",
    "list_state",
    "load_keyed_state",
    "map_state",
    "reducing_state",
    "restore_backend",
    "value_state",
]
