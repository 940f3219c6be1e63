"""Which working copy a keyed backend keeps: in memory, or RocksDB on local disk.

Flink's changelog backend wraps either the heap backend or RocksDB; here the choice is
the backend's *table* (:class:`~kafka_changelog.state.table_protocol.KeyedStateTable`).
The changelog in Kafka is the durable log either way, and snapshots written with one
restore into the other.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from .table import StateTable
from .table_protocol import KeyedStateTable

MEMORY = "memory"
ROCKSDB = "rocksdb"
KINDS = (MEMORY, ROCKSDB)


def default_rocksdb_directory() -> Path:
    """Where RocksDB working copies go when no directory is given: under the system
    temp dir."""
    return Path(tempfile.gettempdir()) / "kafka-changelog-rocksdb"


@dataclass(frozen=True)
class StateBackendConfig:
    """The working copy of keyed backends.

    ``kind`` is ``"memory"`` (the default: fastest for state that fits in memory) or
    ``"rocksdb"`` (state larger than memory; needs the ``rocksdict`` package).
    ``directory`` is where RocksDB working copies are created, one subdirectory per
    backend, deleted when the backend closes (default: :func:`default_rocksdb_directory`).
    """

    kind: str = MEMORY
    directory: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"state backend kind must be one of {KINDS}, got {self.kind!r}")

    def create_table(self, label: str = "state") -> KeyedStateTable:
        """A new, empty table; ``label`` names its directory (RocksDB), e.g. the operator."""
        if self.kind == MEMORY:
            return StateTable()
        from .rocksdb_table import RocksDBStateTable  # rocksdict only when asked for

        root = Path(self.directory) if self.directory else default_rocksdb_directory()
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", label)[:64]
        return RocksDBStateTable(root / f"{safe}-{uuid.uuid4().hex[:12]}", remove_on_close=True)


__all__ = ["KINDS", "MEMORY", "ROCKSDB", "StateBackendConfig", "default_rocksdb_directory"]
