"""Bulk state (``kafka_changelog.state.backend.bulk_state``) against the per-key API, on
both tables.

A random program of bulk calls runs on one backend; the same calls, key by key through
``set_current_key`` and the state objects, run on another. Both must log exactly the
same changes (payloads, key groups, order), hold exactly the same table (each key
group's snapshot bytes), and read the same values; a restore of the bulk backend's
checkpoint (with and without materialization, into either table) is exact.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kafka_changelog import InMemoryChangelogStorage, KeyGroupOutOfRangeError, KeyGroupRange
from kafka_changelog.keygroups import key_group_for_key
from kafka_changelog.state.backend.bulk_state import BulkState
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.errors import KeyNotInBatchError, StateMismatchError
from kafka_changelog.state.schema.ops import (
    LIST_ADD,
    LIST_REPLACE,
    MAP_PUT,
    MAP_REMOVE,
    SET,
    OpKind,
    StateOp,
    encode_ops,
    ops_of_columns,
)
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.tables.protocol import KeyedStateTable

from .state_helpers import COUNT, EVENTS, MAX_P, PAGES, STATS, TOTAL

KINDS = ["memory", "rocksdb"]
#: Natural keys (what a caller names keys by) and their state keys.
NATURAL = [f"user-{i}" for i in range(40)]
KEY_BYTES = {k: k.encode() for k in NATURAL}
PAGE_NAMES = ["home", "cart", "search", "item"]
DESCRIPTORS = [COUNT, EVENTS, PAGES, TOTAL, STATS]
TableFactory = Callable[[], KeyedStateTable]


@pytest.fixture(params=KINDS)
def new_table(request: pytest.FixtureRequest, tmp_path: Path) -> TableFactory:
    kind = request.param
    return lambda: StateBackendConfig(kind, str(tmp_path)).create_table("op")


@pytest.fixture
def storage() -> Iterator[InMemoryChangelogStorage]:
    with InMemoryChangelogStorage() as storage:
        yield storage


@pytest.fixture
def store() -> InMemorySnapshotStore:
    return InMemorySnapshotStore()


def new_backend(storage: Any, store: Any, table: KeyedStateTable,
                key_groups: KeyGroupRange | None = None) -> ChangelogKeyedStateBackend:
    return ChangelogKeyedStateBackend(storage, store, "op", key_groups or KeyGroupRange.of(0, 127),
                                      MAX_P, table=table)


def open_bulk(backend: ChangelogKeyedStateBackend, keys: list[str]) -> BulkState:
    return BulkState(backend, keys, [KEY_BYTES[k] for k in keys])


# -- the program: bulk calls, and the same calls key by key --------------------------------

Call = tuple[str, list[str], list[Any]]


def random_program(rng: random.Random, calls: int) -> list[Call]:
    """Bulk calls over random (ordered, sometimes repeating) subsets of the keys."""
    program: list[Call] = []
    for _ in range(calls):
        what = rng.choice(["value.set", "value.clear", "list.add", "list.add_all", "list.update",
                           "list.clear", "map.put", "map.put_each", "map.remove", "map.clear",
                           "reducing.add", "aggregating.add"])
        keys = rng.sample(NATURAL, rng.randint(0, len(NATURAL)))
        if rng.random() < 0.3 and keys:
            keys += rng.choices(keys, k=rng.randint(1, 4))  # a key given twice
            rng.shuffle(keys)
        n = len(keys)
        page = rng.choice(PAGE_NAMES)
        args: list[Any]
        if what == "value.set" or what in ("reducing.add", "aggregating.add"):
            args = [[rng.randint(-5, 50) for _ in range(n)]]
        elif what == "list.add":
            args = [[rng.choice(PAGE_NAMES) for _ in range(n)]]
        elif what in ("list.add_all", "list.update"):
            args = [[rng.choices(PAGE_NAMES, k=rng.randint(0, 3)) for _ in range(n)]]
        elif what == "map.put":
            args = [page, [rng.randint(0, 9) for _ in range(n)]]
        elif what == "map.put_each":
            args = [[rng.choice(PAGE_NAMES) for _ in range(n)],
                    [rng.randint(0, 9) for _ in range(n)]]
        elif what == "map.remove":
            args = [page]
        else:
            args = []
        program.append((what, keys, args))
    return program


def run_bulk(backend: ChangelogKeyedStateBackend, program: list[Call]) -> list[Any]:
    """The program through one bulk view; what the reducing/aggregating adds returned."""
    state = open_bulk(backend, NATURAL)
    for descriptor in DESCRIPTORS:  # registered in the same order as run_per_key's
        state(descriptor)
    returned = []
    for what, keys, args in program:
        kind, method = what.split(".")
        target = getattr(state, kind)({"value": COUNT, "list": EVENTS, "map": PAGES,
                                       "reducing": TOTAL, "aggregating": STATS}[kind])
        result = getattr(target, method)(keys, *args)
        if kind in ("reducing", "aggregating"):
            returned.append(result)
    return returned


def run_per_key(backend: ChangelogKeyedStateBackend, program: list[Call]) -> list[Any]:
    """The same program, one key at a time through the per-key API."""
    for descriptor in DESCRIPTORS:
        backend.state(descriptor)
    returned = []
    for what, keys, args in program:
        folded = []
        for i, key in enumerate(keys):
            backend.set_current_key(KEY_BYTES[key])
            if what == "value.set":
                backend.state(COUNT).update(args[0][i])
            elif what == "value.clear":
                backend.state(COUNT).clear()
            elif what == "list.add":
                backend.state(EVENTS).add(args[0][i])
            elif what == "list.add_all":
                backend.state(EVENTS).add_all(args[0][i])
            elif what == "list.update":
                backend.state(EVENTS).update(args[0][i])
            elif what == "list.clear":
                backend.state(EVENTS).clear()
            elif what == "map.put":
                backend.state(PAGES).put(args[0], args[1][i])
            elif what == "map.put_each":
                backend.state(PAGES).put(args[0][i], args[1][i])
            elif what == "map.remove":
                backend.state(PAGES).remove(args[0])
            elif what == "map.clear":
                backend.state(PAGES).clear()
            elif what == "reducing.add":
                backend.state(TOTAL).add(args[0][i])
                folded.append(backend.state(TOTAL).get())
            elif what == "aggregating.add":
                backend.state(STATS).add(args[0][i])
                folded.append(backend.state(STATS).get())
        if what in ("reducing.add", "aggregating.add"):
            returned.append(folded)
    return returned


def logged(storage: Any, handle: KeyedStateHandle) -> list[tuple[int | None, bytes]]:
    """Every change of the handle's changelog, in order: (key group or None, payload)."""
    reader = storage.reader()
    return [(None if c.is_meta else c.key_group, c.payload)
            for h in handle.changelog for c in reader.read(h)]


