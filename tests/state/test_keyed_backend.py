"""The keyed state backend over the in-memory storage and snapshot store (pure logic)."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from kafka_changelog import (
    InMemoryChangelogStorage,
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    SequenceNumberOutOfRangeError,
)
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.errors import (
    MaterializationFailedError,
    NoCurrentKeyError,
    StateMismatchError,
)
from kafka_changelog.state.schema.descriptors import list_state, value_state
from kafka_changelog.state.schema.serializers import INT64, JSON, UTF8
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

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


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


@pytest.fixture
def store() -> InMemorySnapshotStore:
    return InMemorySnapshotStore()


def backend_for(storage: Any, store: Any, key_groups: KeyGroupRange | None = None,
                **kwargs: Any) -> ChangelogKeyedStateBackend:
    return ChangelogKeyedStateBackend(storage, store, "op", key_groups or KeyGroupRange.of(0, 127),
                                      MAX_P, **kwargs)


def drive(backend: ChangelogKeyedStateBackend, model: dict[bytes, Any], rng: random.Random,
          events: int, users: list[bytes]) -> None:
    for _ in range(events):
        user = rng.choice(users)
        page, amount = rng.choice(PAGES), rng.choice([0, 1, 5, 13, 40])
        apply_event(backend, user, page, amount)
        model_apply(model, user, page, amount)


def test_state_kinds_read_what_was_written(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store)
    model: dict[bytes, Any] = {}
    drive(backend, model, random.Random(1), 500, USERS)
    for user in USERS:
        assert read_user(backend, user) == expected_for(model, [user])[user]
    backend.close()


def test_state_needs_a_current_key_in_range(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store, KeyGroupRange.of(0, 63))
    with pytest.raises(NoCurrentKeyError, match="set_current_key"):
        backend.state(value_state("v")).value()
    outside = next(u for u in USERS if u not in users_in(USERS, KeyGroupRange.of(0, 63)))
    with pytest.raises(KeyGroupOutOfRangeError, match=r"outside .*\[0, 63\]"):
        backend.set_current_key(outside)
    backend.close()


def test_checkpoint_restores_exactly_with_and_without_materialization(
    storage: Any, store: Any
) -> None:
    rng = random.Random(2)
    model: dict[bytes, Any] = {}
    backend = backend_for(storage, store)
    drive(backend, model, rng, 300, USERS)
    backend.materialize_now()
    drive(backend, model, rng, 200, USERS)
    handle = backend.snapshot(1).result(10)
    backend.notify_checkpoint_complete(1)
    drive(backend, copy.deepcopy(model), rng, 50, USERS)  # after the checkpoint: not restored
    assert handle.snapshot is not None
    restored = restore_backend(
        storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    assert {u: read_user(restored, u) for u in USERS} == expected_for(model, USERS)
    # Same range: the restored backend adopts the base instead of rewriting it.
    assert restored.backend_id == handle.backend_id
    assert restored.snapshot_handle == handle.snapshot
    backend.close()
    restored.close()


@pytest.mark.parametrize("path", [[1, 4, 2, 3], [3, 1], [2, 5, 1]])
def test_rescaling_follows_key_groups(storage: Any, store: Any, path: list[int]) -> None:
    rng = random.Random(sum(path))
    model: dict[bytes, Any] = {}
    handles = []
    backends = [backend_for(storage, store, r) for r in ranges(path[0])]
    for checkpoint, parallelism in enumerate(path, start=1):
        if checkpoint > 1:
            backends = [restore_backend(
                storage, store, "op", r, MAX_P, handles) for r in ranges(parallelism)]
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


def test_serializer_mismatch_on_restore_is_refused(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store)
    backend.set_current_key(b"k")
    backend.state(value_state("v", INT64)).update(7)
    handle = backend.snapshot(1).result(10)
    restored = restore_backend(
        storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    restored.set_current_key(b"k")
    with pytest.raises(StateMismatchError) as caught:
        restored.state(value_state("v", JSON))
    assert "'v'" in str(caught.value) and "'int64'" in str(caught.value)
    assert "'json'" in str(caught.value)
    with pytest.raises(StateMismatchError, match="registered as VALUE"):
        restored.state(list_state("v", INT64))
    assert restored.state(value_state("v", INT64)).value() == 7


def test_materialization_truncates_and_bounds_the_tail(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store)
    rng = random.Random(3)
    drive(backend, {}, rng, 400, USERS)
    before = backend.snapshot(1).result(10)
    assert sum(h.state_size for h in before.changelog) > 0
    backend.materialize_now()
    after = backend.snapshot(2).result(10)
    # Nothing changed since the materialization: the checkpoint's log holds registrations only.
    assert all(c.is_meta for h in after.changelog for c in storage.reader().read(h))
    assert after.materialization_id > before.materialization_id
    with pytest.raises(SequenceNumberOutOfRangeError):
        backend.writer.persist(backend.writer.initial_sequence_number(), 3)
    backend.close()


def test_materialization_is_skipped_when_nothing_changed(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store)
    assert backend.materialize() is None
    backend.set_current_key(b"a")
    backend.state(value_state("v", UTF8)).update("x")
    first = backend.materialize()
    assert first is not None
    assert backend.materialize() is None or first.done()  # one in flight at most
    backend.materialize_now()
    assert backend.materialize() is None
    assert backend.materialization_stats.completed == 1
    assert backend.materialization_stats.skipped >= 2
    backend.close()


class FlakyStore(InMemorySnapshotStore):
    """Fails the first ``failures`` writes."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def begin_write(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise OSError("snapshot topic unavailable")
        return super().begin_write(*args, **kwargs)


