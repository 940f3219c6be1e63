"""The keyed backend's contract, run unchanged with each working copy (in memory, RocksDB),
and restores across kinds: a checkpoint written with one table restores into the other.

Each class below gets its tables from its own ``new_table`` fixture; the tests are
those of ``test_keyed_backend.py`` that depend on the table (reads, restore exactness,
rescaling, materialization, adoption, entry counts), over the in-memory storage and
snapshot store.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange
from kafka_changelog.state import InMemoryCheckpointStore
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

from .state_helpers import (
    MAX_P,
    apply_event,
    expected_for,
    model_apply,
    ranges,
    read_user,
    users_in,
)

USERS = [f"user-{i}".encode() for i in range(60)]
PAGES = ["home", "cart", "search", "item", "checkout"]
KINDS = ["memory", "rocksdb"]
TableFactory = Callable[[], KeyedStateTable]


def factory_for(kind: str, directory: Path) -> TableFactory:
    """New empty tables of ``kind`` (RocksDB ones in fresh directories under ``directory``)."""
    return lambda: StateBackendConfig(kind, str(directory)).create_table("op")


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


@pytest.fixture
def store() -> InMemorySnapshotStore:
    return InMemorySnapshotStore()


def drive(backend: ChangelogKeyedStateBackend, model: dict[bytes, Any], rng: random.Random,
          events: int, users: list[bytes]) -> None:
    for _ in range(events):
        user = rng.choice(users)
        page, amount = rng.choice(PAGES), rng.choice([0, 1, 5, 13, 40])
        apply_event(backend, user, page, amount)
        model_apply(model, user, page, amount)


class KeyedStateContract:
    """What every table must give the backend. Subclasses provide ``new_table``."""

    kind: str

    def backend(self, storage: Any, store: Any, new_table: TableFactory,
                key_groups: KeyGroupRange | None = None) -> ChangelogKeyedStateBackend:
        return ChangelogKeyedStateBackend(storage, store, "op",
                                          key_groups or KeyGroupRange.of(0, 127), MAX_P,
                                          table=new_table())

    def test_state_kinds_read_what_was_written(self, storage: Any, store: Any,
                                               new_table: TableFactory) -> None:
        backend = self.backend(storage, store, new_table)
        model: dict[bytes, Any] = {}
        drive(backend, model, random.Random(1), 500, USERS)
        for user in USERS:
            assert read_user(backend, user) == expected_for(model, [user])[user]
        # A user's value and list states count one each (count cleared by amount 13 is
        # absent), a map state each of its entries.
        assert backend.state_rows() == sum(
            sum(len(v) if name == "pages" else 1 for name, v in s.items()
                if v not in (None, [], {})) for s in model.values())
        backend.close()

    def test_checkpoint_restores_exactly_with_and_without_materialization(
        self, storage: Any, store: Any, new_table: TableFactory
    ) -> None:
        rng = random.Random(2)
        model: dict[bytes, Any] = {}
        backend = self.backend(storage, store, new_table)
        drive(backend, model, rng, 300, USERS)
        backend.materialize_now()
        drive(backend, model, rng, 200, USERS)
        handle = backend.snapshot(1).result(10)
        backend.notify_checkpoint_complete(1)
        drive(backend, copy.deepcopy(model), rng, 50, USERS)  # after the checkpoint
        restored = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P,
                                   [handle], table=new_table())
        assert {u: read_user(restored, u) for u in USERS} == expected_for(model, USERS)
        assert restored.backend_id == handle.backend_id  # adopted
        backend.close()
        restored.close()

    @pytest.mark.parametrize("path", [[1, 4, 2, 3], [3, 1]])
    def test_rescaling_follows_key_groups(self, storage: Any, store: Any,
                                          new_table: TableFactory, path: list[int]) -> None:
        rng = random.Random(sum(path))
        model: dict[bytes, Any] = {}
        handles = []
        backends = [self.backend(storage, store, new_table, r) for r in ranges(path[0])]
        for checkpoint, parallelism in enumerate(path, start=1):
            if checkpoint > 1:
                backends = [restore_backend(storage, store, "op", r, MAX_P, handles,
                                            table=new_table()) for r in ranges(parallelism)]
                for b, r in zip(backends, ranges(parallelism), strict=True):
                    mine = users_in(USERS, r)
                    assert {u: read_user(b, u) for u in mine} == expected_for(model, mine)
            for b, r in zip(backends, ranges(parallelism), strict=True):
                drive(b, model, rng, 150, users_in(USERS, r))
                if rng.random() < 0.5:
                    b.materialize_now()
            handles = [b.snapshot(checkpoint).result(10) for b in backends]
            for b in backends:
                b.close()

    def test_materialization_writes_only_changed_key_groups(
        self, storage: Any, store: Any, new_table: TableFactory
    ) -> None:
        backend = self.backend(storage, store, new_table)
        drive(backend, {}, random.Random(3), 300, USERS)
        first = backend.materialize_now()
        assert first is not None
        assert set(first.key_groups) == set(backend.table.key_groups())
        apply_event(backend, USERS[0], "home", 1)
        second = backend.materialize_now()
        assert second is not None
        written = {c.key_group for c in second.chunks
                   if c.materialization_id == second.materialization_id}
        assert written == {backend.current()[0]}
        backend.close()

    def test_adopted_log_is_materialized_before_it_is_dropped(
        self, storage: Any, store: Any, new_table: TableFactory
    ) -> None:
        model: dict[bytes, Any] = {}
        first = self.backend(storage, store, new_table)
        drive(first, model, random.Random(9), 200, USERS)
        handle = first.snapshot(1).result(10)
        second = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P,
                                 [handle], table=new_table())
        apply_event(second, USERS[0], "home", 1)
        model_apply(model, USERS[0], "home", 1)
        second.materialize_now()
        later = second.snapshot(2).result(10)
        third = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P,
                                [later], table=new_table())
        assert {u: read_user(third, u) for u in USERS} == expected_for(model, USERS)
        for b in (first, second, third):
            b.close()

    @pytest.mark.parametrize("other", KINDS)
    def test_a_checkpoint_restores_into_either_kind(
        self, storage: Any, store: Any, new_table: TableFactory, other: str, tmp_path: Path
    ) -> None:
        """Written with this kind (materialized and a tail), restored into ``other`` at the
        same range and rescaled: the same state, and the same snapshot bytes."""
        other_table = factory_for(other, tmp_path / "other")
        rng = random.Random(11)
        model: dict[bytes, Any] = {}
        backend = self.backend(storage, store, new_table)
        drive(backend, model, rng, 300, USERS)
        backend.materialize_now()
        drive(backend, model, rng, 100, USERS)
        handle = backend.snapshot(1).result(10)
        same = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle],
                               table=other_table())
        assert {u: read_user(same, u) for u in USERS} == expected_for(model, USERS)
        assert same.table.key_groups() == backend.table.key_groups()
        for key_group in backend.table.key_groups():
            assert same.table.serialize_group(key_group) == backend.table.serialize_group(
                key_group)
        assert same.state_rows() == backend.state_rows()
        halves = [restore_backend(storage, store, "op", r, MAX_P, [handle],
                                  table=other_table()) for r in ranges(2)]
        for half, r in zip(halves, ranges(2), strict=True):
            mine = users_in(USERS, r)
            assert {u: read_user(half, u) for u in mine} == expected_for(model, mine)
        assert sum(h.state_rows() for h in halves) == backend.state_rows()
        for b in (backend, same, *halves):
            b.close()

    def test_the_coordinator_restores_with_the_configured_kind(
        self, storage: Any, store: Any, tmp_path: Path
    ) -> None:
        config = StateBackendConfig(self.kind, str(tmp_path / "coordinator"))
        coordinator = CheckpointCoordinator("app", InMemoryCheckpointStore(), store, storage,
                                            MAX_P, state_backend=config)
        model: dict[bytes, Any] = {}
        rng = random.Random(5)
        for checkpoint_id, parallelism in enumerate([2, 3], start=1):
            latest = coordinator.checkpoint()
            subtasks = []
            for index, r in enumerate(ranges(parallelism)):
                backend = coordinator.restore_keyed("op", r, latest)
                assert isinstance(backend.table, (StateTable if self.kind == "memory"
                                                  else RocksDBStateTable))
                mine = users_in(USERS, r)
                assert {u: read_user(backend, u) for u in mine} == expected_for(model, mine)
                drive(backend, model, rng, 100, mine)
                handle = backend.snapshot(checkpoint_id).result(10)
                subtasks.append(SubtaskState("op", index, parallelism, handle, None))
                backend.close()
            coordinator.complete(checkpoint_id, subtasks)
        # RocksDB working copies are deleted when their backends close.
        leftovers = list((tmp_path / "coordinator").glob("*")) if self.kind == "rocksdb" else []
        assert leftovers == []


class TestInMemoryTable(KeyedStateContract):
    kind = "memory"

    @pytest.fixture
    def new_table(self) -> TableFactory:
        return StateTable


class TestRocksDBTable(KeyedStateContract):
    kind = "rocksdb"

    @pytest.fixture
    def new_table(self, tmp_path: Path) -> TableFactory:
        return factory_for("rocksdb", tmp_path / "tables")
