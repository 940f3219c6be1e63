"""The local recovery directory keeps what restorable checkpoints need, nothing more.

As Flink's task-local state store: confirming checkpoint ``c`` drops the copies only
older checkpoints used (and whatever earlier runs left), aborting ``c`` drops its
own copies, and a restore after pruning still uses the kept copies first and reads
Kafka for anything missing, with exactly the same state.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import key_group_for_key
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.local_recovery import LocalKeyedStateHandle, LocalRecoveryStore
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.writer import SnapshotResult
from tests.kafka.test_local_recovery import ALL, restore
from tests.kafka.test_state_kafka import USERS, Job
from tests.state.state_helpers import MAX_P, apply_event, expected_for, model_apply

pytestmark = pytest.mark.broker


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def events(backend: ChangelogKeyedStateBackend, model: dict[bytes, Any], rng: random.Random,
           count: int) -> None:
    for _ in range(count):
        user, page, amount = rng.choice(USERS), rng.choice(["a", "b", "c"]), rng.choice([1, 13])
        apply_event(backend, user, page, amount)
        model_apply(model, user, page, amount)


def checkpoint(job: Job, backend: ChangelogKeyedStateBackend, checkpoint_id: int,
               confirm: bool = True) -> LocalKeyedStateHandle:
    """Snapshot, complete in the coordinator, notify the backend; the task-local copy."""
    result: SnapshotResult[Any] = backend.snapshot_result(checkpoint_id).result(60)
    assert result.job_owned is not None
    job.coordinator.complete(checkpoint_id, [SubtaskState("op", 0, 1, result.job_owned, None)])
    if confirm:
        backend.notify_checkpoint_complete(checkpoint_id)
    local = result.task_local
    assert isinstance(local, LocalKeyedStateHandle)
    # The local handle describes the durable state, field for field.
    assert (local.backend_id, local.materialization_id, local.snapshot, local.changelog) == (
        result.job_owned.backend_id, result.job_owned.materialization_id,
        result.job_owned.snapshot, result.job_owned.changelog)
    return local


def completed(job: Job, checkpoint_id: int) -> CompletedCheckpoint:
    found = job.coordinator.checkpoint(checkpoint_id)
    assert found is not None
    return found


def test_the_directory_does_not_grow_over_100_checkpoints(job: Job, tmp_path: Path) -> None:
    store = LocalRecoveryStore(tmp_path / "task-0")
    backend = ChangelogKeyedStateBackend(job.storage, job.snapshots, "op", ALL, MAX_P,
                                         local_recovery=store)
    model: dict[bytes, Any] = {}
    rng = random.Random(23)
    counts: list[int] = []
    sizes: list[int] = []
    for checkpoint_id in range(1, 101):
        events(backend, model, rng, 20)
        if checkpoint_id % 7 == 0:
            backend.materialize_now()
        local = checkpoint(job, backend, checkpoint_id)
        # Exactly the copies of the confirmed checkpoint are left: one changelog piece (no
        # adopted base log) and one file per key group of its snapshot.
        snapshot_groups = len(local.snapshot.key_groups) if local.snapshot is not None else 0
        assert len(local.files) == snapshot_groups + 1
        assert store.file_names() == set(local.files)
        assert all(path.is_file() for path in local.paths)
        counts.append(len(local.files))
        sizes.append(store.size_bytes)
    assert max(counts) <= len({key_group_for_key(u, MAX_P) for u in USERS}) + 1
    # The toy application's state per user is bounded, and so are the copies of it.
    assert max(sizes[50:]) <= 1.25 * max(sizes[14:50])
    backend.close()
    reader = LocalRecoveryStore(tmp_path / "task-0")
    assert restore(job, completed(job, 100), reader) == expected_for(model, USERS)
    assert reader.stats.hits == counts[-1] and reader.stats.misses == 0
    assert reader.stats.rejected == 0


def test_an_aborted_checkpoints_copies_are_discarded(job: Job, tmp_path: Path) -> None:
    store = LocalRecoveryStore(tmp_path / "task-0")
    backend = ChangelogKeyedStateBackend(job.storage, job.snapshots, "op", ALL, MAX_P,
                                         local_recovery=store)
    model: dict[bytes, Any] = {}
    rng = random.Random(29)
    events(backend, model, rng, 150)
    backend.materialize_now()
    events(backend, model, rng, 50)
    first = checkpoint(job, backend, 1)
    events(backend, {}, rng, 50)  # lost with the aborted checkpoint
    aborted = backend.snapshot_result(2).result(60).task_local
    assert isinstance(aborted, LocalKeyedStateHandle)
    own = set(aborted.files) - set(first.files)
    assert own and all((store.directory / name).is_file() for name in own)
    backend.notify_checkpoint_aborted(2)
    assert not any((store.directory / name).exists() for name in own)
    assert store.file_names() == set(first.files)
    backend.close()
    reader = LocalRecoveryStore(tmp_path / "task-0")
    assert restore(job, completed(job, 1), reader) == expected_for(model, USERS)
    assert reader.stats.hits == len(first.files) and reader.stats.misses == 0


def test_files_of_an_earlier_run_are_pruned_at_the_first_confirm(
    job: Job, tmp_path: Path
) -> None:
    directory = tmp_path / "task-0"
    model: dict[bytes, Any] = {}
    rng = random.Random(31)
    # Run 1: checkpoints 1 to 3, the last one never confirmed to the backend (it died).
    first_run = LocalRecoveryStore(directory)
    backend = ChangelogKeyedStateBackend(job.storage, job.snapshots, "op", ALL, MAX_P,
                                         local_recovery=first_run)
    events(backend, model, rng, 150)
    backend.materialize_now()
    checkpoint(job, backend, 1)
    events(backend, model, rng, 100)
    backend.materialize_now()
    events(backend, model, rng, 50)
    second = checkpoint(job, backend, 2)
    events(backend, model, rng, 50)
    third = checkpoint(job, backend, 3, confirm=False)
    backend.close()
    leftovers = [directory / "snapshots" / "tmpk2j4x_crashed", directory / "changelog" / "x.bin"]
    for path in leftovers:
        path.write_bytes(b"left by a crashed process")
    run_one = first_run.file_names()
    assert set(second.files) | set(third.files) <= run_one

    # Run 2, same directory: restore checkpoint 3 from the local copies, go on, confirm 4.
    second_run = LocalRecoveryStore(directory)
    backend = job.coordinator.restore_keyed("op", ALL, completed(job, 3),
                                            job.changelog, local_recovery=second_run)
    assert backend.backend_id == third.backend_id  # adopted the base of checkpoint 3
    assert second_run.stats.hits == len(third.files) and second_run.stats.misses == 0
    assert second_run.file_names() == run_one  # restoring deletes nothing
    events(backend, model, rng, 60)
    fourth = checkpoint(job, backend, 4)
    assert second_run.file_names() == set(fourth.files)
    assert not any(path.exists() for path in leftovers)
    assert set(second.files) - set(third.files) - set(fourth.files)  # run 1's own copies...
    assert not (set(second.files) - set(fourth.files)) & second_run.file_names()  # ...gone
    kept_from_run_one = set(fourth.files) & run_one
    assert kept_from_run_one == set(third.files)  # the adopted base's copies are still used
    backend.close()

    # A restore after pruning: the kept copies first, the stores for what is missing.
    missing = sorted(kept_from_run_one)[:2]
    for name in missing:
        (directory / name).unlink()
    reader = LocalRecoveryStore(directory)
    assert restore(job, completed(job, 4), reader) == expected_for(model, USERS)
    assert reader.stats.hits == len(fourth.files) - len(missing)
    assert reader.stats.misses == len(missing) and reader.stats.rejected == 0