def _failing_round(backend: ChangelogKeyedStateBackend) -> None:
    backend.set_current_key(b"a")
    backend.state(value_state("v", UTF8)).update("x")
    future: Future[Any] | None = backend.materialize()
    assert future is not None
    future.exception(10)
    backend.poll_materialization()


def test_failures_are_tolerated_then_surfaced(storage: Any) -> None:
    store = FlakyStore(failures=10)
    backend = backend_for(storage, store,
                          materialization=MaterializationConfig(None, 0, max_failures_allowed=2))
    _failing_round(backend)
    _failing_round(backend)
    assert backend.materialization_stats.failed_in_a_row == 2
    backend.snapshot(1).result(10)  # still fine: two failures are allowed
    _failing_round(backend)
    with pytest.raises(MaterializationFailedError, match="failed 3 times in a row") as caught:
        backend.snapshot(2)
    assert "snapshot topic unavailable" in str(caught.value)


def test_success_resets_the_failure_count(storage: Any) -> None:
    store = FlakyStore(failures=2)
    backend = backend_for(storage, store,
                          materialization=MaterializationConfig(None, 0, max_failures_allowed=2))
    _failing_round(backend)
    _failing_round(backend)
    assert backend.materialize_now() is not None
    assert backend.materialization_stats.failed_in_a_row == 0
    # The key group changed during the failed rounds is in the snapshot after all.
    handle = backend.snapshot(1).result(10)
    assert handle.snapshot is not None and handle.snapshot.chunks
    restored = restore_backend(
        storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    restored.set_current_key(b"a")
    assert restored.state(value_state("v", UTF8)).value() == "x"
    restored.close()


def test_periodic_timer_triggers_materialization(storage: Any, store: Any) -> None:
    backend = backend_for(storage, store, materialization=MaterializationConfig(0.05, 0.0))
    backend.set_current_key(b"a")
    backend.state(value_state("v", UTF8)).update("x")
    import time

    deadline = time.monotonic() + 10
    while backend.materialization_stats.completed == 0 and time.monotonic() < deadline:
        time.sleep(0.06)
        backend.set_current_key(b"a")  # the operator thread acts on the timer's flag
    assert backend.materialization_stats.completed >= 1
    backend.close()


def test_adopted_log_is_materialized_before_it_is_dropped(storage: Any, store: Any) -> None:
    """Restore (same range) from a checkpoint that has no snapshot, touch one key group,
    materialize, checkpoint: the key groups only the adopted log held must survive."""
    model: dict[bytes, Any] = {}
    first = backend_for(storage, store)
    drive(first, model, random.Random(9), 200, USERS)
    handle = first.snapshot(1).result(10)
    assert handle.snapshot is None
    second = restore_backend(
        storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    assert second.backend_id == handle.backend_id  # adopted
    apply_event(second, USERS[0], "home", 1)
    model_apply(model, USERS[0], "home", 1)
    second.materialize_now()
    later = second.snapshot(2).result(10)
    third = restore_backend(
        storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [later])
    assert {u: read_user(third, u) for u in USERS} == expected_for(model, USERS)
    for b in (first, second, third):
        b.close()


@pytest.mark.parametrize("key_groups", [KeyGroupRange.of(0, 127), KeyGroupRange.of(0, 63)])
def test_logged_counts_are_what_the_next_checkpoint_persists_after_a_restore(
    storage: Any, store: Any, key_groups: KeyGroupRange
) -> None:
    """Adopted (same range) or rescaled: the registrations a restore logs are counted when
    its next checkpoint persists them, not when its own materialization drops them."""
    first = backend_for(storage, store)
    drive(first, {}, random.Random(4), 100, USERS)
    handle = first.snapshot(1).result(10)
    restored = restore_backend(storage, store, "op", key_groups, MAX_P, [handle])
    drive(restored, {}, random.Random(5), 50, users_in(USERS, key_groups))
    later = restored.snapshot(2).result(10)
    persisted = list(storage.reader().read(later.changelog[-1]))
    assert restored.take_logged() == (len(persisted), sum(len(c.payload) for c in persisted))
    first.close()
    restored.close()
