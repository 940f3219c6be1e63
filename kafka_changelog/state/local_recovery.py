"""Task-local recovery: copies of snapshot chunks and changelog pieces on local disk.

Restoring from local files avoids reading Kafka when a task restarts where it ran.
A local copy is used only when it is present and valid: snapshot data must match
every chunk's size and CRC-32 as recorded in the snapshot handle, and a changelog
copy must carry the exact handle it was written for plus a matching checksum. A
corrupt or stale copy is ignored (and counted) and Kafka is read instead: a local
copy can make restore faster, never different.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..change import StateChange
from ..handle import ChangelogHandle
from .snapshot import ChunkRef

_FRAME = struct.Struct(">I")


@dataclass
class LocalRecoveryStats:
    """How restores used the local copies."""

    hits: int = 0
    misses: int = 0
    rejected: int = 0


class LocalRecoveryStore:
    """A directory of task-local copies (one per task; never shared between tasks)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        (self.directory / "snapshots").mkdir(parents=True, exist_ok=True)
        (self.directory / "changelog").mkdir(parents=True, exist_ok=True)
        self.stats = LocalRecoveryStats()

    # -- snapshots -----------------------------------------------------------------------

    def _snapshot_path(self, backend_id: str, key_group: int, materialization_id: int) -> Path:
        name = hashlib.sha256(f"{backend_id}/{key_group}/{materialization_id}".encode())
        return self.directory / "snapshots" / f"{name.hexdigest()}.bin"

    def put_key_group(
        self, backend_id: str, key_group: int, materialization_id: int, data: bytes
    ) -> None:
        """Keep the serialized state of a key group as materialized."""
        _write_atomically(self._snapshot_path(backend_id, key_group, materialization_id), data)

    def get_key_group(self, backend_id: str, chunks: Sequence[ChunkRef]) -> bytes | None:
        """The key group's data if a local copy matches every chunk (size and CRC-32)."""
        if not chunks:
            return None
        first = chunks[0]
        path = self._snapshot_path(backend_id, first.key_group, first.materialization_id)
        try:
            data = path.read_bytes()
        except OSError:
            self.stats.misses += 1
            return None
        position = 0
        for chunk in chunks:
            piece = data[position:position + chunk.size]
            position += chunk.size
            if len(piece) != chunk.size or zlib.crc32(piece) != chunk.crc32:
                self.stats.rejected += 1
                return None
        if position != len(data):
            self.stats.rejected += 1
            return None
        self.stats.hits += 1
        return data

    # -- changelog -----------------------------------------------------------------------

    def _changelog_path(self, handle_bytes: bytes) -> Path:
        return self.directory / "changelog" / f"{hashlib.sha256(handle_bytes).hexdigest()}.bin"

    def put_changes(self, handle: ChangelogHandle, changes: Sequence[StateChange]) -> None:
        """Keep the changes of a persisted handle (exactly what reading it would give)."""
        handle_bytes = handle.to_bytes()
        body = bytearray(_FRAME.pack(len(handle_bytes)) + handle_bytes)
        for change in changes:
            body += struct.pack(">iI", change.key_group, len(change.payload)) + change.payload
        _write_atomically(self._changelog_path(handle_bytes),
                          _FRAME.pack(zlib.crc32(body)) + bytes(body))

    def get_changes(self, handle: ChangelogHandle) -> list[StateChange] | None:
        """The handle's changes from the local copy, if present, intact and for this handle."""
        handle_bytes = handle.to_bytes()
        try:
            data = self._changelog_path(handle_bytes).read_bytes()
        except OSError:
            self.stats.misses += 1
            return None
        changes = _parse_changes(data, handle_bytes)
        if changes is None:
            self.stats.rejected += 1
            return None
        self.stats.hits += 1
        return changes


def _parse_changes(data: bytes, handle_bytes: bytes) -> list[StateChange] | None:
    if len(data) < 8:
        return None
    (crc,) = _FRAME.unpack_from(data, 0)
    body = data[4:]
    if zlib.crc32(body) != crc:
        return None
    (length,) = _FRAME.unpack_from(body, 0)
    if body[4:4 + length] != handle_bytes:  # a copy written for another handle
        return None
    changes = []
    position = 4 + length
    try:
        while position < len(body):
            key_group, size = struct.unpack_from(">iI", body, position)
            position += 8
            changes.append(StateChange(key_group, bytes(body[position:position + size])))
            position += size
    except (struct.error, ValueError):
        return None
    return changes if position == len(body) else None


def _write_atomically(path: Path, data: bytes) -> None:
    # A crash mid-write must leave no half file that could be read as a copy.
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)
