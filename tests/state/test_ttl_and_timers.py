"""State TTL and timers in the keyed backend: exact expiry, removal as logged changes,
timers that fire once and follow their key groups (in-memory storages; both tables)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
from kafka_changelog.state import StateTtl
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.errors import StateMismatchError
from kafka_changelog.state.schema.descriptors import (
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from kafka_changelog.state.schema.serializers import INT64, UTF8
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.time.timers import TIMERS_STATE, TimeDomain

from .state_helpers import MAX_P

ALL = KeyGroupRange.of(0, MAX_P - 1)
SEEN = value_state("seen", INT64, ttl=timedelta(seconds=10))
PAGES = list_state("pages", UTF8, ttl=10)
KINDS = map_state("kinds", UTF8, INT64, ttl=timedelta(seconds=10))
TOTAL = reducing_state("total", lambda a, b: a + b, INT64, ttl=10)
COUNT = aggregating_state("count", lambda: 0, lambda acc, _v: acc + 1, INT64, ttl=10)
T0 = 1_700_000_000_000


class Backends:
    def __init__(self, kind: str, directory: Path) -> None:
        self.storage = InMemoryChangelogStorage()
        self.snapshots = InMemorySnapshotStore()
        self.config = StateBackendConfig(kind, str(directory))

    def new(self, key_groups: KeyGroupRange = ALL) -> ChangelogKeyedStateBackend:
        return ChangelogKeyedStateBackend(self.storage, self.snapshots, "op", key_groups,
                                          MAX_P, table=self.config.create_table())

    def restore(self, backend: ChangelogKeyedStateBackend, checkpoint_id: int,
                key_groups: KeyGroupRange = ALL) -> ChangelogKeyedStateBackend:
        handle = backend.snapshot(checkpoint_id).result(10)
        return restore_backend(self.storage, self.snapshots, "op", key_groups, MAX_P, [handle],
                               table=self.config.create_table())


@pytest.fixture(params=["memory", "rocksdb"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backends]:
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    made = Backends(request.param, tmp_path)
    yield made
    made.storage.close()


def at(backend: ChangelogKeyedStateBackend, ms: int, key: str = "u") -> None:
    backend.set_processing_time(T0 + ms)
    backend.set_current_key(key.encode())


def test_each_kind_expires_ttl_after_its_last_write(backends: Backends) -> None:
    backend = backends.new()
    at(backend, 0)
    backend.state(SEEN).update(1)
    backend.state(PAGES).add("/a")
    backend.state(KINDS).put("view", 1)
    backend.state(TOTAL).add(5)
    backend.state(COUNT).add("x")
    at(backend, 6_000)
    backend.state(PAGES).add("/b")
    backend.state(KINDS).put("buy", 2)
    backend.state(TOTAL).add(1)  # a write: its expiry starts again
    at(backend, 9_999)
    assert backend.state(SEEN).value() == 1
    assert backend.state(PAGES).get() == ["/a", "/b"]
    at(backend, 10_000)  # exactly at the expiry: gone
    assert backend.state(SEEN).value() is None
    assert backend.state(PAGES).get() == ["/b"]
    assert dict(backend.state(KINDS).items()) == {"buy": 2}
    assert backend.state(KINDS).get("view") is None
    assert backend.state(TOTAL).get() == 6
    assert backend.state(COUNT).get() is None
    at(backend, 16_000)
    assert backend.state(TOTAL).get() is None
    assert backend.state(PAGES).get() == []
    assert backend.state(KINDS).is_empty()
    backend.close()


def test_state_ttl_is_importable_where_the_docs_name_it() -> None:
    """docs/state.md and docs/time.md name ``StateTtl`` beside ``value_state``, which
    their examples import from ``kafka_changelog.state``."""
    import kafka_changelog.state as state
    from kafka_changelog.state.schema import ttl

    assert "StateTtl" in state.__all__
    assert state.StateTtl is ttl.StateTtl is StateTtl
    assert value_state("seen", INT64, ttl=StateTtl(1_000, update_on_read=True)).ttl == \
        StateTtl(1_000, True)


def test_update_on_read_refreshes_the_expiry() -> None:
    with InMemoryChangelogStorage() as storage:
        backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL, MAX_P)
        touched = value_state("touched", INT64, ttl=StateTtl(10_000, update_on_read=True))
        at(backend, 0)
        backend.state(touched).update(7)
        at(backend, 9_000)
        assert backend.state(touched).value() == 7
        at(backend, 18_000)
        assert backend.state(touched).value() == 7
        at(backend, 28_000)
        assert backend.state(touched).value() is None
        backend.close()


def test_expired_entries_nobody_reads_are_removed_by_expiry_timers(backends: Backends) -> None:
    backend = backends.new()
    users = [f"user-{i}" for i in range(50)]
    for i, user in enumerate(users):
        at(backend, i * 100, user)
        backend.state(SEEN).update(i)
        backend.state(PAGES).add(f"/{i}")
    at(backend, 5_000, users[0])
    backend.state(SEEN).update(99)  # refreshed: lives until 15 000
    assert backend.state_rows() >= 100
    backend.set_processing_time(T0 + 10_000 + 2_400)  # users 0..24 expired, 0 refreshed
    backend.expire_due()
    survivors = {users[0]} | set(users[25:])
    seen = {key.decode() for kg in backend.table.key_groups()
            for name, key, _ in backend.table.entries(kg) if name == "seen"}
    assert seen == survivors
    pages = {key.decode() for kg in backend.table.key_groups()
             for name, key, _ in backend.table.entries(kg) if name == "pages"}
    assert pages == set(users[25:])
    # A restore sees exactly the state the backend had (the removals were logged).
    restored = backends.restore(backend, 1)
    restored.set_processing_time(T0 + 12_400)
    for user in users:
        restored.set_current_key(user.encode())
        assert (restored.state(SEEN).value() is not None) == (user in survivors), user
    # The refreshed key's timer was moved on, not lost.
    restored.set_processing_time(T0 + 15_000)
    restored.expire_due()
    seen_after = {key.decode() for kg in restored.table.key_groups()
                  for name, key, _ in restored.table.entries(kg) if name == "seen"}
    assert seen_after == set()  # the last original expired at 14 900, the refreshed at 15 000
    backend.close()
    restored.close()


def test_timers_fire_once_in_order_and_follow_their_key_groups(backends: Backends) -> None:
    backend = backends.new()
    for i, user in enumerate(["c", "a", "b", "d"]):
        at(backend, 0, user)
        backend.timers.register(TimeDomain.PROCESSING_TIME, T0 + 1_000 * (i % 2))
        backend.timers.register(TimeDomain.EVENT_TIME, T0 + 500)
    at(backend, 0, "d")
    backend.timers.delete(TimeDomain.PROCESSING_TIME, T0 + 1_000)
    assert [t.time_ms for t in backend.timers.of_current_key()] == [T0 + 500]
    # Rescaled to two subtasks: each fires the timers of its own key groups.
    half = MAX_P // 2
    ranges = [KeyGroupRange.of(0, half - 1), KeyGroupRange.of(half, MAX_P - 1)]
    handle = backend.snapshot(1).result(10)
    fired: list[tuple[str, int]] = []
    for key_groups in ranges:
        part = restore_backend(backends.storage, backends.snapshots, "op", key_groups, MAX_P,
                               [handle], table=backends.config.create_table())
        due = part.due_timers(TimeDomain.PROCESSING_TIME, T0 + 1_000)
        fired += [(t.key.decode(), t.time_ms - T0) for t in due]
        assert part.due_timers(TimeDomain.PROCESSING_TIME, T0 + 1_000) == []  # once
        assert all(key_groups.contains(key_group_for_key(t.key, MAX_P)) for t in due)
        part.close()
    assert sorted(fired) == [("a", 1_000), ("b", 0), ("c", 0)]
    event = backend.due_timers(TimeDomain.EVENT_TIME, T0 + 499)
    assert event == []
    event = backend.due_timers(TimeDomain.EVENT_TIME, T0 + 500)
    assert sorted(t.key for t in event) == [b"a", b"b", b"c", b"d"]
    backend.close()


def test_adding_a_ttl_to_a_state_is_refused_naming_it(backends: Backends) -> None:
    backend = backends.new()
    at(backend, 0)
    backend.state(value_state("seen", INT64)).update(1)
    restored = backends.restore(backend, 1)
    with pytest.raises(StateMismatchError, match="'seen' was written without a TTL"):
        restored.state(SEEN)
    backend.close()
    restored.close()


def test_a_changed_ttl_duration_applies_from_the_next_write(backends: Backends) -> None:
    backend = backends.new()
    at(backend, 0)
    backend.state(SEEN).update(1)
    restored = backends.restore(backend, 1)
    longer = value_state("seen", INT64, ttl=timedelta(seconds=60))
    at(restored, 5_000)
    assert restored.state(longer).value() == 1  # written with 10 s: lives until 10 000
    restored.state(longer).update(2)
    at(restored, 30_000)
    assert restored.state(longer).value() == 2
    backend.close()
    restored.close()


@pytest.mark.parametrize("ttl", [0, -1, timedelta(0), timedelta(seconds=-5)])
def test_a_ttl_that_is_not_positive_is_refused_naming_the_state(ttl: object) -> None:
    with pytest.raises(ValueError, match="state 'seen': ttl must be positive"):
        value_state("seen", INT64, ttl=ttl)  # type: ignore[arg-type]


def test_the_timers_state_name_is_reserved() -> None:
    with InMemoryChangelogStorage() as storage:
        backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL, MAX_P)
        backend.set_current_key(b"u")
        with pytest.raises(StateMismatchError, match="reserved for timers"):
            backend.state(value_state(TIMERS_STATE))
        backend.close()


def test_bulk_access_to_ttl_states_sees_and_logs_what_per_key_access_does(
    backends: Backends,
) -> None:
    from kafka_changelog.state.backend.bulk_state import BulkState

    users = ["a", "b", "c"]
    per_key, bulk = backends.new(), backends.new()
    for backend in (per_key, bulk):
        backend.set_processing_time(T0)
    for user, n in zip(users, [1, 2, 3], strict=True):
        per_key.set_current_key(user.encode())
        per_key.state(SEEN).update(n)
        per_key.state(KINDS).put("view", n)
        per_key.state(PAGES).add(f"/{n}")
    view = BulkState(bulk, users, [u.encode() for u in users])
    view.value(SEEN).set(users, [1, 2, 3])
    view.map(KINDS).put(users, "view", [1, 2, 3])
    view.list(PAGES).add(users, ["/1", "/2", "/3"])
    for backend in (per_key, bulk):
        backend.set_processing_time(T0 + 5_000)
    per_key.set_current_key(b"b")
    per_key.state(SEEN).update(20)
    BulkState(bulk, ["b"], [b"b"]).value(SEEN).set(["b"], [20])
    for backend in (per_key, bulk):
        backend.set_processing_time(T0 + 12_000)
    again = BulkState(bulk, users, [u.encode() for u in users])
    assert again.value(SEEN).get(users) == [None, 20, None]
    assert again.map(KINDS).get(users, "view") == [None, None, None]
    assert again.list(PAGES).get(users) == [[], [], []]
    per_key.set_current_key(b"b")
    assert per_key.state(SEEN).value() == 20
    per_key.expire_due()
    bulk.expire_due()
    rows = [sorted((n, k) for kg in b.table.key_groups() for n, k, _ in b.table.entries(kg))
            for b in (per_key, bulk)]
    assert rows[0] == rows[1]
    assert [n for n, _ in rows[0] if n != TIMERS_STATE] == ["seen"]
    per_key.close()
    bulk.close()


def test_expired_state_leaves_the_store_and_the_snapshots_under_churn(tmp_path: Path) -> None:
    """50 batches of churn over new keys with a TTL: the RocksDB store and the snapshot
    hold only what lives, not what expired."""
    pytest.importorskip("rocksdict")
    backends = Backends("rocksdb", tmp_path)
    backend = backends.new()
    live_counts, snapshot_entries = [], []
    for batch in range(50):
        backend.set_processing_time(T0 + batch * 1_000)
        for i in range(100):  # 100 new keys a batch, each living 10 batches
            backend.set_current_key(f"b{batch}-k{i}".encode())
            backend.state(SEEN).update(batch)
            backend.state(PAGES).add(f"/{i}")
        backend.expire_due()
        live_counts.append(backend.state_rows())
        if batch % 10 == 9:
            backend.materialize_now()
            handle = backend.snapshot(batch + 1).result(10)
            restored = restore_backend(backends.storage, backends.snapshots, "op", ALL,
                                       MAX_P, [handle], table=backends.config.create_table())
            snapshot_entries.append(restored.state_rows())
            restored.close()
            backend.notify_checkpoint_complete(batch + 1)
    # From batch 10 on, 10 batches of keys live: 1,000 keys x (seen, pages, and two
    # timers: one expiry timer per state, each an entry of the key's timers map).
    assert live_counts[9:] == [4_000] * 41
    assert snapshot_entries == [4_000] * 5
    table = backend.table
    stored = sum(1 for kg in table.key_groups() for _ in table.entries(kg))
    assert stored == 3_000
    backend.close()
    backends.storage.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_timers_written_in_bulk_are_the_timers_per_key_calls_write(kind: str,
                                                                   tmp_path: Path) -> None:
    """``register_many``/``delete_many`` (the vectorised function's bulk timers) leave the
    same timers state, restore to the same timers and fire the same timers in the same
    order as ``register``/``delete`` key by key, repeats and absent timers included."""
    users = ["c", "a", "b", "d", "a", "e"]  # "a" twice: its second timer is a repeat
    times = [T0 + 1_000 * (i % 2) for i in range(len(users))]
    times[4] = times[1]
    # "b" has no timer at T0 + 7 and "x" none at all: nothing is logged for them.
    gone = ["d", "b", "x"]
    gone_times = [times[3], T0 + 7, T0]
    handles, fired = [], []
    for variant in ("per-key", "bulk"):
        backends = Backends(kind, tmp_path / variant)
        backend = backends.new()
        if variant == "per-key":
            for user, when in zip(users, times, strict=True):
                backend.set_current_key(user.encode())
                backend.timers.register(TimeDomain.PROCESSING_TIME, when)
                backend.timers.register(TimeDomain.EVENT_TIME, when + 5)
            for user, when in zip(gone, gone_times, strict=True):
                backend.set_current_key(user.encode())
                backend.timers.delete(TimeDomain.PROCESSING_TIME, when)
        else:
            keys = [user.encode() for user in users]
            groups = [key_group_for_key(key, MAX_P) for key in keys]
            backend.timers.register_many(TimeDomain.PROCESSING_TIME, groups, keys, times)
            backend.timers.register_many(TimeDomain.EVENT_TIME, groups, keys,
                                         [t + 5 for t in times])
            keys = [user.encode() for user in gone]
            backend.timers.delete_many(TimeDomain.PROCESSING_TIME,
                                       [key_group_for_key(k, MAX_P) for k in keys], keys,
                                       gone_times)
        handles.append(sorted(
            (k, bytes(m)) for kg in backend.table.key_groups()
            for n, k, entry in backend.table.entries(kg) if n == TIMERS_STATE
            for m in entry))
        restored = backends.restore(backend, 1)
        fired.append([(t.key, t.time_ms, t.domain) for domain in TimeDomain
                      if domain is not TimeDomain.EXPIRY
                      for t in restored.due_timers(domain, T0 + 2_000)])
        restored.close()
        backend.close()
    assert handles[0] == handles[1] and len(handles[0]) == 2 * 5 - 1  # d's deleted
    assert fired[0] == fired[1]
    processing = [(k, t - T0) for k, t, d in fired[0] if d is TimeDomain.PROCESSING_TIME]
    assert sorted(processing) == [(b"a", 1_000), (b"b", 0), (b"c", 0), (b"e", 1_000)]
    assert [t for _, t in processing] == [0, 0, 1_000, 1_000]  # by time first


def test_bulk_timers_refuse_columns_of_different_lengths() -> None:
    backend = Backends("memory", Path("/nonexistent")).new()
    with pytest.raises(ValueError, match="timers: 2 keys, 1 key groups and 2 times"):
        backend.timers.register_many(TimeDomain.EVENT_TIME, [0], [b"a", b"b"], [T0, T0])
    backend.close()


def test_bulk_timers_delete_on_a_restored_backend(backends: Backends) -> None:
    backend = backends.new()
    backend.set_current_key(b"a")
    backend.timers.register(TimeDomain.EVENT_TIME, T0)
    restored = backends.restore(backend, 1)
    group = key_group_for_key(b"a", MAX_P)
    restored.timers.delete_many(TimeDomain.EVENT_TIME, [group], [b"a"], [T0])
    assert restored.due_timers(TimeDomain.EVENT_TIME, T0) == []
    restored.close()
    backend.close()
