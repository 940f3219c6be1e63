"""The one way a task gets its subtask's backend: each source, in memory and with a
host-local store, with the exact state it starts from (in-memory storages, real RocksDB
stores on disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_changelog import InMemoryChangelogStorage, key_group_for_key
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.host.acquire import AcquiredBackend, acquire, discard, keep
from kafka_changelog.state.host.host_store import HostStoreSettings
from kafka_changelog.state.host.subtask_backend import CachedBackend, StateSource, SubtaskPlacement
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

from .state_helpers import MAX_P

pytest.importorskip("rocksdict")

V = value_state("v", INT64)
NEVER = MaterializationConfig(interval_s=None)
ONE = SubtaskPlacement("app", "op", 0, 1, MAX_P)


class Runner:
    """One subtask run task by task through acquire/keep, in memory or on a store."""

    def __init__(self, local: HostStoreSettings | None) -> None:
        self.storage = InMemoryChangelogStorage()
        self.snapshots = InMemorySnapshotStore()
        self.local = local
        self.handles: dict[int, KeyedStateHandle] = {}
        self.cached: CachedBackend | None = None

    def acquire(self, base: int | None, placement: SubtaskPlacement = ONE,
                cached: CachedBackend | None = None) -> AcquiredBackend:
        handles = [self.handles[base]] if base is not None else []
        return acquire(placement, base, handles, cached, self.storage, self.snapshots, NEVER,
                       self.local)

    def task(self, checkpoint_id: int, base: int | None, values: dict[str, int],
             use_cache: bool = True) -> StateSource:
        """Acquire at ``base``, write ``values``, snapshot, keep: the source it had."""
        acquired = self.acquire(base, cached=self.cached if use_cache else None)
        self.cached = None
        backend = acquired.backend
        for key, value in values.items():
            backend.set_current_key(key.encode())
            backend.state(V).update(value)
        handle = backend.snapshot(checkpoint_id).result(10)
        self.handles[checkpoint_id] = handle
        encoded = SubtaskState("op", 0, 1, handle, None).to_bytes()
        self.cached = keep(acquired, checkpoint_id, encoded)
        return acquired.source

    def state_at(self, base: int, keys: list[str]) -> dict[str, int | None]:
        """The values of ``keys`` in a backend acquired at ``base`` (then discarded)."""
        acquired = self.acquire(base)
        try:
            found = {}
            for key in keys:
                acquired.backend.set_current_key(key.encode())
                found[key] = acquired.backend.state(V).value()
            return found
        finally:
            discard(acquired)

    def close(self) -> None:
        if self.cached is not None:
            self.cached.backend.close()
        self.storage.close()


@pytest.fixture(params=["memory", "host-store"])
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runner]:
    local = HostStoreSettings(tmp_path / "local") if request.param == "host-store" else None
    runner = Runner(local)
    yield runner
    runner.close()


def test_fresh_then_the_kept_backend_is_reattached(runner: Runner) -> None:
    assert runner.task(1, None, {"a": 1}) is StateSource.FRESH
    assert runner.task(2, 1, {"b": 2}) is StateSource.REATTACHED
    assert runner.state_at(2, ["a", "b"]) == {"a": 1, "b": 2}


def test_a_kept_backend_not_at_the_base_is_closed_and_the_base_restored(
    runner: Runner,
) -> None:
    runner.task(1, None, {"a": 1})
    runner.task(2, 1, {"a": 2})
    # A re-run of batch 2 (its checkpoint never completed): the kept backend is at 2.
    source = runner.task(2, 1, {"b": 3})
    expected = StateSource.RESTORED if runner.local is None else StateSource.ROLLED_BACK
    assert source is expected
    assert runner.state_at(2, ["a", "b"]) == {"a": 1, "b": 3}


def test_without_the_kept_backend_memory_restores_and_a_store_is_reattached(
    runner: Runner,
) -> None:
    runner.task(1, None, {"a": 1})
    source = runner.task(2, 1, {"b": 2}, use_cache=False)
    expected = StateSource.RESTORED if runner.local is None else StateSource.REATTACHED_LOCAL
    assert source is expected
    assert runner.state_at(2, ["a", "b"]) == {"a": 1, "b": 2}


def test_another_parallelism_restores_its_key_groups(runner: Runner) -> None:
    keys = [f"k{i}" for i in range(40)]
    runner.task(1, None, {k: i for i, k in enumerate(keys)})
    seen: dict[str, int | None] = {}
    for subtask in range(3):
        placement = SubtaskPlacement("app", "op", subtask, 3, MAX_P)
        handle = runner.handles[1]
        acquired = acquire(placement, 1, [handle], None, runner.storage, runner.snapshots,
                           NEVER, runner.local)
        assert acquired.source is StateSource.RESTORED
        mine = [k for k in keys
                if placement.key_groups.contains(key_group_for_key(k.encode(), MAX_P))]
        for key in mine:
            acquired.backend.set_current_key(key.encode())
            seen[key] = acquired.backend.state(V).value()
        discard(acquired)
    assert seen == {k: i for i, k in enumerate(keys)}


def test_a_discarded_store_is_restored_not_reattached(tmp_path: Path) -> None:
    runner = Runner(HostStoreSettings(tmp_path / "local"))
    try:
        runner.task(1, None, {"a": 1})
        failed = runner.acquire(1, cached=runner.cached)
        runner.cached = None
        failed.backend.set_current_key(b"a")
        failed.backend.state(V).update(99)  # a failed task's change: never seen again
        discard(failed)
        again = runner.acquire(1)
        assert again.source is StateSource.ROLLED_BACK
        again.backend.set_current_key(b"a")
        assert again.backend.state(V).value() == 1
        discard(again)
    finally:
        runner.close()
