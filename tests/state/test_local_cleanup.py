"""A host's local state stays bounded: stores nobody used for the retention are deleted
whatever their application, and a store in use is never deleted, even by a cleanup that
races a task taking it. (Stores of subtasks that moved away stay: a task catches up from
them when the subtask comes back.)"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.host.local_cleanup import remove_idle, sweep_idle
from kafka_changelog.state.host.local_store import StoreManifest, SubtaskStore


def at_checkpoint(root: Path, subtask: int, checkpoint_id: int | None, *,
                  application: str = "app", parallelism: int = 2,
                  kept: int | None = None) -> SubtaskStore:
    """A store of ``subtask`` at ``checkpoint_id`` (None: at none), with a copy kept at
    ``kept``; unlocked."""
    store = SubtaskStore(root, application, "op", subtask, parallelism)
    store.lock()
    store.db_path.mkdir(exist_ok=True)
    (store.db_path / "000001.sst").write_bytes(b"x" * 100)
    if checkpoint_id is not None:
        store.write_manifest(manifest(application, subtask, parallelism, checkpoint_id))
    if kept is not None:
        store.retain_copy(manifest(application, subtask, parallelism, kept),
                          lambda path: path.mkdir())
    store.unlock()
    return store


def manifest(application: str, subtask: int, parallelism: int,
             checkpoint_id: int) -> StoreManifest:
    size = 128 // parallelism
    return StoreManifest(application, "op", subtask, parallelism,
                         KeyGroupRange(subtask * size, subtask * size + size - 1), 128,
                         checkpoint_id, "op-b", b"h", (), None, "owner")


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def clean_up(current: SubtaskStore) -> list[Path]:
    """A cleanup of every store under ``current``'s root that nobody holds (an idle
    sweep whose retention everything exceeded)."""
    return remove_idle(current.operator_directory.parent.parent, -60.0)


def assert_holds_its_directory(store: SubtaskStore, current: SubtaskStore) -> None:
    """``store`` holds the lock of the directory it names now (not of one a cleanup took
    away), so the next cleanup (by ``current``'s task) leaves it; both unlocked after."""
    assert store._lock_fd is not None
    assert os.path.samestat(os.stat(store.directory / "lock"), os.fstat(store._lock_fd))
    assert clean_up(current) == []  # held: not deleted again
    store.unlock()
    current.unlock()


def test_stores_unused_for_the_retention_go_whatever_their_application(
        tmp_path: Path) -> None:
    stopped = at_checkpoint(tmp_path, 0, 3, application="stopped")
    running = at_checkpoint(tmp_path, 0, 9, application="running")
    old = time.time() - 3600
    os.utime(stopped.directory, (old, old))
    assert remove_idle(tmp_path, 600) == [stopped.directory]
    assert names(tmp_path) == ["running"]                # the emptied directories go too
    assert running.directory.is_dir()
    # Locking is using: a store locked now is not idle even if its files are old.
    os.utime(running.directory, (old, old))
    running.lock()
    running.unlock()
    assert remove_idle(tmp_path, 600) == []


def test_an_idle_store_that_a_task_holds_stays(tmp_path: Path) -> None:
    store = at_checkpoint(tmp_path, 0, 3)
    store.lock()
    old = time.time() - 3600
    os.utime(store.directory, (old, old))
    assert remove_idle(tmp_path, 600) == []
    store.unlock()
    assert remove_idle(tmp_path, 600) == [store.directory]


def test_the_idle_sweep_runs_at_most_once_a_minute_per_root(tmp_path: Path) -> None:
    first = at_checkpoint(tmp_path, 0, 3, application="a")
    old = time.time() - 3600
    os.utime(first.directory, (old, old))
    assert sweep_idle(tmp_path, 600) == [first.directory]
    second = at_checkpoint(tmp_path, 0, 3, application="b")
    os.utime(second.directory, (old, old))
    assert sweep_idle(tmp_path, 600) == []               # swept a moment ago
    assert sweep_idle(tmp_path, None) == []              # never
    assert second.directory.is_dir()


def test_a_task_locking_a_store_while_it_is_deleted_gets_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a task's open of the lock file and its lock, a cleanup may take the lock
    and delete the directory: the task would then hold the lock of nothing (and the next
    cleanup would delete its store under it); it must lock the new directory instead."""
    victim = at_checkpoint(tmp_path, 1, 1)
    current = at_checkpoint(tmp_path, 0, 2)
    current.lock()
    real_flock = fcntl.flock
    deletions: list[Path] = []
    interleaved: list[bool] = []

    def flock_after_a_cleanup(fd: int, operation: int) -> None:
        if not interleaved:  # the first lock attempt: the cleanup gets in between
            interleaved.append(True)
            deletions.extend(clean_up(current))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_cleanup)
    store = SubtaskStore(tmp_path, "app", "op", 1, 2)
    store.lock()
    monkeypatch.undo()
    assert deletions == [victim.directory]
    assert_holds_its_directory(store, current)


def test_a_task_creating_a_store_while_a_cleanup_deletes_it_gets_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task making a new store (rescaled, so a sibling at no checkpoint to a cleanup)
    may see the directory renamed away between its mkdir and its open of the lock file:
    it makes the directory again and locks that, not fail with FileNotFoundError."""
    current = at_checkpoint(tmp_path, 0, 2)
    current.lock()
    real_open = os.open
    deletions: list[Path] = []
    interleaved: list[bool] = []

    def open_after_a_cleanup(path: str | os.PathLike[str], flags: int, mode: int = 0o777
                             ) -> int:
        if Path(path).name == "lock" and not interleaved:
            interleaved.append(True)  # the task's first open: the cleanup gets in before
            (Path(path).parent / "db").mkdir(exist_ok=True)  # the new store, half made
            deletions.extend(clean_up(current))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_after_a_cleanup)
    store = SubtaskStore(tmp_path, "app", "op", 1, 2)
    store.lock()
    monkeypatch.undo()
    assert deletions == [store.directory]
    assert_holds_its_directory(store, current)
