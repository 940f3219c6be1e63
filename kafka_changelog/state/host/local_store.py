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
db/, retained/c<checkpoint>/{manifest.json, db/}}``. Stores of another parallelism of
the same operator are stale once a task of the new parallelism runs, and are deleted
then (when nobody holds their lock).

**Rolling back.** A batch that changed the store but whose checkpoint never completed
(the function failed, the driver died before the commit) leaves a store at no
checkpoint, or at one the re-run does not start from. So that its re-run need not
restore from Kafka, the task keeps a copy of the store at each checkpoint it leaves
it at (:meth:`SubtaskStore.retain_copy`: a RocksDB checkpoint, hard links to the
immutable files); the next task keeps only the copy of the checkpoint it starts from
(:meth:`SubtaskStore.prune_retained`) and, when the live store is not exactly there,
rolls back to that copy (:meth:`SubtaskStore.roll_back`). At most two copies exist:
the base's and the newest.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...keygroups import KeyGroupRange
from ..errors import LocalStateError

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
#: Directories being deleted (renamed first: see :func:`discard_directory`).
TRASH_PREFIX = _TRASH = ".trash-"
_STAGING = ".staging-"


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
    #: A materialization written in the background from a copy of the store (see
    #: :mod:`~kafka_changelog.state.host.store_materialization`), not applied yet: its id and
    #: the key groups it writes, which ``changed_key_groups`` leaves out (they are changed
    #: again if it fails). None: there is none.
    pending: tuple[int, tuple[int, ...]] | None = None
    #: Background materializations that failed or were discarded since one was last
    #: applied (past a few, the task writes the next one itself and waits for it).
    materialization_failures: int = 0

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
            "pending": (None if self.pending is None
                        else {"materialization_id": self.pending[0],
                              "key_groups": list(self.pending[1])}),
            "materialization_failures": self.materialization_failures,
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
        pending = data.get("pending")
        return StoreManifest(
            str(data["application"]), str(data["operator_id"]), int(data["subtask"]),
            int(data["parallelism"]), KeyGroupRange(int(start), int(end)),
            int(data["max_parallelism"]), int(data["checkpoint_id"]), str(data["backend_id"]),
            base64.b64decode(data["handle"]),
            tuple(int(kg) for kg in data["changed_key_groups"]),
            float(due) if due is not None else None, str(data["owner"]),
            None if pending is None else (int(pending["materialization_id"]),
                                          tuple(int(kg) for kg in pending["key_groups"])),
            int(data.get("materialization_failures", 0)))


