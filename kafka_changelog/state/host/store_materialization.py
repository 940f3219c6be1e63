"""Materializing a copy of a subtask store, away from the task that made it.

In streaming, a task may neither wait for a materialization (its batch would cost what
the whole state holds, not what the batch holds) nor leave one running in its backend
(the backend does not outlive the task: the next batch may run in another Python
worker). So when one is due, the task keeps a copy of its store as it is at the
task's checkpoint (a RocksDB checkpoint: hard links) with a description of the job,
and a background thread of its process writes the snapshot of the changed key groups
from that copy (:func:`run_job`), then leaves the snapshot handle beside it.

A later task of the subtask, in whatever process of the host, finds the result and
makes it its backend's base (:meth:`ChangelogKeyedStateBackend.apply_materialization`)
when the checkpoint it starts from continues the one the copy was made at; anything
else (a failed or abandoned job, a result that no longer fits) is discarded and its key
groups stay to be materialized. Which job is pending, and the key groups it covers,
is in the store's manifest, so a lost job directory never loses a change.

Layout, in the store's directory: ``materializing/m<id>/{job.json, lock, db/,
result.json}``. A job is *running* while its lock is held (by the thread writing it),
*done* once ``result.json`` exists, and *failed* otherwise.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ...keygroups import KeyGroupRange
from ..checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from ..rocksdb.table import RocksDBStateTable
from ..snapshots.delta_layer import encode_delta, worth_a_delta
from ..snapshots.snapshot import ChunkRef, SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore, finish_or_abandon
from .local_store import (
    JOBS_DIRECTORY,
    TRASH_PREFIX,
    discard_directory,
    lock_held,
    write_atomically,
)

logger = logging.getLogger(__name__)

JOB_FORMAT = 1
DIRECTORY = JOBS_DIRECTORY
_STAGING = ".staging-"


class JobStatus(Enum):
    """Where a job directory is (see the module docstring)."""

    #: Its lock is held: a process is writing it.
    RUNNING = "running"
    #: ``result.json`` exists: the snapshot is written.
    DONE = "done"
    #: Neither: the writer died or gave up; its key groups stay to be written.
    FAILED = "failed"


@dataclass(frozen=True)
class MaterializationJob:
    """What a background materialization writes, and what it continues."""

    materialization_id: int
    backend_id: str
    key_group_range: KeyGroupRange
    #: The key groups changed since the previous snapshot: written anew.
    changed: tuple[int, ...]
    #: The checkpoint the copy is at, and the subtask's state in it: its snapshot is the
    #: previous one (whose chunks of unchanged key groups are reused) and its changelog
    #: is what the new snapshot replaces.
    checkpoint_id: int
    checkpoint_state: bytes
    #: The copy's change epoch (see ``RocksDBStateTable.start_change_epoch``): key groups
    #: with earlier layers may get a delta of the keys marked up to it. None: whole ones.
    epoch: int | None = None

    @property
    def covered(self) -> KeyedStateHandle:
        """The keyed state handle of the checkpoint the copy is at."""
        keyed = SubtaskState.from_bytes(self.checkpoint_state).keyed
        if keyed is None:
            raise ValueError(f"materialization {self.materialization_id}: the checkpoint "
                             f"{self.checkpoint_id} state has no keyed state")
        return keyed

    def reused(self) -> dict[int, tuple[ChunkRef, ...]]:
        """The previous snapshot's chunks of the key groups that did not change."""
        previous = self.covered.snapshot
        if previous is None:
            return {}
        changed = set(self.changed)
        return {kg: previous.chunks_of(kg) for kg in previous.key_groups
                if kg not in changed and self.key_group_range.contains(kg)}

    def to_json(self) -> str:
        return json.dumps({
            "format": JOB_FORMAT,
            "materialization_id": self.materialization_id,
            "backend_id": self.backend_id,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "changed": list(self.changed),
            "checkpoint_id": self.checkpoint_id,
            "checkpoint_state": base64.b64encode(self.checkpoint_state).decode(),
            "epoch": self.epoch,
        }, indent=1)

    @staticmethod
    def from_json(text: str) -> MaterializationJob:
        data = json.loads(text)
        if data.get("format") != JOB_FORMAT:
            raise ValueError(f"materialization job format {data.get('format')!r}, expected "
                             f"{JOB_FORMAT}")
        start, end = data["key_group_range"]
        return MaterializationJob(
            int(data["materialization_id"]), str(data["backend_id"]),
            KeyGroupRange(int(start), int(end)), tuple(int(kg) for kg in data["changed"]),
            int(data["checkpoint_id"]), base64.b64decode(data["checkpoint_state"]),
            None if data.get("epoch") is None else int(data["epoch"]))


