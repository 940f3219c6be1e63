"""Which working copy a keyed backend keeps: in memory, or RocksDB on local disk.

Flink's changelog backend wraps either the heap backend or RocksDB; here the choice is
the backend's *table* (:class:`~kafka_changelog.state.tables.protocol.KeyedStateTable`).
The changelog in Kafka is the durable log either way, and snapshots written with one
restore into the other.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ...enums import StrEnum
from ..rocksdb.options import RocksDBOptions
from ..tables.memory import StateTable
from ..tables.protocol import KeyedStateTable


class BackendKind(StrEnum):
    """The working copy's kind. A ``str``: ``BackendKind.ROCKSDB == "rocksdb"``, and the
    configs take either."""

    #: In the Python process (fastest for state that fits in memory).
    MEMORY = "memory"
    #: RocksDB on local disk (state larger than memory; needs ``rocksdict``).
    ROCKSDB = "rocksdb"

    @classmethod
    def of(cls, value: BackendKind | str, setting: str) -> BackendKind:
        """``value`` as a kind; anything else raises ValueError naming ``setting`` and the
        allowed values."""
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(kind.value) for kind in cls)
            raise ValueError(f"{setting} must be one of {allowed}, got {value!r}") from None


def default_rocksdb_directory() -> Path:
    """Where RocksDB working copies go when no directory is given: under the system
    temp dir."""
    return Path(tempfile.gettempdir()) / "kafka-changelog-rocksdb"


@dataclass(frozen=True)
class StateBackendConfig:
    """The working copy of keyed backends.

    ``kind`` is :attr:`BackendKind.MEMORY` (the default: fastest for state that fits in
    memory) or :attr:`BackendKind.ROCKSDB` (state larger than memory; needs the
    ``rocksdict`` package), or their values ``"memory"`` and ``"rocksdb"``: it is a
    :class:`BackendKind` after construction. ``directory`` is where RocksDB working copies
    are created, one subdirectory per backend, deleted when the backend closes (default:
    :func:`default_rocksdb_directory`). ``rocksdb_options`` tunes RocksDB (default:
    :class:`~kafka_changelog.state.rocksdb.options.RocksDBOptions`'s defaults).
    """

    kind: BackendKind | str = BackendKind.MEMORY
    directory: str | None = None
    rocksdb_options: RocksDBOptions = field(default_factory=RocksDBOptions)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", BackendKind.of(self.kind, "state backend kind"))
        if not isinstance(self.rocksdb_options, RocksDBOptions):
            raise TypeError(f"rocksdb_options must be RocksDBOptions, got "
                            f"{type(self.rocksdb_options).__name__}")

    def create_table(self, label: str = "state") -> KeyedStateTable:
        """A new, empty table; ``label`` names its directory (RocksDB), e.g. the operator."""
        if self.kind is BackendKind.MEMORY:
            return StateTable()
        from ..rocksdb.table import RocksDBStateTable  # rocksdict only when asked for

        root = Path(self.directory) if self.directory else default_rocksdb_directory()
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", label)[:64]
        return RocksDBStateTable(root / f"{safe}-{uuid.uuid4().hex[:12]}", remove_on_close=True,
                                 options=self.rocksdb_options)


__all__ = ["BackendKind", "StateBackendConfig", "default_rocksdb_directory"]
