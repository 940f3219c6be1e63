"""Task-local recovery: copies of snapshot chunks and changelog pieces on local disk.

Restoring from local files avoids reading Kafka when a task restarts where it ran.
A local copy is used only when it is present and valid: snapshot data must match
every chunk's size and CRC-32 as recorded in the snapshot handle, and a changelog
copy must carry the exact handle it was written for plus a matching checksum. A
corrupt or stale copy is ignored (and counted) and Kafka is read instead: a local
copy can make restore faster, never different.

The directory is bounded like Flink's task-local state store: each backend (an
*owner*) tells the store which files each of its checkpoints uses (*holds*).
Confirming checkpoint ``c`` forgets the owner's checkpoints older than ``c`` and
deletes every file in the directory that nothing holds any more, which includes
files of earlier runs; aborting ``c`` deletes the files only ``c`` held.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...change import StateChange
from ...handle import ChangelogHandle
from ..checkpoints.checkpoint import KeyedStateHandle
from ..snapshots.snapshot import ChunkRef, SnapshotHandle

_FRAME = struct.Struct(">I")
_SUBDIRECTORIES = ("snapshots", "changelog")

#: Who holds files: a checkpoint id, or a label for what a backend needs between
#: checkpoints (its materialized base, a materialization being written).
Holder = int | str
BASE = "base"
MATERIALIZING = "materializing"


@dataclass
class LocalRecoveryStats:
    """How restores used the local copies."""

    hits: int = 0
    misses: int = 0
    rejected: int = 0


@dataclass(frozen=True, kw_only=True)
class LocalKeyedStateHandle(KeyedStateHandle):
    """The task-local copy of one checkpoint's keyed state.

    The same state as the durable handle (every inherited field is equal), plus the
    local files that held a copy of it when the checkpoint's snapshot finished. Restore
    still reads through :class:`LocalRecoveryStore` (which checks every copy against
    the durable handle); the files are for inspection and accounting.
    """

    directory: Path
    #: Paths relative to :attr:`directory` (``snapshots/…`` and ``changelog/…``).
    files: tuple[str, ...]

    @property
    def paths(self) -> list[Path]:
        """Absolute paths of :attr:`files`."""
        return [self.directory / name for name in self.files]


class LocalRecoveryStore:
    """A directory of task-local copies (one per task; never shared between processes).

    Thread-safe: materializations write from a background thread and persist
    callbacks from storage threads while the operator thread confirms and prunes.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        for name in _SUBDIRECTORIES:
            (self.directory / name).mkdir(parents=True, exist_ok=True)
        self.stats = LocalRecoveryStats()
        # Writes and pruning take this lock, so a prune never meets a half-written file
        # of this store (a leftover temporary file of a crashed run is simply unheld).
        self._lock = threading.RLock()
        self._holds: dict[tuple[str, Holder], set[str]] = {}
        self._written: dict[str, set[str]] = {}

    # -- snapshots -----------------------------------------------------------------------

    @staticmethod
    def snapshot_file(backend_id: str, key_group: int, materialization_id: int) -> str:
        """The relative path of a key group's copy as materialized."""
        name = hashlib.sha256(f"{backend_id}/{key_group}/{materialization_id}".encode())
        return f"snapshots/{name.hexdigest()}.bin"

    def put_key_group(
        self, backend_id: str, key_group: int, materialization_id: int, data: bytes,
        owner: str | None = None,
    ) -> str:
        """Keep the serialized state of a key group as materialized; returns its path."""
        name = self.snapshot_file(backend_id, key_group, materialization_id)
        with self._lock:
            _write_atomically(self.directory / name, data)
            self._note_written(owner, name)
        return name

    def get_key_group(self, backend_id: str, chunks: Sequence[ChunkRef]) -> bytes | None:
        """The key group's data if a local copy matches every chunk (size and CRC-32)."""
        if not chunks:
            return None
        first = chunks[0]
        path = self.directory / self.snapshot_file(
            backend_id, first.key_group, first.materialization_id)
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

    @staticmethod
    def changelog_file(handle: ChangelogHandle) -> str:
        """The relative path of the copy of a persisted changelog handle."""
        return f"changelog/{hashlib.sha256(handle.to_bytes()).hexdigest()}.bin"

    def put_changes(self, handle: ChangelogHandle, changes: Sequence[StateChange]) -> str:
        """Keep the changes of a persisted handle (exactly what reading it would give)."""
        name = self.changelog_file(handle)
        with self._lock:
            _write_atomically(self.directory / name, _encode_changes(handle, changes))
        return name

    def put_checkpoint_changes(
        self, owner: str, checkpoint_id: int, handle: ChangelogHandle,
        changes: Sequence[StateChange],
    ) -> str | None:
        """Like :meth:`put_changes`, held by the checkpoint; None (nothing written) when
        the checkpoint was already aborted or subsumed: nobody could restore from it."""
        body = _encode_changes(handle, changes)
        name = self.changelog_file(handle)
        with self._lock:
            hold = self._holds.get((owner, checkpoint_id))
            if hold is None:
                return None
            _write_atomically(self.directory / name, body)
            hold.add(name)
            self._note_written(owner, name)
        return name

    def get_changes(self, handle: ChangelogHandle) -> list[StateChange] | None:
        """The handle's changes from the local copy, if present, intact and for this handle."""
        handle_bytes = handle.to_bytes()
        path = self.directory / f"changelog/{hashlib.sha256(handle_bytes).hexdigest()}.bin"
        try:
            data = path.read_bytes()
        except OSError:
            self.stats.misses += 1
            return None
        changes = _parse_changes(data, handle_bytes)
        if changes is None:
            self.stats.rejected += 1
            return None
        self.stats.hits += 1
        return changes

    # -- what is kept ----------------------------------------------------------------------

    def files_of(
        self, snapshot: SnapshotHandle | None, changelog: Iterable[ChangelogHandle] = ()
    ) -> set[str]:
        """Relative paths of the copies restoring ``snapshot`` and ``changelog`` would use.

        A reused key group's copy is the one of the materialization that wrote its chunks.
        """
        names = {self.changelog_file(handle) for handle in changelog}
        if snapshot is not None:
            for key_group in snapshot.key_groups:
                first = snapshot.chunks_of(key_group)[0]
                names.add(self.snapshot_file(snapshot.backend_id, key_group,
                                             first.materialization_id))
        return names

    def retain(self, owner: str, holder: Holder, names: Iterable[str],
               replace: bool = False) -> None:
        """``holder`` of ``owner`` needs ``names`` (added to what it holds, or replacing it)."""
        with self._lock:
            if replace:
                self._holds[(owner, holder)] = set(names)
            else:
                self._holds.setdefault((owner, holder), set()).update(names)

    def release(self, owner: str, holder: Holder, delete: bool = False) -> int:
        """``holder`` of ``owner`` needs nothing any more; with ``delete``, its files that
        nothing else holds are deleted at once. Returns the number of files deleted."""
        with self._lock:
            names = self._holds.pop((owner, holder), set())
            if not delete:
                return 0
            return self._delete(names - self._held())

    def local_handle(self, owner: str, checkpoint_id: int,
                     handle: KeyedStateHandle) -> LocalKeyedStateHandle:
        """The task-local copy of ``handle`` (checkpoint ``checkpoint_id`` of ``owner``):
        the files of it this store has."""
        wanted = self.files_of(handle.snapshot, handle.changelog)
        with self._lock:
            held = self._holds.get((owner, checkpoint_id), set())
            present = sorted(n for n in wanted & held if (self.directory / n).is_file())
        return LocalKeyedStateHandle(
            handle.backend_id, handle.key_group_range, handle.materialization_id,
            handle.snapshot, handle.changelog, handle.entry_count, directory=self.directory,
            files=tuple(present))

    def confirm_checkpoint(self, owner: str, checkpoint_id: int) -> int:
        """Checkpoint ``checkpoint_id`` of ``owner`` completed: forget the owner's older
        checkpoints and delete every file of the directory nothing holds (files of earlier
        runs included). Returns the number of files deleted."""
        with self._lock:
            for key in [k for k in self._holds
                        if k[0] == owner and isinstance(k[1], int) and k[1] < checkpoint_id]:
                del self._holds[key]
            return self.prune()

    def abort_checkpoint(self, owner: str, checkpoint_id: int) -> int:
        """Checkpoint ``checkpoint_id`` of ``owner`` was aborted: delete the files only it
        held. Returns the number of files deleted."""
        return self.release(owner, checkpoint_id, delete=True)

    def close_owner(self, owner: str) -> int:
        """The owner is gone: forget its holds and delete the files it wrote that none of
        its checkpoints (and nothing else) uses. Its checkpoints' copies stay on disk for a
        restart; the next confirm on this directory prunes what is not needed then."""
        with self._lock:
            in_checkpoints: set[str] = set()
            for key in [k for k in self._holds if k[0] == owner]:
                names = self._holds.pop(key)
                if isinstance(key[1], int):
                    in_checkpoints |= names
            written = self._written.pop(owner, set())
            return self._delete(written - in_checkpoints - self._held())

    def prune(self) -> int:
        """Delete every file of the directory that nothing holds; returns how many."""
        with self._lock:
            held = self._held()
            doomed = {name for name in self._names() if name not in held}
            return self._delete(doomed)

    def file_names(self) -> set[str]:
        """Relative paths of every file in the directory's copy folders."""
        with self._lock:
            return set(self._names())

    @property
    def size_bytes(self) -> int:
        """Bytes of every file in the directory's copy folders."""
        with self._lock:
            return sum((self.directory / name).stat().st_size for name in self._names())

    # -- mechanics -----------------------------------------------------------------------

    def _held(self) -> set[str]:
        return set().union(*self._holds.values())

    def _names(self) -> Iterable[str]:
        for sub in _SUBDIRECTORIES:
            for path in (self.directory / sub).iterdir():
                if path.is_file():
                    yield f"{sub}/{path.name}"

    def _note_written(self, owner: str | None, name: str) -> None:
        if owner is not None:
            self._written.setdefault(owner, set()).add(name)

    def _delete(self, names: set[str]) -> int:
        deleted = 0
        for name in names:
            try:
                (self.directory / name).unlink()
                deleted += 1
            except FileNotFoundError:
                pass
        for written in self._written.values():
            written.difference_update(names)
        return deleted


def _encode_changes(handle: ChangelogHandle, changes: Sequence[StateChange]) -> bytes:
    handle_bytes = handle.to_bytes()
    body = bytearray(_FRAME.pack(len(handle_bytes)) + handle_bytes)
    for change in changes:
        body += struct.pack(">iI", change.key_group, len(change.payload)) + change.payload
    return _FRAME.pack(zlib.crc32(body)) + bytes(body)


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
