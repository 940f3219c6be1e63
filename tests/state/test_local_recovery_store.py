"""The local recovery store's bookkeeping (in memory storages, real files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.local_recovery import LocalKeyedStateHandle, LocalRecoveryStore
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .state_helpers import MAX_P

V = value_state("v", INT64)
ALL = KeyGroupRange.of(0, MAX_P - 1)


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


def put(backend: ChangelogKeyedStateBackend, keys: range, value: int) -> None:
    for key in keys:
        backend.set_current_key(f"k{key}".encode())
        backend.state(V).update(value)


def local_of(backend: ChangelogKeyedStateBackend, checkpoint_id: int) -> LocalKeyedStateHandle:
    local = backend.snapshot_result(checkpoint_id).result(10).task_local
    assert isinstance(local, LocalKeyedStateHandle)
    return local


def test_without_a_local_store_there_is_no_task_local_copy(storage: Any) -> None:
    backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL, MAX_P)
    put(backend, range(3), 1)
    result = backend.snapshot_result(1).result(10)
    assert isinstance(result.job_owned, KeyedStateHandle)
    assert result.task_local is None
    backend.close()


def test_a_materialization_not_yet_applied_survives_a_confirm(
    storage: Any, tmp_path: Path
) -> None:
    store = LocalRecoveryStore(tmp_path)
    backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL, MAX_P,
                                         local_recovery=store)
    put(backend, range(20), 1)
    first = local_of(backend, 1)
    put(backend, range(10), 2)
    future = backend.materialize()
    assert future is not None and future.exception(10) is None  # written, not applied
    written = store.file_names() - set(first.files)
    assert len(written) == len(future.result().key_groups)
    backend.notify_checkpoint_complete(1)  # prunes: the materialization's files are held
    assert written <= store.file_names()
    second = local_of(backend, 2)  # applies it: checkpoint 2 uses its copies
    assert second.materialization_id > first.materialization_id
    assert written <= set(second.files) and all(p.is_file() for p in second.paths)
    backend.notify_checkpoint_complete(2)
    assert store.file_names() == set(second.files)
    backend.close()


def test_a_copy_for_an_aborted_checkpoint_is_not_written(tmp_path: Path, storage: Any) -> None:
    store = LocalRecoveryStore(tmp_path)
    writer = storage.create_writer("op", ALL)
    writer.append(1, b"x")
    handle = writer.persist(writer.initial_sequence_number(), 7).result(10).job_owned
    store.retain("owner", 7, set())
    store.abort_checkpoint("owner", 7)
    assert store.put_checkpoint_changes("owner", 7, handle, []) is None
    assert store.file_names() == set()
    writer.close()


def test_close_keeps_checkpoint_copies_and_drops_the_rest(storage: Any, tmp_path: Path) -> None:
    store = LocalRecoveryStore(tmp_path)
    backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL, MAX_P,
                                         local_recovery=store)
    put(backend, range(20), 1)
    backend.materialize_now()
    pending = local_of(backend, 1)  # never confirmed: a restart may still need it
    put(backend, range(5), 2)
    backend.materialize_now()  # in no checkpoint
    assert store.file_names() > set(pending.files)
    backend.close()
    assert store.file_names() == set(pending.files)