def table_bytes(backend: ChangelogKeyedStateBackend) -> dict[int, bytes]:
    """Each key group's snapshot bytes: the table's whole content, comparable."""
    return {kg: backend.table.serialize_group(kg) for kg in backend.table.key_groups()}


def read_all(backend: ChangelogKeyedStateBackend) -> dict[str, Any]:
    """Every key's state through the per-key API."""
    read = {}
    for key in NATURAL:
        backend.set_current_key(KEY_BYTES[key])
        read[key] = (backend.state(COUNT).value(), backend.state(EVENTS).get(),
                     dict(backend.state(PAGES).items()), backend.state(TOTAL).get(),
                     backend.state(STATS).get())
    return read


def read_all_bulk(backend: ChangelogKeyedStateBackend) -> dict[str, Any]:
    """Every key's state through one bulk view (keys in another order than opened)."""
    state = open_bulk(backend, NATURAL)
    keys = list(reversed(NATURAL))
    columns = (state.value(COUNT).get(keys), state.list(EVENTS).get(keys),
               state.map(PAGES).get_all(keys), state.reducing(TOTAL).get(keys),
               state.aggregating(STATS).get(keys))
    return {key: tuple(c[i] for c in columns) for i, key in enumerate(keys)}


# -- bulk = per key ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_calls_hold_exactly_what_per_key_calls_do_and_their_logs_restore_it(
        storage: Any, store: Any, new_table: TableFactory, seed: int, tmp_path: Path) -> None:
    program = random_program(random.Random(seed), 60)
    bulk = new_backend(storage, store, new_table())
    per_key = new_backend(storage, store, new_table())
    try:
        assert run_bulk(bulk, program) == run_per_key(per_key, program)
        assert table_bytes(bulk) == table_bytes(per_key)
        assert bulk.state_rows() == per_key.state_rows()
        # Per key, a key's changes are logged as one net change per state while it is
        # the current key: never more records than bulk calls log (one per change).
        bulk_changes, _ = bulk.take_logged()
        per_key_changes, _ = per_key.take_logged()
        assert 200 < per_key_changes <= bulk_changes
        assert read_all_bulk(bulk) == read_all(per_key) == read_all(bulk)
        expected = table_bytes(bulk)
        for i, backend in enumerate((bulk, per_key)):
            handle = backend.snapshot(1).result(10)
            restored = restore_backend(
                storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle],
                table=StateBackendConfig("rocksdb", str(tmp_path / f"restored-{i}"))
                .create_table("op"))
            try:
                assert table_bytes(restored) == expected
            finally:
                restored.close()
    finally:
        bulk.close()
        per_key.close()


