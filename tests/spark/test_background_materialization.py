"""Materialization in the background, from a copy of a subtask's local store.

A task for which a materialization is due keeps a copy of its store at its checkpoint
and leaves the writing of the snapshot to a background thread; a later task applies
the result when the checkpoint it starts from continues the copy's, and otherwise
discards it, giving its key groups back. Driven here task by task through
``host_store`` (what ``stateful_foreach_batch`` runs in each Spark task) against a real
broker, so that each case (done, failed, still running, superseded) is reached exactly.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import key_group_for_key
from kafka_changelog.kafka.job_process import spawn_job
from kafka_changelog.state.host import host_store
from kafka_changelog.state.host import store_materialization as jobs
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.worker_resources import WorkerResources, resource_key
from tests.spark.host_subtasks import Subtask, subtask_runner, users_in_groups

pytestmark = [pytest.mark.broker]


@pytest.fixture
def subtask(kafka_cluster: Any, tmp_path: Path) -> Iterator[Subtask]:
    with subtask_runner(kafka_cluster.bootstrap_servers, tmp_path) as runner:
        yield runner


def test_a_done_materialization_becomes_the_base_of_the_next_checkpoint(
    subtask: Subtask
) -> None:
    first = subtask.task(1, None, users_in_groups(set(range(128)), 300))
    # The task started it and did not wait: nothing written by the task itself.
    assert first.started is not None and first.pending is not None
    assert subtask.cached is None  # its own log spans the copy's checkpoint
    assert subtask.handles[1].snapshot is None
    materialization_id = first.pending[0]

    second = subtask.task(2, 1, users_in_groups({3, 4}, 5), MaterializationConfig(None))
    assert second.source == "reattached-local"
    assert (second.applied, second.pending) == (1, None)
    assert second.applied_bytes > 0
    handle = subtask.handles[2]
    assert handle.snapshot is not None
    assert handle.materialization_id == materialization_id
    # Only the second task's log follows the snapshot: the first one's is in it.
    assert handle.changelog != () and subtask.handles[1].changelog[0] not in handle.changelog
    assert jobs.list_jobs(subtask.store.directory) == []
    assert subtask.restored(2) == subtask.model


def test_a_failed_materialization_gives_its_key_groups_back(subtask: Subtask) -> None:
    early = users_in_groups({10, 11}, 6)  # changed only before the failed job
    first = subtask.task(1, None, early, run=False)
    assert first.started is not None
    # The writer dies without a result: its lock goes with its process.
    os.close(first.started.lock_fd)
    assert [j.status for j in jobs.list_jobs(subtask.store.directory)] == [jobs.JobStatus.FAILED]

    second = subtask.task(2, 1, users_in_groups({20}, 3), run=False)
    assert second.applied == 0
    assert second.started is not None
    # The new job writes the failed one's key groups too.
    assert {10, 11, 20} <= set(second.started.job.changed)
    assert jobs.run_job(second.started, subtask.snapshots) is not None

    subtask.task(3, 2, users_in_groups({30}, 2), MaterializationConfig(None))
    handle = subtask.handles[3]
    assert handle.snapshot is not None and {10, 11, 20} <= set(handle.snapshot.key_groups)
    # The users changed only before the failure are in the snapshot, not in the log.
    assert subtask.restored(3) == subtask.model


def test_a_materialization_older_than_the_sweep_may_keep_is_written_again(
    subtask: Subtask,
) -> None:
    """A done background job that started more than half the snapshot sweep's grace ago
    may have lost its chunks to a sweep (nothing named them): it is not applied, its
    chunks are tombstoned and its key groups are written by a later materialization."""
    first = subtask.task(1, None, users_in_groups({5, 6}, 4))
    assert first.pending is not None
    result = jobs.list_jobs(subtask.store.directory)[0].result
    assert result is not None
    time.sleep(0.3)  # older than 0.2 s: half the grace the next task runs with
    usual = subtask.config
    subtask.config = dataclasses.replace(usual, snapshot_sweep_grace_s=0.4)
    second = subtask.task(2, 1, users_in_groups({7}, 2), run=False)
    subtask.config = usual  # the next task applies the second job, however long it took
    assert second.applied == 0
    assert subtask.handles[2].snapshot is None
    live = {key.key for key in subtask.snapshots.live_keys()}
    assert not {c.record_key(result.backend_id) for c in result.chunks} & live
    # The next job writes the old one's key groups too.
    assert second.started is not None and {5, 6, 7} <= set(second.started.job.changed)
    assert jobs.run_job(second.started, subtask.snapshots) is not None

    subtask.task(3, 2, [], MaterializationConfig(None))
    assert subtask.handles[3].snapshot is not None
    assert subtask.restored(3) == subtask.model


def test_a_running_materialization_is_waited_for_by_no_task(subtask: Subtask) -> None:
    first = subtask.task(1, None, users_in_groups({1, 2}, 4), run=False)
    assert first.started is not None
    running = first.started
    # The next tasks find it running: they go on, start no other one, carry it.
    second = subtask.task(2, 1, users_in_groups({5}, 3))
    assert (second.applied, second.started) == (0, None)
    assert second.pending == first.pending
    third = subtask.task(3, 2, users_in_groups({6}, 3))
    assert third.started is None
    assert subtask.store.read_manifest() is not None
    assert subtask.store.read_manifest().pending == first.pending  # type: ignore[union-attr]
    assert jobs.run_job(running, subtask.snapshots) is not None

    fourth = subtask.task(4, 3, users_in_groups({7}, 3), MaterializationConfig(None))
    assert fourth.applied == 1
    handle = subtask.handles[4]
    assert handle.materialization_id == first.pending[0]  # type: ignore[index]
    # Task 1's log is in the snapshot; what tasks 2 to 4 logged (one backend, kept by
    # the process between them) follows it.
    assert subtask.handles[1].changelog[0] not in handle.changelog
    assert len(handle.changelog) == 1
    assert handle.snapshot is not None and set(handle.snapshot.key_groups) == {1, 2}
    assert subtask.restored(4) == subtask.model


def test_a_materialization_of_a_checkpoint_that_never_completed_is_discarded(
    subtask: Subtask
) -> None:
    subtask.task(1, None, users_in_groups({1}, 3), MaterializationConfig(None))
    before = dict(subtask.model)
    # Checkpoint 2 is taken and its materialization written, but the batch is re-run
    # from checkpoint 1 (the driver died before the commit).
    subtask.task(2, 1, users_in_groups({2}, 3))
    [job] = jobs.list_jobs(subtask.store.directory)
    assert job.status is jobs.JobStatus.DONE and job.result is not None
    subtask.model = before
    retry = subtask.task(2, 1, users_in_groups({9}, 3), MaterializationConfig(None))
    assert retry.source == "rolled-back"
    assert retry.applied == 0
    assert jobs.list_jobs(subtask.store.directory) == []
    assert subtask.handles[2].snapshot is None
    assert subtask.restored(2) == subtask.model


def test_after_failures_in_a_row_the_task_writes_the_materialization_itself(
    subtask: Subtask
) -> None:
    """A worker killed while idle (or one that exits after each task) never finishes a
    background materialization: past two failures in a row the task writes it and waits."""
    for checkpoint in (1, 2):
        attached = subtask.task(checkpoint, checkpoint - 1 or None,
                                users_in_groups({checkpoint}, 3), run=False)
        assert attached.started is not None
        os.close(attached.started.lock_fd)  # its writer dies
    third = subtask.task(3, 2, users_in_groups({3}, 3), run=False)
    assert third.failures == host_store.MAX_BACKGROUND_FAILURES
    handed: list[jobs.StartedJob] = []
    host_store.run_started(third, subtask.snapshots, handed.append,
                           process_outlives_task=True)
    assert handed == []  # written by the task itself
    assert [j.status for j in jobs.list_jobs(subtask.store.directory)] == [jobs.JobStatus.DONE]

    fourth = subtask.task(4, 3, users_in_groups({4}, 3), run=False)
    assert (fourth.applied, fourth.failures) == (1, 0)
    assert fourth.started is not None
    # In a Python worker that exits after its task, the task writes it too.
    host_store.run_started(fourth, subtask.snapshots, handed.append,
                           process_outlives_task=False)
    assert handed == []
    subtask.task(5, 4, [], MaterializationConfig(None))
    handle = subtask.handles[5]
    assert handle.snapshot is not None and set(handle.snapshot.key_groups) == {1, 2, 3, 4}
    assert subtask.restored(5) == subtask.model


def test_later_materializations_write_only_the_keys_changed_since(
    subtask: Subtask, tmp_path: Path
) -> None:
    """Once a key group has a snapshot, a materialization writes a delta layer of its keys
    changed since (deleted ones included) on top of it; past a few layers, or when the
    deltas would outgrow a share of it, the key group is written whole again."""
    everyone = users_in_groups(set(range(128)), 2000)
    subtask.task(1, None, everyone)
    whole = subtask.task(2, 1, everyone[:2])  # applies the first; its own is a delta
    assert whole.applied == 1 and whole.started is not None
    [state] = [j for j in jobs.list_jobs(subtask.store.directory)
               if j.status is jobs.JobStatus.DONE]
    assert state.result is not None and state.job is not None
    changed = set(state.job.changed)
    assert len(changed) <= 2
    for key_group in changed:
        layers = state.result.layers_of(key_group)
        assert len(layers) == 2
        assert sum(c.size for c in layers[1]) < sum(c.size for c in layers[0]) / 5
    # Unchanged key groups keep their one layer.
    untouched = next(kg for kg in range(128) if kg not in changed)
    assert len(state.result.layers_of(untouched)) == 1

    gone = everyone[2]
    subtask.task(3, 2, [], deletes=(gone,))  # applies the delta; a delta with a deletion
    subtask.task(4, 3, [], MaterializationConfig(None))
    handle = subtask.handles[4]
    assert handle.snapshot is not None and handle.snapshot.layered
    assert gone not in subtask.model
    assert subtask.restored(4, users=[gone]) == subtask.model
    assert subtask.restored(4, tmp_path / "rocks", users=[gone]) == subtask.model

    # The same key group changed again and again: whole again once it has MAX_LAYERS.
    from kafka_changelog.state.snapshots.delta_layer import MAX_LAYERS

    again = [everyone[5]] * 3
    key_group = key_group_for_key(again[0].encode(), 128)
    layer_counts = []
    for checkpoint in range(5, 5 + MAX_LAYERS + 1):
        subtask.task(checkpoint, checkpoint - 1, again)
        snapshot = subtask.handles[checkpoint].snapshot
        assert snapshot is not None
        layer_counts.append(len(snapshot.layers_of(key_group)))
    assert max(layer_counts) == MAX_LAYERS and layer_counts[-1] < MAX_LAYERS
    last = 5 + MAX_LAYERS
    assert subtask.restored(last) == subtask.model

    # A key changed while a materialization is being written is in the next one's delta.
    slow = subtask.task(last + 1, last, [everyone[7]], run=False)
    assert slow.started is not None
    subtask.task(last + 2, last + 1, [everyone[8]])
    assert jobs.run_job(slow.started, subtask.snapshots) is not None
    follow = subtask.task(last + 3, last + 2, [])  # applies it, starts the next one
    assert follow.applied == 1 and follow.started is not None
    eighth = key_group_for_key(everyone[8].encode(), 128)
    assert eighth in follow.started.job.changed
    subtask.task(last + 4, last + 3, [], MaterializationConfig(None))
    snapshot = subtask.handles[last + 4].snapshot
    assert snapshot is not None and len(snapshot.layers_of(eighth)) > 1
    assert subtask.restored(last + 4) == subtask.model


def test_a_materialization_written_by_a_process_of_its_own(
    subtask: Subtask, capfd: pytest.CaptureFixture[str]
) -> None:
    first = subtask.task(1, None, users_in_groups(set(range(128)), 300), run=False)
    assert first.started is not None and first.pending is not None
    lock_fd = first.started.lock_fd
    process = spawn_job(first.started, subtask.config.snapshots(), nice=7)
    # The child holds the lock now; this process's descriptor is closed.
    with pytest.raises(OSError):
        os.fstat(lock_fd)
    assert process.wait(60) == 0
    assert "at nice 7" in capfd.readouterr().err  # it lowered its own priority
    [done] = jobs.list_jobs(subtask.store.directory)
    assert done.status is jobs.JobStatus.DONE and done.result is not None
    assert not (done.path / "db").exists()  # the copy went with the job

    second = subtask.task(2, 1, users_in_groups({3, 4}, 5), MaterializationConfig(None))
    assert (second.applied, second.pending) == (1, None)
    assert subtask.handles[2].materialization_id == first.pending[0]
    assert subtask.restored(2) == subtask.model


def test_a_job_process_past_its_deadline_fails_and_gives_its_key_groups_back(
    subtask: Subtask
) -> None:
    first = subtask.task(1, None, users_in_groups({10, 11}, 6), run=False)
    assert first.started is not None
    # Brokers that never answer: the deadline ends the process, not a hang.
    unreachable = dataclasses.replace(subtask.config, bootstrap_servers="127.0.0.1:9")
    started = time.monotonic()
    process = spawn_job(first.started, unreachable.snapshots(), nice=0, deadline_s=2)
    assert process.wait(60) != 0
    assert time.monotonic() - started < 30
    assert [j.status for j in jobs.list_jobs(subtask.store.directory)] == [jobs.JobStatus.FAILED]

    second = subtask.task(2, 1, users_in_groups({20}, 3))
    assert second.applied == 0 and second.started is not None
    assert {10, 11, 20} <= set(second.started.job.changed)
    subtask.task(3, 2, [], MaterializationConfig(None))
    handle = subtask.handles[3]
    assert handle.snapshot is not None and {10, 11, 20} <= set(handle.snapshot.key_groups)
    assert subtask.restored(3) == subtask.model


def test_settings_a_process_cannot_get_fall_back_to_a_worker_thread(subtask: Subtask) -> None:
    first = subtask.task(1, None, users_in_groups({5, 6}, 4), run=False)
    assert first.started is not None
    errors: list[Any] = []
    # A callback defined here cannot be pickled for another process.
    config = dataclasses.replace(subtask.config,
                                 client_config={"error_cb": lambda e: errors.append(e)})
    with pytest.raises(OSError, match="cannot be handed to a process"):
        spawn_job(first.started, config.snapshots())
    os.fstat(first.started.lock_fd)  # the lock is still this process's
    try:
        WorkerResources.materialize(config, first.started)  # on a thread instead
        assert WorkerResources.job_processes == [] and WorkerResources.materializer is not None
        WorkerResources.materializer.shutdown(wait=True)
    finally:
        WorkerResources.materializer = None
        clients = WorkerResources.storages.pop(resource_key(config), None)
        if clients is not None:
            clients[1].close()
            clients[0].close()
    [done] = jobs.list_jobs(subtask.store.directory)
    assert done.status is jobs.JobStatus.DONE
    subtask.task(2, 1, [], MaterializationConfig(None))
    assert subtask.handles[2].materialization_id == first.started.job.materialization_id
    assert subtask.restored(2) == subtask.model


def test_the_materialization_priority_is_checked() -> None:
    def config(nice: int | None) -> StreamingStateConfig:
        return StreamingStateConfig(application="a", operator_id="op",
                                    bootstrap_servers="127.0.0.1:9", materialization_nice=nice)

    assert config(None).materialization_nice is None
    assert config(0).materialization_nice == 0
    assert StreamingStateConfig("a", "op", "b:1").materialization_nice == 10  # the default
    for bad in (-1, 20):
        with pytest.raises(ValueError, match=f"materialization_nice must be None or 0..19, "
                                             f"got {bad}"):
            config(bad)
