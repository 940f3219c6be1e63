"""The current key's buffered changes: reads see them, the working copy and the log get
their net effect (pure logic, no broker)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.errors import NoCurrentKeyError, StateMismatchError
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import (
    StateKind,
    list_state,
    map_state,
    value_state,
)
from kafka_changelog.state.schema.ops import (
    DELETE,
    LIST_ADD,
    LIST_REPLACE,
    MAP_PUT,
    MAP_REMOVE,
    SET,
    OpKind,
    StateMeta,
    StateOp,
)
from kafka_changelog.state.schema.serializers import INT64, UTF8
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.tables.key_buffer import KeyChangeBuffer
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

from .state_helpers import MAX_P

KEYS = [b"alice", b"bob", b"carol"]
MAP_KEYS = [b"home", b"cart", b"item"]
STATES = {"v": StateKind.VALUE, "l": StateKind.LIST, "m": StateKind.MAP}


def registered(table: KeyedStateTable) -> KeyedStateTable:
    for name, kind in STATES.items():
        table.register(StateMeta(name, kind, "bytes", "bytes" if kind is StateKind.MAP else None))
    return table


@pytest.fixture(params=["memory", "rocksdb"])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        tuple[KeyedStateTable, KeyedStateTable]]:
    """(the table the buffer writes to, the reference that gets every op at once)."""
    if request.param == "memory":
        pair: tuple[KeyedStateTable, KeyedStateTable] = (StateTable(), StateTable())
    else:
        pair = (RocksDBStateTable(tmp_path / "buffered"), RocksDBStateTable(tmp_path / "ref"))
    yield registered(pair[0]), registered(pair[1])
    for table in pair:
        table.close()


def random_write(rng: random.Random) -> tuple[str, OpKind, bytes | None, bytes | None,
                                              tuple[bytes, ...] | None]:
    state = rng.choice(list(STATES))
    value = str(rng.randint(0, 99)).encode()
    if state == "v":
        return (state, SET, None, value, None) if rng.random() < 0.8 else (
            state, DELETE, None, None, None)
    if state == "l":
        items = tuple(str(rng.randint(0, 9)).encode() for _ in range(rng.randint(0, 3)))
        op = rng.choices([LIST_ADD, LIST_REPLACE, DELETE], weights=[6, 2, 1])[0]
        if op is LIST_ADD and not items:
            items = (b"x",)  # the state objects never log an empty add
        return state, op, None, None, None if op is DELETE else items
    op = rng.choices([MAP_PUT, MAP_REMOVE, DELETE], weights=[6, 3, 1])[0]
    map_key = None if op is DELETE else rng.choice(MAP_KEYS)
    return state, op, map_key, value if op is MAP_PUT else None, None


@pytest.mark.parametrize("seed", range(8))
def test_reads_and_the_table_are_as_if_every_change_was_applied_at_once(
        tables: tuple[KeyedStateTable, KeyedStateTable], seed: int) -> None:
    table, reference = tables
    emitted: list[tuple[int, StateOp]] = []

    def emit(key_group: int, op: StateOp) -> None:
        emitted.append((key_group, op))
        table.apply(key_group, op)

    buffer = KeyChangeBuffer(table, emit)
    rng = random.Random(seed)
    writes = 0
    for _ in range(60):  # 60 current keys in turn, a few changes each
        key = rng.choice(KEYS)
        key_group = KEYS.index(key)
        buffer.switch(key_group, key)
        for _ in range(rng.randint(0, 12)):
            state, op, map_key, value, values = random_write(rng)
            buffer.write(state, op, map_key, value, values)
            reference.apply(key_group, StateOp(state, op, key, map_key, value, values))
            writes += 1
            for name in STATES:
                assert buffer.read(name) == reference.get(key_group, name, key), (name, key)
            for map_key in MAP_KEYS:
                assert (buffer.read_map_value("m", map_key)
                        == reference.get_map_value(key_group, "m", key, map_key))
    buffer.flush()
    assert not buffer.pending
    for key_group in range(len(KEYS)):
        assert table.serialize_group(key_group) == reference.serialize_group(key_group)
    assert table.entry_count() == reference.entry_count()
    # Net changes: never more ops than changes; replayed alone, they give the same table.
    assert len(emitted) <= writes
    replayed = registered(StateTable())
    for key_group, op in emitted:
        replayed.apply(key_group, StateOp.from_bytes(op.to_bytes()))
    for key_group in range(len(KEYS)):
        assert replayed.serialize_group(key_group) == reference.serialize_group(key_group)


def test_a_key_changed_per_event_logs_one_change_per_state() -> None:
    table = registered(StateTable())
    emitted: list[StateOp] = []
    buffer = KeyChangeBuffer(table, lambda kg, op: (emitted.append(op), table.apply(kg, op)))
    buffer.switch(0, b"alice")
    for i in range(10):
        buffer.write("v", SET, value=str(i).encode())
        buffer.write("l", LIST_ADD, values=(str(i).encode(),))
        buffer.write("m", MAP_PUT, map_key=b"home", value=str(i).encode())
    buffer.switch(1, b"bob")
    assert [(op.state, op.op) for op in emitted] == [("v", SET), ("l", LIST_ADD), ("m", MAP_PUT)]
    assert emitted[0].value == b"9"
    assert emitted[1].values == tuple(str(i).encode() for i in range(10))
    assert table.get(0, "m", b"alice") == {b"home": b"9"}


def test_without_a_current_key_reads_and_writes_are_refused() -> None:
    buffer = KeyChangeBuffer(registered(StateTable()), lambda kg, op: None)
    with pytest.raises(NoCurrentKeyError):
        buffer.read("v")
    with pytest.raises(NoCurrentKeyError):
        buffer.write("v", SET, value=b"1")


def test_clearing_an_unregistered_state_names_it() -> None:
    buffer = KeyChangeBuffer(registered(StateTable()), lambda kg, op: None)
    buffer.switch(0, b"alice")
    with pytest.raises(StateMismatchError, match="'nope'"):
        buffer.write("nope", DELETE)


# -- through the backend -----------------------------------------------------------------------

COUNT = value_state("count", INT64)
PAGES = list_state("pages", UTF8)
KINDS = map_state("kinds", UTF8, INT64)


def new_backend(storage: Any, store: Any) -> ChangelogKeyedStateBackend:
    return ChangelogKeyedStateBackend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P)


def test_a_checkpoint_holds_the_current_keys_changes_without_a_key_switch() -> None:
    storage, store = InMemoryChangelogStorage(), InMemorySnapshotStore()
    backend = new_backend(storage, store)
    backend.set_current_key(b"alice")
    for page in ["home", "cart", "home"]:
        backend.state(COUNT).update((backend.state(COUNT).value() or 0) + 1)
        backend.state(PAGES).add(page)
        backend.state(KINDS).put(page, (backend.state(KINDS).get(page) or 0) + 1)
    handle = backend.snapshot(1).result(10)
    # The 3 registrations, then per state one net change (per map key for the map).
    assert backend.take_logged()[0] == 3 + 1 + 1 + 2
    backend.set_current_key(b"alice")
    backend.state(COUNT).update(100)  # after the checkpoint: not in it
    restored = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle])
    try:
        restored.set_current_key(b"alice")
        assert restored.state(COUNT).value() == 3
        assert restored.state(PAGES).get() == ["home", "cart", "home"]
        assert dict(restored.state(KINDS).items()) == {"cart": 1, "home": 2}
    finally:
        restored.close()
        backend.close()
        storage.close()


def test_the_table_and_entry_counts_include_the_current_keys_changes() -> None:
    storage, store = InMemoryChangelogStorage(), InMemorySnapshotStore()
    backend = new_backend(storage, store)
    try:
        backend.set_current_key(b"alice")
        backend.state(COUNT).update(1)
        backend.state(KINDS).put("home", 1)
        assert backend.state_rows() == 2
        backend.state(KINDS).clear()
        assert backend.table.get(backend.current()[0], "kinds", b"alice") is None
        assert backend.state_rows() == 1
    finally:
        backend.close()
        storage.close()


def test_bulk_calls_see_the_per_key_changes_made_before_them() -> None:
    from kafka_changelog.state.backend.bulk_state import BulkState

    storage, store = InMemoryChangelogStorage(), InMemorySnapshotStore()
    backend = new_backend(storage, store)
    try:
        bulk = BulkState(backend, ["ann", "bob"], [b"ann", b"bob"])
        counts = bulk.value(COUNT)
        backend.set_current_key(b"ann")
        backend.state(COUNT).update(7)  # buffered: ann is still the current key
        assert counts.get(["ann", "bob"], 0) == [7, 0]
        counts.set(["ann"], [8])
        assert backend.state(COUNT).value() == 8
    finally:
        backend.close()
        storage.close()


def test_the_current_keys_group_counts_as_changed_before_a_key_switch() -> None:
    storage, store = InMemoryChangelogStorage(), InMemorySnapshotStore()
    backend = new_backend(storage, store)
    try:
        backend.set_current_key(b"ann")
        backend.state(COUNT).update(1)
        assert backend.unmaterialized_key_groups() == {backend.current()[0]}
    finally:
        backend.close()
        storage.close()