@pytest.mark.parametrize("restore_kind", KINDS)
def test_a_restore_after_bulk_writes_is_exact(storage: Any, store: Any, new_table: TableFactory,
                                              restore_kind: str, tmp_path: Path) -> None:
    rng = random.Random(5)
    backend = new_backend(storage, store, new_table())
    run_bulk(backend, random_program(rng, 40))
    backend.materialize_now()
    run_bulk(backend, random_program(rng, 40))  # the changelog tail after the snapshot
    handle = backend.snapshot(1).result(10)
    expected, expected_bytes = read_all(backend), table_bytes(backend)
    run_bulk(backend, random_program(rng, 5))  # after the checkpoint: not in it
    other_dir = tmp_path / "restored"
    restored = restore_backend(storage, store, "op", KeyGroupRange.of(0, 127), MAX_P, [handle],
                               table=StateBackendConfig(restore_kind, str(other_dir))
                               .create_table("op"))
    try:
        assert table_bytes(restored) == expected_bytes
        assert read_all(restored) == expected
        # Rescaled: two backends of half the key groups each hold the same state.
        halves = [restore_backend(storage, store, "op", r, MAX_P, [handle])
                  for r in (KeyGroupRange.of(0, 63), KeyGroupRange.of(64, 127))]
        assert {kg: data for half in halves for kg, data in table_bytes(half).items()} == \
            expected_bytes
        for half in halves:
            half.close()
    finally:
        backend.close()
        restored.close()


def test_the_keys_may_come_in_any_order_and_as_numpy_or_pandas(
        storage: Any, store: Any, new_table: TableFactory) -> None:
    backend = new_backend(storage, store, new_table())
    try:
        state = open_bulk(backend, NATURAL)
        counts = state.value(COUNT)
        counts.set(pd.Index(NATURAL), np.arange(len(NATURAL), dtype=np.int64))  # numpy ints
        assert counts.get(state.keys) == list(range(len(NATURAL)))
        some = pd.Series(["user-7", "user-3"])
        counts.set(some, pd.Series([70, 30]))
        assert counts.get(["user-3", "user-7", "user-0"]) == [30, 70, 0]
        assert counts.get(np.array(["user-7"], dtype=object)) == [70]
        pages = state.map(PAGES)
        pages.put_each(["user-1", "user-1", "user-2"], ["home", "cart", "home"], [1, 2, 3])
        assert pages.get_each(["user-2", "user-1"], ["home", "cart"]) == [3, 2]
        assert pages.get(["user-1", "user-2", "user-3"], "home", default=0) == [1, 3, 0]
        assert pages.contains(["user-1", "user-3"], "cart") == [True, False]
        assert pages.get_all(["user-1", "user-3"]) == [{"cart": 2, "home": 1}, {}]
        assert len(state) == len(NATURAL) and "user-5" in state and "nobody" not in state
        assert state.key_groups == [key_group_for_key(KEY_BYTES[k], MAX_P) for k in NATURAL]
    finally:
        backend.close()


def test_composite_and_typed_natural_keys(storage: Any, store: Any,
                                          new_table: TableFactory) -> None:
    backend = new_backend(storage, store, new_table())
    try:
        keys = [("eu", 1), ("eu", 2), ("us", 1)]
        state = BulkState(backend, keys, [f"{r}:{n}".encode() for r, n in keys])
        counts = state.value(COUNT)
        counts.set(keys, [1, 2, 3])
        # NumPy scalars hash and compare like the Python values.
        assert counts.get([("us", np.int64(1)), ("eu", 2)]) == [3, 2]
        backend.set_current_key(b"us:1")
        assert backend.state(COUNT).value() == 3
    finally:
        backend.close()


# -- errors ----------------------------------------------------------------------------------