#: The directory of a store's background materialization jobs (see
#: :mod:`.store_materialization`), each with a lock its process holds while it runs.
JOBS_DIRECTORY = "materializing"

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
        self.retained_path = self.directory / "retained"
        #: The parallelism of the subtask whose store this is.
        self.parallelism = parallelism
        self._lock_fd: int | None = None

    # -- the lock ---------------------------------------------------------------------------

    def lock(self, timeout_s: float = 120.0) -> None:
        """Take the store's exclusive lock, waiting up to ``timeout_s`` for its holder (an
        earlier attempt of the task still running) to let go."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                # A cleanup renamed the directory (or removed an emptied parent) away
                # between our mkdir and our open: make it again.
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise LocalStateError(
                        f"the local state store {self.directory} is still locked by another "
                        f"task after {timeout_s:.0f} s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            if _same_file(fd, self.directory / "lock"):
                break
            # A cleanup deleted the directory (renamed it away) between our open and our
            # lock: the lock is on the old one; take it again on a new directory.
            os.close(fd)
        self._lock_fd = fd
        # The directory's modification time is the store's last use (local_cleanup).
        os.utime(self.directory)

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
        return read_manifest(self.manifest_path)

    def write_manifest(self, manifest: StoreManifest) -> None:
        """Write the manifest atomically and durably (the store must be flushed first)."""
        self._require_lock()
        _write_manifest(self.directory, manifest)

    # -- retained copies (rolling back) -----------------------------------------------------

    def _retained(self, checkpoint_id: int) -> Path:
        return self.retained_path / f"c{checkpoint_id}"

    def retain_copy(self, manifest: StoreManifest, copy_store: Callable[[Path], None]
                    ) -> None:
        """Keep a copy of the store at ``manifest``'s checkpoint: ``copy_store(path)``
        writes it into a new directory (the table's ``copy_to``); the copy and its
        manifest appear together or not at all."""
        self._require_lock()
        self.retained_path.mkdir(exist_ok=True)
        staging = self.retained_path / f"{_STAGING}{uuid.uuid4().hex}"
        try:
            staging.mkdir()
            copy_store(staging / "db")
            _write_manifest(staging, manifest)
            target = self._retained(manifest.checkpoint_id)
            if target.exists():
                discard_directory(target)
            os.rename(staging, target)
            _sync(self.retained_path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def retained_checkpoints(self) -> list[int]:
        """The checkpoints a copy is kept of, ascending."""
        try:
            names = [p.name for p in self.retained_path.iterdir()]
        except FileNotFoundError:
            return []
        return sorted(int(n[1:]) for n in names if n.startswith("c") and n[1:].isdigit())

    def read_retained_manifest(self, checkpoint_id: int) -> StoreManifest | None:
        """The manifest of the copy kept at ``checkpoint_id`` (None: no such copy)."""
        return read_manifest(self._retained(checkpoint_id) / "manifest.json")

    def prune_retained(self, keep: int | None) -> None:
        """Delete every copy but the one of checkpoint ``keep``, and what a crash left
        half made or half deleted."""
        self._require_lock()
        for path in self.directory.iterdir():
            if path.name.startswith((_TRASH, _STAGING)):
                shutil.rmtree(path, ignore_errors=True)
        try:
            paths = list(self.retained_path.iterdir())
        except FileNotFoundError:
            return
        for path in paths:
            if keep is None or path != self._retained(keep):
                discard_directory(path)

    def roll_back(self, checkpoint_id: int) -> None:
        """Make the live store the copy kept at ``checkpoint_id`` (which stays, for a
        later roll-back to the same checkpoint); the manifest is not written (the store
        is about to change). The immutable files are hard-linked, the others copied."""
        self.mark_changing()
        source = self._retained(checkpoint_id) / "db"
        if not source.is_dir():
            raise LocalStateError(f"no copy of checkpoint {checkpoint_id} in {self.directory}")
        if self.db_path.exists():
            discard_directory(self.db_path)
        staging = self.directory / f"{_STAGING}{uuid.uuid4().hex}"
        try:
            shutil.copytree(source, staging, copy_function=_link_immutable)
            os.rename(staging, self.db_path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def mark_changing(self) -> None:
        """The store is about to change: it is at no checkpoint until the next manifest."""
        self._require_lock()
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path.unlink()
            self._sync_directory()

    def reset(self) -> None:
        """Delete the live store and its manifest (a restore starts from an empty one)."""
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
                    or path.name.startswith(f"p{self.parallelism}-")):
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
        _sync(self.directory)


def _sync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path) -> StoreManifest | None:
    """The manifest at ``path``; None when missing or unreadable (logged)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot read the local state manifest %s: %s", path, exc)
        return None
    try:
        return StoreManifest.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the unreadable local state manifest %s: %s", path, exc)
        return None


def _write_manifest(directory: Path, manifest: StoreManifest) -> None:
    """``directory/manifest.json``, atomically and durably."""
    write_atomically(directory / "manifest.json", manifest.to_json().encode())


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all, durably (temporary file, fsync, rename, fsync
    of the directory)."""
    temporary = path.parent / f"{path.name}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    _sync(path.parent)


def discard_directory(path: Path) -> bool:
    """Delete a directory (False: it is not there); renamed first, so whoever opens the
    old path afterwards finds nothing half deleted."""
    trash = path.parent / f"{_TRASH}{uuid.uuid4().hex}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _link_immutable(source: str, target: str) -> None:
    # RocksDB never changes a table file (.sst) once written: a hard link shares it
    # safely. Its other files (MANIFEST, CURRENT, OPTIONS, logs) may be appended to or
    # replaced, so each store gets its own.
    if source.endswith(".sst"):
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system, or no hard links: copy
    shutil.copy2(source, target)


def _same_file(fd: int, path: Path) -> bool:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (found.st_dev, found.st_ino)


def lock_held(directory: Path) -> bool:
    """Whether some process holds ``directory/lock`` (checked without waiting)."""
    try:
        fd = os.open(directory / "lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor lets go of a lock taken just above
    return False


def jobs_running(store_directory: Path) -> bool:
    """Whether a background materialization job (a process holding its job's lock) is
    reading a copy under the store's directory."""
    try:
        jobs = list((store_directory / JOBS_DIRECTORY).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(lock_held(job) for job in jobs if job.is_dir())


def remove_store_directory(path: Path) -> bool:
    """Delete a subtask store directory if its lock is free and no materialization job
    runs in it (it would fail reading its copy); False when either is busy (the
    directory is removed by a later call)."""
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
        if jobs_running(path):
            return False
        try:
            return discard_directory(path)
        except OSError:
            return False
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


__all__ = ["JOBS_DIRECTORY", "TRASH_PREFIX", "StoreManifest", "SubtaskStore",
           "discard_directory", "jobs_running", "lock_held", "read_manifest",
           "remove_operator_stores",
           "remove_store_directory", "write_atomically"]
