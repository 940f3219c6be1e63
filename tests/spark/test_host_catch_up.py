"""A subtask that comes back to a host where it ran before catches up from the store it
left there: only the changelog since is read from Kafka and replayed (real broker).

Each "host" is a local state directory of its own; the subtask moves between them task
by task, as Spark moves a subtask's task between executors on different hosts. Across a
materialization (or from a store of a batch that was re-run elsewhere), the key groups
that may differ from the base's snapshot are reloaded from it and the base's changelog is
replayed; a store of which less than half the snapshot's bytes would be kept is restored
in full instead. A catch-up never makes the state differ from what Kafka holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import key_group_for_key
from kafka_changelog.state.host import host_store
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from spark_integration.streaming.task import host_store_settings, placement_of
from tests.spark.host_subtasks import (
    COUNT,
    EVERY_TASK,
    Subtask,
    subtask_runner,
    users_in_groups,
)

pytestmark = [pytest.mark.broker]


@pytest.fixture
def subtask(kafka_cluster: Any, tmp_path: Path) -> Iterator[Subtask]:
    with subtask_runner(kafka_cluster.bootstrap_servers, tmp_path) as runner:
        yield runner

NEVER = MaterializationConfig(None)


def move_to(runner: Subtask, directory: Path) -> None:
    """Run the next tasks on the host whose local state directory is ``directory`` (the
    backend the last task's process kept stays behind)."""
    if runner.cached is not None:
        runner.cached.backend.close()
        runner.cached = None
    runner.config = dataclasses.replace(runner.config, local_state_dir=str(directory))


def test_a_subtask_back_on_a_host_catches_up_from_the_store_it_left(
        subtask: Subtask, tmp_path: Path) -> None:
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    everyone = users_in_groups({1, 2, 3, 4, 5}, 12)
    subtask.task(1, None, everyone[:6], NEVER)
    move_to(subtask, host_b)
    assert subtask.task(2, 1, everyone[3:9], NEVER).source == "restored"
    assert subtask.task(3, 2, everyone[6:], NEVER).source == "reattached"
    move_to(subtask, host_a)
    back = subtask.task(4, 3, everyone[:2], NEVER)
    assert back.source == "caught-up"
    # The base continues: checkpoint 1's changelog is the start of checkpoint 4's.
    first, fourth = subtask.handles[1], subtask.handles[4]
    assert fourth.changelog[:len(first.changelog)] == first.changelog
    assert subtask.restored(4) == subtask.model
    # Every user's count is read from the caught-up store and written again: the next
    # checkpoint restores exactly only if the store held every change of the host B.
    assert subtask.task(5, 4, everyone, NEVER).source == "reattached"
    assert subtask.restored(5) == subtask.model


def key_groups_of(users: list[str]) -> set[int]:
    return {key_group_for_key(user.encode(), 128) for user in users}


def test_across_a_materialization_only_the_key_groups_changed_since_are_reloaded(
        subtask: Subtask, tmp_path: Path) -> None:
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    groups = set(range(20, 36))
    everyone = users_in_groups(groups, 320)
    subtask.task(1, None, everyone, EVERY_TASK)  # every key group in a snapshot ...
    on_a = [u for u in everyone if key_group_for_key(u.encode(), 128) == 20]
    assert subtask.task(2, 1, on_a, NEVER).applied == 1  # ... applied here
    move_to(subtask, host_b)
    # Key group 21: one user of 20, written as a delta layer; 22: all of them, whole.
    on_b = [next(u for u in everyone if key_group_for_key(u.encode(), 128) == 21),
            *(u for u in everyone if key_group_for_key(u.encode(), 128) == 22)]
    assert subtask.task(3, 2, on_b, EVERY_TASK).source == "restored"
    later = [u for u in everyone if key_group_for_key(u.encode(), 128) == 23]
    assert subtask.task(4, 3, later, NEVER).applied == 1  # a newer snapshot, on host B
    assert subtask.handles[4].materialization_id > subtask.handles[2].materialization_id
    move_to(subtask, host_a)
    back = subtask.task(5, 4, everyone[:3], NEVER)
    assert back.source == "caught-up"
    # Key group 20 changed in the store since its snapshot: reloaded whole, as 22, which
    # host B's snapshot wrote whole; 21 only takes the delta layer on the store's layer.
    # The rest is kept as it is, and the base's changelog (key group 23's changes and
    # batch 5's) replayed on top.
    snapshot = subtask.handles[4].snapshot
    assert snapshot is not None
    assert [len(snapshot.layers_of(kg)) for kg in (20, 21, 22)] == [1, 2, 1]
    assert back.catch_up is not None
    assert dict(back.catch_up.deltas) == {21: 1}
    assert back.catch_up.reload == {20, 22}
    assert subtask.restored(5) == subtask.model
    assert subtask.task(6, 5, everyone, NEVER).source == "reattached"
    assert subtask.restored(6) == subtask.model


def test_a_store_of_a_batch_run_again_elsewhere_loses_its_changes_in_a_catch_up(
        subtask: Subtask, tmp_path: Path) -> None:
    """Host A's store is at its attempt of checkpoint 3, which never completed, and a
    materialization came since: the attempt's key groups are reloaded, so none of its
    changes (each a count incremented: applied twice, a count would be wrong) stays."""
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    everyone = users_in_groups(set(range(40, 52)), 48)
    subtask.task(1, None, everyone, EVERY_TASK)
    subtask.task(2, 1, everyone[:2], NEVER)
    before = dict(subtask.model)
    attempt = [u for u in everyone if key_group_for_key(u.encode(), 128) == 41]
    subtask.task(3, 2, attempt, NEVER)  # host A's attempt of checkpoint 3: not completed
    subtask.model = before
    move_to(subtask, host_b)
    on_b = [u for u in everyone if key_group_for_key(u.encode(), 128) == 42]
    assert subtask.task(3, 2, on_b, EVERY_TASK).source == "restored"
    subtask.task(4, 3, on_b, NEVER)
    move_to(subtask, host_a)
    back = subtask.task(5, 4, attempt, NEVER)
    assert back.source == "caught-up"
    assert back.catch_up is not None
    stale = key_groups_of(everyone[:2]) | {41}  # changed in the store since its snapshot
    assert stale <= back.catch_up.reload
    assert back.catch_up.reload | back.catch_up.deltas.keys() == stale | {42}
    assert subtask.restored(5) == subtask.model
    assert subtask.task(6, 5, everyone, NEVER).source == "reattached"
    assert subtask.restored(6) == subtask.model


def test_a_store_whose_key_groups_all_changed_since_is_restored_in_full(
        subtask: Subtask, tmp_path: Path) -> None:
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    everyone = users_in_groups({7, 8}, 8)
    subtask.task(1, None, everyone[:4], NEVER)
    move_to(subtask, host_b)
    subtask.task(2, 1, everyone[2:6], EVERY_TASK)  # a materialization, applied next
    third = subtask.task(3, 2, everyone[4:], NEVER)
    assert third.applied == 1 and subtask.handles[3].snapshot is not None
    move_to(subtask, host_a)
    assert subtask.task(4, 3, everyone[:3], NEVER).source == "restored"
    assert subtask.task(5, 4, everyone, NEVER).source == "reattached"
    assert subtask.restored(5) == subtask.model


def test_a_store_of_a_batch_that_was_run_again_elsewhere_is_not_caught_up(
        subtask: Subtask, tmp_path: Path) -> None:
    """Host A's store is at its attempt of checkpoint 2, which never completed; the batch
    ran again on host B from checkpoint 1. Host A's changes of the failed attempt are in
    no checkpoint: its store must not be caught up from."""
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    everyone = users_in_groups({9, 10}, 8)
    subtask.task(1, None, everyone[:4], NEVER)
    before = dict(subtask.model)
    subtask.task(2, 1, everyone, NEVER)  # host A's attempt of checkpoint 2: not completed
    subtask.model = before
    move_to(subtask, host_b)
    assert subtask.task(2, 1, everyone[4:], NEVER).source == "restored"
    move_to(subtask, host_a)
    assert subtask.task(3, 2, everyone[:2], NEVER).source == "restored"
    assert subtask.task(4, 3, everyone, NEVER).source == "reattached"
    assert subtask.restored(4) == subtask.model


def test_a_store_whose_task_died_mid_batch_catches_up_from_the_copy_it_kept(
        subtask: Subtask, tmp_path: Path) -> None:
    """Host A was lost while a task held its store (no manifest: at no checkpoint); the
    copy the task before it kept at checkpoint 1 is caught up from when the subtask comes
    back."""
    host_a, host_b = Path(subtask.config.local_state_dir or ""), tmp_path / "host-b"
    everyone = users_in_groups({60, 61, 62}, 12)
    subtask.task(1, None, everyone, NEVER)
    move_to(subtask, host_a)  # the task of batch 2 starts in a new process on host A ...
    settings = host_store_settings(subtask.config)
    assert settings is not None
    dying = host_store.attach(settings, placement_of(subtask.config, 0), 1,
                              [subtask.handles[1]], None, subtask.storage, subtask.snapshots,
                              NEVER)
    dying.backend.set_current_key(everyone[0].encode())
    dying.backend.state(COUNT).update(1000)  # ... changes the store, and dies
    dying.table.flush()
    host_store.abandon(dying)
    assert subtask.store.read_manifest() is None
    move_to(subtask, host_b)
    assert subtask.task(2, 1, everyone[:5], NEVER).source == "restored"
    subtask.task(3, 2, everyone[5:], NEVER)
    move_to(subtask, host_a)
    back = subtask.task(4, 3, everyone[:2], NEVER)
    assert back.source == "caught-up"
    assert back.catch_up is not None and not back.catch_up.rebased
    assert subtask.restored(4) == subtask.model
    assert subtask.task(5, 4, everyone, NEVER).source == "reattached"
    assert subtask.restored(5) == subtask.model
