"""Host-local subtask stores: a directory per (application, operator, subtask) holding a
RocksDB working copy and a manifest of the checkpoint it is exactly at, under a lock.

Any process on the host that runs the subtask next can take the store over instead of
restoring from Kafka: it locks the directory, reads the manifest, and reattaches the
store only when the manifest names exactly the checkpoint (and handle) it starts from.
The protocol that keeps this safe:

1. lock (``fcntl`` exclusive lock on ``lock``; held while a task uses the store);
2. read the manifest; reattach, or :meth:`SubtaskStore.reset` and restore;
3. before changing the store, :meth:`SubtaskStore.mark_changing` deletes the manifest,
   so a crash from here on leaves a store that is at no checkpoint;
4. after the checkpoint's snapshot: flush the store, then write the manifest
   atomically (temporary file, fsync, rename, fsync of the directory);
5. close the store and unlock.

Layout: ``root/<application>/<operator>/p<parallelism>-s<subtask>/{lock, manifest.json,
db/}``. Stores of another parallelism of the same operator are stale once a task of the
new parallelism runs, and are deleted then (when nobody holds their lock).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..keygroups import KeyGroupRange
from .errors import LocalStateError

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
_TRASH = ".trash-"


@dataclass(frozen=True)
class StoreManifest:
    """What a subtask store holds: exactly the state of one checkpoint of one subtask."""

    application: str
    operator_id: str
    subtask: int
    parallelism: int
    key_group_range: KeyGroupRange
    max_parallelism: int
    #: The checkpoint the store is exactly at.
    checkpoint_id: int
    #: The backend whose state it is (a reattached backend continues under this id).
    backend_id: str
    #: The subtask's ``SubtaskState`` bytes of that checkpoint (its keyed state handle:
    #: snapshot and changelog since), what the driver assigns for it.
    handle: bytes
    #: Key groups changed since the handle's snapshot: the next materialization writes them.
    changed_key_groups: tuple[int, ...]
    #: When the next materialization is due (seconds since the epoch; None: never).
    materialization_due_at: float | None
    #: The backend instance that wrote the manifest (a process that still holds it may
    #: resume it as it is, without building a new backend).
    owner: str

    def to_json(self) -> str:
        """The manifest as JSON (bytes in base64)."""
        return json.dumps({
            "format": MANIFEST_FORMAT,
            "application": self.application,
            "operator_id": self.operator_id,
            "subtask": self.subtask,
            "parallelism": self.parallelism,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "max_parallelism": self.max_parallelism,
            "checkpoint_id": self.checkpoint_id,
            "backend_id": self.backend_id,
            "handle": base64.b64encode(self.handle).decode(),
            "changed_key_groups": list(self.changed_key_groups),
            "materialization_due_at": self.materialization_due_at,
            "owner": self.owner,
        }, indent=1)

    @staticmethod
    def from_json(text: str) -> StoreManifest:
        """Inverse of :meth:`to_json`; ``ValueError`` for another format or missing fields."""
        data: dict[str, Any] = json.loads(text)
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"manifest format {data.get('format')!r}, expected "
                             f"{MANIFEST_FORMAT}")
        start, end = data["key_group_range"]
        due = data["materialization_due_at"]
        return StoreManifest(
            str(data["application"]), str(data["operator_id"]), int(data["subtask"]),
            int(data["parallelism"]), KeyGroupRange(int(start), int(end)),
            int(data["max_parallelism"]), int(data["checkpoint_id"]), str(data["backend_id"]),
            base64.b64decode(data["handle"]),
            tuple(int(kg) for kg in data["changed_key_groups"]),
            float(due) if due is not None else None, str(data["owner"]))


def _segment(name: str) -> str:
    # Any application or operator name as one safe path segment ("." and ".." included).
    return quote(name, safe="-_").replace(".", "%2E") or "%00"


class SubtaskStore:
    """The directory of one subtask's host-local store (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], application: str, operator_id: str,
                 subtask: int, parallelism: int) -> None:
        self.root = Path(root)
        self.operator_directory = self.root / _segment(application) / _segment(operator_id)
        self.directory = self.operator_directory / f"p{parallelism}-s{subtask}"
        self.db_path = self.directory / "db"
        self.manifest_path = self.directory / "manifest.json"
        self._parallelism = parallelism
        self._lock_fd: int | None = None

    # -- the lock ---------------------------------------------------------------------------

    def lock(self, timeout_s: float = 120.0) -> None:
        """Take the store's exclusive lock, waiting up to ``timeout_s`` for its holder (an
        earlier attempt of the task still running) to let go."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LocalStateError(
                        f"the local state store {self.directory} is still locked by another "
                        f"task after {timeout_s:.0f} s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Let go of the lock (no-op when not held)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._lock_fd is not None

    # -- the manifest -----------------------------------------------------------------------

    def read_manifest(self) -> StoreManifest | None:
        """The manifest, or None when there is none (or it cannot be read: logged)."""
        try:
            text = self.manifest_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("cannot read the local state manifest %s: %s", self.manifest_path,
                           exc)
            return None
        try:
            return StoreManifest.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the unreadable local state manifest %s: %s",
                           self.manifest_path, exc)
            return None

    def write_manifest(self, manifest: StoreManifest) -> None:
        """Write the manifest atomically and durably (the store must be flushed first)."""
        self._require_lock()
        temporary = self.directory / f"manifest.{uuid.uuid4().hex}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(manifest.to_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.manifest_path)
        self._sync_directory()

    def mark_changing(self) -> None:
        """The store is about to change: it is at no checkpoint until the next manifest."""
        self._require_lock()
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path.unlink()
            self._sync_directory()

    def reset(self) -> None:
        """Delete the store and its manifest (a restore starts from an empty one)."""
        self.mark_changing()
        shutil.rmtree(self.db_path, ignore_errors=True)

    # -- bounds -----------------------------------------------------------------------------

    def remove_stale(self) -> list[Path]:
        """Delete the operator's stores of other parallelisms that nobody holds (they
        were for subtasks that no longer exist) and leftovers of earlier deletions."""
        removed: list[Path] = []
        try:
            siblings = list(self.operator_directory.iterdir())
        except FileNotFoundError:
            return removed
        for path in siblings:
            if path.name.startswith(_TRASH):
                shutil.rmtree(path, ignore_errors=True)
                continue
            if (not path.is_dir() or path == self.directory
                    or not path.name.startswith("p")
                    or path.name.startswith(f"p{self._parallelism}-")):
                continue
            if remove_store_directory(path):
                removed.append(path)
        if removed:
            logger.info("removed %d stale local state store(s) of other parallelisms under %s",
                        len(removed), self.operator_directory)
        return removed

    def _require_lock(self) -> None:
        if self._lock_fd is None:
            raise LocalStateError(f"the local state store {self.directory} is not locked")

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_store_directory(path: Path) -> bool:
    """Delete a subtask store directory if its lock is free; False when it is held."""
    lock_path = path / "lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # Renamed first: whoever opens the old path afterwards finds no half-deleted store.
        trash = path.parent / f"{_TRASH}{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def remove_operator_stores(root: str | os.PathLike[str], application: str,
                           operator_id: str) -> int:
    """Delete every store of an operator that nobody holds; returns how many."""
    directory = Path(root) / _segment(application) / _segment(operator_id)
    try:
        paths = list(directory.iterdir())
    except FileNotFoundError:
        return 0
    removed = sum(1 for path in paths if path.is_dir() and not path.name.startswith(_TRASH)
                  and remove_store_directory(path))
    for path in directory.glob(f"{_TRASH}*"):
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty
        directory.parent.rmdir()
    return removed


__all__ = ["StoreManifest", "SubtaskStore", "remove_operator_stores", "remove_store_directory"]
