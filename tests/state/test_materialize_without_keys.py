"""Materialization does not need keys: a due one starts and is applied at snapshots.

A subtask that gets no input for a while only takes checkpoints. The timer marks
materialization as due; the backend must act on it at ``snapshot`` too, or the
subtask's changelog tail (everything since the last materialization, in every
checkpoint) grows without bound.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange
from kafka_changelog.reader import StateChangelogReader
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore, SnapshotStore

from .state_helpers import MAX_P, apply_event, expected_for, model_apply, read_user

USERS = [f"user-{i}".encode() for i in range(40)]
ALL = KeyGroupRange.of(0, MAX_P - 1)
#: States the toy application registers: every materialization re-logs their registrations.
REGISTERED_STATES = 5
FAST = MaterializationConfig(interval_s=0.05, start_jitter_s=0)


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


def data_changes(handle: KeyedStateHandle, reader: StateChangelogReader[Any]) -> int:
    """Changes of the handle's changelog tail that are not registrations."""
    return sum(not c.is_meta for h in handle.changelog for c in reader.read(h))


def checkpoint_without_keys(backend: ChangelogKeyedStateBackend, checkpoint_id: int
                            ) -> KeyedStateHandle:
    """One checkpoint interval with no input, then the checkpoint.

    The interval is longer than the materialization interval (the timer fired) and than
    a materialization's background write (waited for by its future, not by a sleep), as
    checkpoint intervals of real jobs are.
    """
    assert backend.materializer.due.wait(30), "the materialization timer never fired"
    in_flight = backend.materialization_in_flight
    if in_flight is not None:
        in_flight.exception(120)
    handle = backend.snapshot(checkpoint_id).result(120)
    backend.notify_checkpoint_complete(checkpoint_id)
    return handle


def assert_materialized_and_bounded(
    handles: list[KeyedStateHandle], reader: StateChangelogReader[Any], before: int
) -> None:
    """Keyless checkpoints keep the changelog's data changes until materializations absorb
    them all (however soon or late they come on a loaded machine); from then on each names
    the same snapshot and only the states' meta records: nothing is materialized again."""

    def meta_only(handle: KeyedStateHandle) -> bool:
        changes = [c for h in handle.changelog for c in reader.read(h)]
        return len(changes) == REGISTERED_STATES and all(c.is_meta for c in changes)

    absorbed = next((i for i, h in enumerate(handles) if meta_only(h)), None)
    assert absorbed is not None, f"data changes left after {len(handles)} keyless checkpoints"
    assert absorbed < len(handles) - 1, "absorbed only at the last keyless checkpoint"
    for handle in handles[:absorbed]:
        assert data_changes(handle, reader) > 0
    materialized = handles[absorbed].materialization_id
    assert materialized > before and materialized > 0
    for handle in handles[absorbed:]:
        assert handle.snapshot is not None
        assert handle.materialization_id == materialized  # nothing changed: not redone
        assert len(handle.changelog) == 1
        assert meta_only(handle)


def checkpoints_without_keys(
    storage: Any, store: SnapshotStore) -> None:
    """Keys for three checkpoints, then none for 30; the tail must be materialized away."""
    rng = random.Random(17)
    model: dict[bytes, Any] = {}
    backend = ChangelogKeyedStateBackend(storage, store, "op", ALL, MAX_P, FAST)
    checkpoint_id = 0
    handle = None
    for _ in range(3):
        for _ in range(120):
            user, page, amount = rng.choice(USERS), rng.choice(["a", "b"]), rng.choice([1, 13])
            apply_event(backend, user, page, amount)
            model_apply(model, user, page, amount)
        checkpoint_id += 1
        handle = backend.snapshot(checkpoint_id).result(120)
        backend.notify_checkpoint_complete(checkpoint_id)
    assert handle is not None
    handles = []
    for _ in range(30):
        checkpoint_id += 1
        handles.append(checkpoint_without_keys(backend, checkpoint_id))
    with storage.reader() as reader:
        assert_materialized_and_bounded(handles, reader, handle.materialization_id)
    backend.close()
    restored = restore_backend(
        storage, store, "op", ALL, MAX_P, [handles[-1]])
    assert {u: read_user(restored, u) for u in USERS} == expected_for(model, USERS)
    restored.close()


def test_a_subtask_without_keys_still_materializes(storage: Any) -> None:
    checkpoints_without_keys(storage, InMemorySnapshotStore())


def test_a_restored_subtask_that_only_snapshots_materializes_its_adopted_log(
    storage: Any,
) -> None:
    """Restored (adopting a base that is all log) and then never given a key."""
    store = InMemorySnapshotStore()
    model: dict[bytes, Any] = {}
    first = ChangelogKeyedStateBackend(storage, store, "op", ALL, MAX_P)
    rng = random.Random(3)
    for _ in range(200):
        user, page, amount = rng.choice(USERS), rng.choice(["a", "b"]), rng.choice([0, 2])
        apply_event(first, user, page, amount)
        model_apply(model, user, page, amount)
    base = first.snapshot(1).result(10)
    first.close()
    assert base.snapshot is None and data_changes(base, storage.reader()) > 0
    restored = restore_backend(
        storage, store, "op", ALL, MAX_P, [base], materialization=FAST)
    assert restored.backend_id == base.backend_id  # adopted: nothing written at restore
    handles = [checkpoint_without_keys(restored, i) for i in range(2, 32)]
    assert_materialized_and_bounded(handles, storage.reader(), base.materialization_id)
    restored.close()
    again = restore_backend(storage, store, "op", ALL, MAX_P, [handles[-1]])
    assert {u: read_user(again, u) for u in USERS} == expected_for(model, USERS)
    again.close()
