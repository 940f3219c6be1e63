"""Host-local subtask stores: one holder at a time across processes, manifests written
atomically and removed before a change, stale stores of other parallelisms deleted,
copies kept at checkpoints to roll back to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.errors import LocalStateError
from kafka_changelog.state.host.local_store import (
    StoreManifest,
    SubtaskStore,
    remove_operator_stores,
)
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import SET, StateMeta, StateOp

ROOT = Path(__file__).resolve().parents[2]


def manifest(checkpoint_id: int = 7) -> StoreManifest:
    return StoreManifest("app", "op", 1, 2, KeyGroupRange(64, 127), 128, checkpoint_id,
                         "op-abc", b"\x00handle\xff", (64, 70), 1.5e9, "owner-1")


def test_a_manifest_round_trips_and_is_replaced_atomically(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 1, 2)
    store.lock()
    assert store.read_manifest() is None
    store.write_manifest(manifest(7))
    assert store.read_manifest() == manifest(7)
    store.write_manifest(manifest(8))
    assert store.read_manifest() == manifest(8)
    # No temporary file is left behind.
    assert sorted(p.name for p in store.directory.iterdir()) == ["lock", "manifest.json"]
    store.mark_changing()
    assert store.read_manifest() is None
    store.unlock()


def test_an_unreadable_manifest_counts_as_none(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 0, 1)
    store.lock()
    store.manifest_path.write_text("{not json")
    assert store.read_manifest() is None
    store.manifest_path.write_text(manifest().to_json().replace('"format": 1', '"format": 9'))
    assert store.read_manifest() is None
    store.unlock()


def test_writing_needs_the_lock(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 0, 1)
    with pytest.raises(LocalStateError, match="not locked"):
        store.write_manifest(manifest())
    with pytest.raises(LocalStateError, match="not locked"):
        store.mark_changing()


HOLD = """
import sys, time
from kafka_changelog.state.host.local_store import SubtaskStore
store = SubtaskStore(sys.argv[1], "app", "op", 0, 1)
store.lock()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
store.unlock()
"""


def test_the_lock_excludes_other_processes_until_released(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), "1.5"],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        store = SubtaskStore(tmp_path, "app", "op", 0, 1)
        with pytest.raises(LocalStateError, match="still locked by another task"):
            store.lock(timeout_s=0.2)
        started = time.monotonic()
        store.lock(timeout_s=30)  # waits for the holder to let go
        assert time.monotonic() - started > 0.5
        assert store.locked
        store.unlock()
        assert not store.locked
    finally:
        holder.wait(30)


def test_stale_stores_of_other_parallelisms_go_unless_held(tmp_path: Path) -> None:
    old = [SubtaskStore(tmp_path, "app", "op", s, 2) for s in range(2)]
    for store in old:
        store.lock()
        store.db_path.mkdir()
        (store.db_path / "data").write_bytes(b"x")
        store.write_manifest(manifest())
        store.unlock()
    old[1].lock()  # still in use by a task of the old parallelism
    other_operator = SubtaskStore(tmp_path, "app", "other", 0, 2)
    other_operator.lock()
    other_operator.unlock()
    new = SubtaskStore(tmp_path, "app", "op", 0, 3)
    new.lock()
    removed = new.remove_stale()
    assert removed == [old[0].directory]
    assert sorted(p.name for p in new.operator_directory.iterdir()) == ["p2-s1", "p3-s0"]
    old[1].unlock()
    assert new.remove_stale() == [old[1].directory]
    assert sorted(p.name for p in new.operator_directory.iterdir()) == ["p3-s0"]
    assert other_operator.directory.exists()
    new.unlock()


def test_reset_empties_the_store_and_removing_the_operator_cleans_up(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 0, 1)
    store.lock()
    store.db_path.mkdir()
    store.write_manifest(manifest())
    store.reset()
    assert store.read_manifest() is None and not store.db_path.exists()
    assert remove_operator_stores(tmp_path, "app", "op") == 0  # held: kept
    store.unlock()
    assert remove_operator_stores(tmp_path, "app", "op") == 1
    assert list(tmp_path.iterdir()) == []


def test_any_name_is_one_directory_below_the_root(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path / "root", "..", "a/b", 0, 1)
    assert store.directory.resolve().is_relative_to((tmp_path / "root").resolve())
    assert store.operator_directory.parent.parent == tmp_path / "root"


# -- retained copies: rolling a store back to the checkpoint a re-run starts from ---------------


def table_at(path: Path) -> RocksDBStateTable:
    table = RocksDBStateTable(path)
    table.register(StateMeta("count", StateKind.VALUE, "int64", None))
    return table


def count_of(table: RocksDBStateTable, key: bytes) -> bytes | None:
    return table.get(0, "count", key)  # type: ignore[return-value]


def test_a_store_rolls_back_to_the_copy_kept_at_its_checkpoint(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 1, 2)
    store.lock()
    table = table_at(store.db_path)
    table.apply(0, StateOp("count", SET, b"ann", None, b"1"))
    table.flush()
    store.write_manifest(manifest(7))
    store.retain_copy(manifest(7), table.copy_to)
    # The next batch changes the store, then its checkpoint never completes.
    store.mark_changing()
    table.apply(0, StateOp("count", SET, b"ann", None, b"2"))
    table.apply(0, StateOp("count", SET, b"bob", None, b"1"))
    table.flush()
    store.write_manifest(manifest(8))
    store.retain_copy(manifest(8), table.copy_to)
    table.close()
    assert store.retained_checkpoints() == [7, 8]

    # The re-run starts from checkpoint 7: only its copy is kept, and the store is it.
    store.prune_retained(7)
    assert store.retained_checkpoints() == [7]
    assert store.read_retained_manifest(7) == manifest(7)
    assert store.read_retained_manifest(8) is None
    store.roll_back(7)
    assert store.read_manifest() is None  # about to change: at no checkpoint
    table = RocksDBStateTable(store.db_path)
    assert (count_of(table, b"ann"), count_of(table, b"bob")) == (b"1", None)
    assert table.entry_count() == 1
    # Changing the rolled-back store leaves the copy as it was: rolling back again works.
    table.apply(0, StateOp("count", SET, b"ann", None, b"5"))
    table.close()
    store.roll_back(7)
    table = RocksDBStateTable(store.db_path)
    assert count_of(table, b"ann") == b"1"
    table.close()
    # Nothing half made or half deleted is left.
    assert sorted(p.name for p in store.directory.iterdir()) == ["db", "lock", "retained"]
    assert sorted(p.name for p in store.retained_path.iterdir()) == ["c7"]
    store.prune_retained(None)
    assert store.retained_checkpoints() == []
    store.unlock()


def test_rolling_back_without_a_copy_names_the_checkpoint(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 0, 1)
    store.lock()
    with pytest.raises(LocalStateError, match="no copy of checkpoint 3"):
        store.roll_back(3)
    store.unlock()


def test_leftovers_of_a_crash_in_the_middle_of_a_copy_are_removed(tmp_path: Path) -> None:
    store = SubtaskStore(tmp_path, "app", "op", 0, 1)
    store.lock()
    (store.directory / ".staging-dead").mkdir(parents=True)
    (store.retained_path / ".staging-dead").mkdir(parents=True)
    (store.retained_path / "c4" / "db").mkdir(parents=True)
    store.prune_retained(4)
    assert sorted(p.name for p in store.directory.iterdir()) == ["lock", "retained"]
    assert sorted(p.name for p in store.retained_path.iterdir()) == ["c4"]
    store.unlock()


def test_a_store_whose_materialization_job_runs_is_removed_only_after_it(
        tmp_path: Path) -> None:
    """Removing a store under a running background materialization would make the job
    fail reading its copy: the store stays until the job let go of its lock."""
    import fcntl

    from kafka_changelog.state.host.local_store import JOBS_DIRECTORY

    store = SubtaskStore(tmp_path, "app", "op", 0, 2)
    store.lock()
    store.db_path.mkdir()
    store.write_manifest(manifest())
    store.unlock()
    job = store.directory / JOBS_DIRECTORY / "m7"
    (job / "db").mkdir(parents=True)
    fd = os.open(job / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the job's process holds it
    try:
        rescaled = SubtaskStore(tmp_path, "app", "op", 0, 3)
        rescaled.lock()
        assert rescaled.remove_stale() == []
        rescaled.unlock()
        assert remove_operator_stores(tmp_path, "app", "op") == 1  # the new one only
        assert (job / "db").is_dir()
    finally:
        os.close(fd)  # the job ends
    assert remove_operator_stores(tmp_path, "app", "op") == 1
    assert list(tmp_path.iterdir()) == []