class MaterializationStopped(Exception):
    """A job stopped before it was written (its process or worker is closing): the
    chunks it wrote are tombstoned, and its key groups stay to be written."""


@dataclass
class StartedJob:
    """A job just created: its directory and the lock its writer holds until it ends."""

    path: Path
    job: MaterializationJob
    lock_fd: int


@dataclass(frozen=True)
class JobState:
    """A job directory as found: its job, state and (done) result."""

    path: Path
    materialization_id: int
    status: JobStatus
    job: MaterializationJob | None
    result: SnapshotHandle | None


def job_path(store_directory: Path, materialization_id: int) -> Path:
    """The directory of job ``materialization_id`` in a store's directory."""
    return store_directory / DIRECTORY / f"m{materialization_id}"


def create_job(store_directory: Path, job: MaterializationJob,
               copy_store: Callable[[Path], None]) -> StartedJob:
    """Make job ``job``: a copy of the store (``copy_store(path)``: the table's
    ``copy_to``), its description and its lock, held from now on by the caller's process
    (hand it to :func:`run_job`). The directory appears complete or not at all."""
    parent = store_directory / DIRECTORY
    parent.mkdir(exist_ok=True)
    staging = parent / f"{_STAGING}{uuid.uuid4().hex}"
    staging.mkdir()
    fd = -1
    try:
        fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        copy_store(staging / "db")
        (staging / "job.json").write_text(job.to_json(), encoding="utf-8")
        target = job_path(store_directory, job.materialization_id)
        os.rename(staging, target)
        return StartedJob(target, job, fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise


def run_job(started: StartedJob, snapshots: SnapshotStore,
            stop: threading.Event | None = None) -> SnapshotHandle | None:
    """Write the job's snapshot from its copy and leave the handle in ``result.json``;
    the copy is deleted either way. Returns the handle (None: failed, logged; the lock is
    let go, so the next task sees the job failed and keeps its key groups to write).
    Once ``stop`` is set, the job stops before its next key group and tombstones the
    chunks it wrote (:class:`MaterializationStopped`, logged)."""
    job, path = started.job, started.path
    handle: SnapshotHandle | None = None
    try:
        # Opened tracking changes (it makes none): so as to keep its mark that it has.
        table = RocksDBStateTable(path / "db", track_changes=True)
        try:
            handle = write_snapshot(table, job, snapshots, stop)
        finally:
            table.close()
        write_atomically(path / "result.json", handle.to_bytes())
        logger.info("materialization %d of backend %s written from the copy at checkpoint "
                    "%d (%d key groups, %d bytes)", job.materialization_id, job.backend_id,
                    job.checkpoint_id, len(job.changed), _written_bytes(handle, job))
        return handle
    except Exception as exc:
        logger.warning("materialization %d of backend %s (copy at checkpoint %d) failed: %s",
                       job.materialization_id, job.backend_id, job.checkpoint_id, exc)
        if handle is not None:  # written but not recorded: nobody will use its chunks
            tombstone(snapshots, job, handle)
        return None
    finally:
        shutil.rmtree(path / "db", ignore_errors=True)
        fcntl.flock(started.lock_fd, fcntl.LOCK_UN)
        os.close(started.lock_fd)


def write_snapshot(table: RocksDBStateTable, job: MaterializationJob,
                   snapshots: SnapshotStore, stop: threading.Event | None = None
                   ) -> SnapshotHandle:
    """Write the job's snapshot from ``table`` (the job's copy): each changed key group
    whole, or as a delta on its earlier layers when the copy knows its changed keys
    (``job.epoch`` set) and the delta is worth it. Raises
    :class:`MaterializationStopped` (its chunks tombstoned) once ``stop`` is set."""
    writer = snapshots.begin_write(job.backend_id, job.materialization_id,
                                   job.key_group_range, job.checkpoint_id)
    try:
        reused = job.reused()
        previous = job.covered.snapshot
        incremental = (job.epoch is not None and previous is not None
                       and previous.backend_id == job.backend_id and table.changes_complete)
        # The marks of every key group in one pass (they are stored by key group).
        marks = table.changed_keys_by_group() if incremental else iter(())
        marked: tuple[int, list[tuple[str, bytes]]] = (-1, [])
        for key_group in sorted(job.changed):
            if stop is not None and stop.is_set():
                raise MaterializationStopped(
                    f"materialization {job.materialization_id} of backend {job.backend_id} "
                    f"stopped before key group {key_group}")
            if not table.has_entries(key_group):
                continue  # emptied: neither written nor reused
            while marked[0] < key_group:
                marked = next(marks, (job.key_group_range.end + 1, []))
            # A changed key group without marks is written whole (nothing says what changed).
            if incremental and marked[0] == key_group:
                assert previous is not None
                layers = previous.layers_of(key_group)
                if layers:
                    delta = encode_delta(table, key_group, marked[1])
                    if worth_a_delta(layers, len(delta)):
                        writer.add(key_group, delta, delta=True)
                        reused[key_group] = previous.chunks_of(key_group)
                        continue
            writer.add(key_group, table.serialize_group(key_group))
    except BaseException:
        writer.abandon()  # a half-written job (e.g. its store removed): in no checkpoint
        raise
    return finish_or_abandon(writer, reused)


def cancel(started: StartedJob) -> None:
    """Drop a job that will not run (the task that made it failed)."""
    try:
        discard_directory(started.path)
    finally:
        fcntl.flock(started.lock_fd, fcntl.LOCK_UN)
        os.close(started.lock_fd)


def _written_bytes(handle: SnapshotHandle, job: MaterializationJob) -> int:
    return sum(c.size for c in handle.chunks if c.materialization_id == job.materialization_id)


def written_bytes(state: JobState) -> int:
    """Bytes of chunks a done job wrote (its reused chunks not counted)."""
    if state.result is None or state.job is None:
        return 0
    return _written_bytes(state.result, state.job)


def list_jobs(store_directory: Path) -> list[JobState]:
    """Every job directory of the store, with its state (crash leftovers removed)."""
    parent = store_directory / DIRECTORY
    try:
        entries = sorted(parent.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for path in entries:
        if path.name.startswith(TRASH_PREFIX):
            shutil.rmtree(path, ignore_errors=True)  # a deletion that did not finish
            continue
        if path.name.startswith(_STAGING):
            if not lock_held(path):
                shutil.rmtree(path, ignore_errors=True)
            continue
        if not (path.name.startswith("m") and path.name[1:].isdigit()):
            continue
        found.append(_state_of(path, int(path.name[1:])))
    return found


def _state_of(path: Path, materialization_id: int) -> JobState:
    try:
        job: MaterializationJob | None = MaterializationJob.from_json(
            (path / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("unreadable materialization job %s: %s", path, exc)
        job = None
    try:
        result: SnapshotHandle | None = SnapshotHandle.from_bytes(
            (path / "result.json").read_bytes())
    except FileNotFoundError:
        result = None
    except Exception as exc:
        logger.warning("unreadable materialization result in %s: %s", path, exc)
        result = None
    if result is not None and job is not None:
        return JobState(path, materialization_id, JobStatus.DONE, job, result)
    status = JobStatus.RUNNING if lock_held(path) else JobStatus.FAILED
    return JobState(path, materialization_id, status, job, None)


def tombstone(snapshots: SnapshotStore, job: MaterializationJob,
              result: SnapshotHandle) -> None:
    """Delete the chunks a job wrote (not those it reused): nobody will refer to them."""
    written = [c for c in result.chunks if c.materialization_id == job.materialization_id]
    if not written:
        return
    try:
        snapshots.delete(written, job.backend_id)
    except Exception as exc:  # a leaked chunk costs space, never correctness
        logger.warning("could not tombstone %d chunks of materialization %d of backend %s: "
                       "%s", len(written), job.materialization_id, job.backend_id, exc)


def discard(state: JobState, snapshots: SnapshotStore | None) -> None:
    """Remove a job that will not be used (a done one's chunks are tombstoned first)."""
    if state.status is JobStatus.RUNNING:
        raise ValueError(f"materialization job {state.path} is still running")
    if state.result is not None and state.job is not None and snapshots is not None:
        tombstone(snapshots, state.job, state.result)
    discard_directory(state.path)


__all__ = ["JobState", "JobStatus", "MaterializationJob", "MaterializationStopped", "StartedJob",
           "cancel", "create_job", "discard", "job_path", "list_jobs", "run_job", "tombstone",
           "write_snapshot", "written_bytes"]