def test_a_key_not_in_the_batch_is_refused_by_name(storage: Any, store: Any,
                                                    new_table: TableFactory) -> None:
    backend = new_backend(storage, store, new_table())
    try:
        state = open_bulk(backend, NATURAL[:3])
        counts, events = state.value(COUNT), state.list(EVENTS)
        assert backend.take_logged()[0] == 2  # the registrations
        with pytest.raises(KeyNotInBatchError, match=r"key 'user-9' is not one of the 3 keys"):
            counts.set(["user-0", "user-9"], [1, 2])
        with pytest.raises(KeyNotInBatchError, match=r"key \['x'\] is not one"):
            events.get([["x"]])  # unhashable
        assert backend.take_logged() == (0, 0)  # nothing written
        assert backend.table.key_groups() == []
    finally:
        backend.close()


def test_what_a_bulk_view_refuses(storage: Any, store: Any, new_table: TableFactory) -> None:
    backend = new_backend(storage, store, new_table(), KeyGroupRange.of(0, 63))
    try:
        inside = [k for k in NATURAL if key_group_for_key(KEY_BYTES[k], MAX_P) < 64]
        outside = [k for k in NATURAL if key_group_for_key(KEY_BYTES[k], MAX_P) >= 64]
        with pytest.raises(KeyGroupOutOfRangeError):
            open_bulk(backend, inside + outside[:1])
        with pytest.raises(ValueError, match="key 'a' is given twice"):
            BulkState(backend, ["a", "b", "a"], [b"a", b"b", b"c"])
        with pytest.raises(ValueError, match="2 keys but 1 key bytes"):
            BulkState(backend, ["a", "b"], [b"a"])
        with pytest.raises(TypeError, match="key bytes must be bytes, got str"):
            BulkState(backend, ["a"], ["a"])
        state = open_bulk(backend, inside)
        with pytest.raises(ValueError, match=r"state 'count': 2 keys but 1 values"):
            state.value(COUNT).set(inside[:2], [1])
        with pytest.raises(StateMismatchError, match="'events' is a LIST state, not VALUE"):
            state.value(EVENTS)
    finally:
        backend.close()


# -- the columnar write path -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_encode_ops_gives_each_op_s_own_bytes(seed: int) -> None:
    """``encode_ops`` column by column = ``StateOp.to_bytes`` op by op, for every kind and
    field sizes around the encoder's table limits (64, 1024, 16383 bytes or values)."""
    rng = random.Random(seed)
    sizes = [0, 1, 62, 63, 64, 65, 1023, 1024, 1025, 16383, 16384, 20000]

    def data() -> bytes:
        return rng.randbytes(rng.choice(sizes) if rng.random() < 0.3 else rng.randint(0, 9))

    for op in OpKind:
        n = rng.randint(1, 30)
        keys = [data() for _ in range(n)]
        map_keys = [data() for _ in range(n)] if op in (MAP_PUT, MAP_REMOVE) else None
        values = [data() for _ in range(n)] if op in (SET, MAP_PUT) else None
        items = ([tuple(data() for _ in range(rng.choice([0, 1, 3, 63, 64, 1024, 1030])))
                  for _ in range(n)] if op in (LIST_ADD, LIST_REPLACE) else None)
        state = rng.choice(["s", "é" * 70])
        expected = [op_.to_bytes() for op_ in ops_of_columns(state, op, keys, map_keys, values,
                                                             items)]
        assert encode_ops(state, op, keys, map_keys, values, items) == expected
        assert [StateOp.from_bytes(p) for p in expected] == ops_of_columns(
            state, op, keys, map_keys, values, items)


def test_mutate_columns_refuses_what_does_not_suit_the_state(
        storage: Any, store: Any, new_table: TableFactory) -> None:
    backend = new_backend(storage, store, new_table())
    try:
        backend.register(COUNT)
        with pytest.raises(StateMismatchError, match="MAP_PUT on VALUE state 'count'"):
            backend.mutate_columns("count", MAP_PUT, [0], [b"k"], [b"m"], [b"v"])
        with pytest.raises(StateMismatchError, match="unregistered state 'nothing'"):
            backend.mutate_columns("nothing", SET, [0], [b"k"], values=[b"v"])
        with pytest.raises(ValueError, match="2 changes of state 'count' but 1 key groups"):
            backend.mutate_columns("count", SET, [0], [b"a", b"b"], values=[b"1", b"2"])
        with pytest.raises(KeyGroupOutOfRangeError):
            backend.mutate_columns("count", SET, [0, 128], [b"a", b"b"], values=[b"1", b"2"])
        assert backend.table.key_groups() == []
    finally:
        backend.close()
