"""The RocksDB state table does what the in-memory one does, op for op, and writes the same
snapshot bytes; it survives closing and reopening; rocksdict is only needed when used."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.errors import StateBackendUnavailableError, StateMismatchError
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

ROOT = Path(__file__).resolve().parents[2]

METAS = [
    StateMeta("count", StateKind.VALUE, "int64"),
    StateMeta("total", StateKind.REDUCING, "int64"),
    StateMeta("events", StateKind.LIST, "utf8"),
    StateMeta("pages", StateKind.MAP, "int64", "utf8"),
]
# Keys that test the key encoding: empty, NUL bytes (escaped in map keys), a key that is
# a prefix of another, the escape's and the terminator's bytes, high bytes.
KEYS = [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x00\xff", b"a", b"a\x00", b"ab", b"\xff",
        b"\xff\xff", b"b"]
VALUES = [b"", b"1", b"\x00", b"longer value"]
KEY_GROUPS = [0, 1, 255, 256, 32767]


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[RocksDBStateTable]:
    table = RocksDBStateTable(tmp_path / "db")
    yield table
    table.close()


def registered(table: KeyedStateTable) -> KeyedStateTable:
    for meta in METAS:
        table.register(meta)
    return table


def op_strategy() -> st.SearchStrategy[tuple[int, StateOp]]:
    key, value, group = st.sampled_from(KEYS), st.sampled_from(VALUES), st.sampled_from(
        KEY_GROUPS)
    values = st.lists(value, max_size=3).map(tuple)
    single = st.sampled_from(["count", "total"])
    return st.tuples(group, st.one_of(
        st.builds(lambda s, k, v: StateOp(s, OpKind.SET, k, value=v), single, key, value),
        st.builds(lambda s, k: StateOp(s, OpKind.DELETE, k),
                  st.sampled_from(["count", "total", "events", "pages"]), key),
        st.builds(lambda k, v: StateOp("events", OpKind.LIST_ADD, k, values=v), key, values),
        st.builds(lambda k, v: StateOp("events", OpKind.LIST_REPLACE, k, values=v), key,
                  values),
        st.builds(lambda k, m, v: StateOp("pages", OpKind.MAP_PUT, k, m, v), key, key, value),
        st.builds(lambda k, m: StateOp("pages", OpKind.MAP_REMOVE, k, m), key, key),
    ))


def assert_same(rocks: KeyedStateTable, memory: KeyedStateTable, metas: bool = True) -> None:
    """Every read of the protocol agrees, and the snapshot bytes are equal (registrations
    too unless ``metas`` is False: a snapshot only carries those of states with entries)."""
    assert rocks.key_groups() == memory.key_groups()
    assert rocks.entry_count() == memory.entry_count()
    if metas:
        assert dict(rocks.metas) == dict(memory.metas)
    for key_group in KEY_GROUPS:
        assert rocks.has_entries(key_group) == memory.has_entries(key_group)
        assert list(rocks.entries(key_group)) == list(memory.entries(key_group))
        assert rocks.serialize_group(key_group) == memory.serialize_group(key_group)


@settings(max_examples=50, deadline=None)
@given(st.lists(op_strategy(), max_size=60), st.lists(st.booleans(), min_size=60,
                                                      max_size=60))
def test_every_op_gives_what_the_in_memory_table_gives(
    ops: list[tuple[int, StateOp]], reads_first: list[bool]
) -> None:
    memory = registered(StateTable())
    with tempfile.TemporaryDirectory() as directory:
        rocks = registered(RocksDBStateTable(Path(directory) / "db"))
        try:
            for (key_group, op), read_first in zip(ops, reads_first, strict=False):
                if read_first:  # a read right before a write takes the count shortcut
                    assert rocks.get(key_group, op.state, op.key) == memory.get(
                        key_group, op.state, op.key)
                    if op.map_key is not None:
                        assert rocks.get_map_value(
                            key_group, op.state, op.key, op.map_key) == memory.get_map_value(
                            key_group, op.state, op.key, op.map_key)
                memory.apply(key_group, op)
                rocks.apply(key_group, op)
                assert rocks.get(key_group, op.state, op.key) == memory.get(
                    key_group, op.state, op.key)
                assert rocks.entry_count() == memory.entry_count()
            assert_same(rocks, memory)
            # Snapshots restore into either kind, and give the same bytes back.
            loaded = RocksDBStateTable(Path(directory) / "loaded")
            back = StateTable()
            for key_group in memory.key_groups():
                loaded.load_group(key_group, memory.serialize_group(key_group))
                back.load_group(key_group, rocks.serialize_group(key_group))
            assert_same(loaded, memory, metas=False)
            for key_group in KEY_GROUPS:
                assert back.serialize_group(key_group) == memory.serialize_group(key_group)
            loaded.close()
        finally:
            rocks.close()


def test_a_broad_example_serializes_byte_for_byte(rocks: RocksDBStateTable) -> None:
    memory = registered(StateTable())
    registered(rocks)
    for i in range(2000):
        key_group, key = KEY_GROUPS[i % 5], KEYS[i % 11] + str(i % 37).encode()
        for op in (StateOp("count", OpKind.SET, key, value=str(i).encode()),
                   StateOp("events", OpKind.LIST_ADD, key, values=(b"e%d" % i,)),
                   StateOp("pages", OpKind.MAP_PUT, key, KEYS[i % 7], b"%d" % i)):
            memory.apply(key_group, op)
            rocks.apply(key_group, op)
        if i % 13 == 0:
            for op in (StateOp("count", OpKind.DELETE, key),
                       StateOp("pages", OpKind.MAP_REMOVE, key, KEYS[i % 7]),
                       StateOp("events", OpKind.LIST_REPLACE, key, values=(b"r",))):
                memory.apply(key_group, op)
                rocks.apply(key_group, op)
    assert rocks.entry_count() == memory.entry_count() > 1000
    assert_same(rocks, memory)


def test_reopening_gives_the_same_table(tmp_path: Path) -> None:
    memory = registered(StateTable())
    table = registered(RocksDBStateTable(tmp_path / "db"))
    for i in range(300):
        for op in (StateOp("total", OpKind.SET, b"k%d" % (i % 50), value=b"%d" % i),
                   StateOp("pages", OpKind.MAP_PUT, b"k%d" % (i % 20), b"p%d" % (i % 3), b"v")):
            table.apply(i % 4, op)
            memory.apply(i % 4, op)
    table.flush()
    table.close()
    assert table.closed
    again = RocksDBStateTable(tmp_path / "db")
    assert_same(again, memory)
    with pytest.raises(StateMismatchError, match="registered as LIST"):
        again.register(StateMeta("events", StateKind.VALUE, "utf8"))
    again.close()


def test_closing_without_flush_keeps_the_state_and_remove_on_close_deletes_it(
    tmp_path: Path
) -> None:
    table = registered(RocksDBStateTable(tmp_path / "db"))
    table.apply(3, StateOp("count", OpKind.SET, b"k", value=b"1"))
    table.close()
    table.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        table.get(3, "count", b"k")
    again = RocksDBStateTable(tmp_path / "db", remove_on_close=True)
    assert again.get(3, "count", b"k") == b"1" and again.entry_count() == 1
    again.close()
    assert not (tmp_path / "db").exists()


def test_loading_a_group_replaces_it(rocks: RocksDBStateTable) -> None:
    memory = registered(StateTable())
    registered(rocks)
    for table in (memory, rocks):
        for key in (b"a", b"b", b"c"):
            table.apply(7, StateOp("pages", OpKind.MAP_PUT, key, b"x", b"1"))
            table.apply(8, StateOp("count", OpKind.SET, key, value=b"1"))
    replacement = StateTable()
    replacement.register(METAS[0])
    replacement.apply(7, StateOp("count", OpKind.SET, b"z", value=b"9"))
    data = replacement.serialize_group(7)
    memory.load_group(7, data)
    rocks.load_group(7, data)
    assert rocks.entry_count() == memory.entry_count() == 4
    assert_same(rocks, memory)
    assert list(rocks.entries(7)) == [("count", b"z", b"9")]


def test_ops_of_another_kind_and_unregistered_states_are_refused(
    rocks: RocksDBStateTable
) -> None:
    registered(rocks)
    with pytest.raises(StateMismatchError, match="unregistered state 'nope'"):
        rocks.apply(0, StateOp("nope", OpKind.SET, b"k", value=b"v"))
    with pytest.raises(StateMismatchError, match="LIST_ADD on VALUE state 'count'"):
        rocks.apply(0, StateOp("count", OpKind.LIST_ADD, b"k", values=(b"v",)))
    with pytest.raises(StateMismatchError, match="SET on map state 'pages'"):
        rocks.apply(0, StateOp("pages", OpKind.SET, b"k", value=b"v"))
    assert rocks.get(0, "nope", b"k") is None
    assert rocks.entry_count() == 0


def test_the_config_makes_either_table_and_cleans_rocksdb_up(tmp_path: Path) -> None:
    assert isinstance(StateBackendConfig().create_table(), StateTable)
    table = StateBackendConfig("rocksdb", str(tmp_path)).create_table("op/1")
    assert isinstance(table, RocksDBStateTable)
    assert table.path.parent == tmp_path and table.path.name.startswith("op_1-")
    table.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="one of"):
        StateBackendConfig("heap")


def test_without_rocksdict_the_error_names_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)  # what an absent package gives
    with pytest.raises(StateBackendUnavailableError, match="pip install rocksdict"):
        RocksDBStateTable(tmp_path / "db")
    with pytest.raises(StateBackendUnavailableError, match="'rocksdict' package"):
        StateBackendConfig("rocksdb", str(tmp_path)).create_table()


def test_no_state_module_imports_rocksdict_when_loaded() -> None:
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['rocksdict'] = None\n"
        "import kafka_changelog.state as state\n"
        "for m in pkgutil.iter_modules(state.__path__):\n"
        "    importlib.import_module('kafka_changelog.state.' + m.name)\n"
        "import spark_integration.streaming.task, spark_integration.streaming\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_a_large_key_group_loads_in_several_write_batches(rocks: RocksDBStateTable) -> None:
    """More entries than one load batch holds, of every kind, map keys with NUL bytes:
    the same entries and snapshot bytes as the in-memory table's."""
    memory = registered(StateTable())
    for i in range(30_000):
        key = b"user\x00%06d" % i
        memory.apply(5, StateOp("count", OpKind.SET, key, value=b"%d" % i))
        if i % 3 == 0:
            memory.apply(5, StateOp("events", OpKind.LIST_ADD, key, values=(b"a", b"b")))
            memory.apply(5, StateOp("pages", OpKind.MAP_PUT, key, b"p\x00%d" % (i % 5),
                                    b"1"))
    data = memory.serialize_group(5)
    rocks.load_group(5, data)
    assert rocks.entry_count() == memory.entry_count() == 50_000
    assert rocks.serialize_group(5) == data
    assert_same(rocks, memory, metas=False)  # "total" has no entries: not in the snapshot


def _apply_one_by_one(table: KeyedStateTable, ops: list[tuple[int, StateOp]]) -> str:
    for key_group, op in ops:
        try:
            table.apply(key_group, op)
        except StateMismatchError as exc:
            return str(exc)
    return ""


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(op_strategy(), op_strategy(), op_strategy(), st.tuples(
    st.sampled_from(KEY_GROUPS), st.sampled_from([
        StateOp("count", OpKind.LIST_ADD, b"a", values=(b"x",)),
        StateOp("events", OpKind.SET, b"a", value=b"x"),
        StateOp("nope", OpKind.SET, b"a", value=b"x")]))), max_size=60),
    st.integers(min_value=1, max_value=7))
def test_a_batch_of_ops_gives_what_applying_them_one_by_one_gives(
    ops: list[tuple[int, StateOp]], batch_size: int
) -> None:
    """``apply_batch`` (one multi-get, one write batch, map ops in between) is ``apply``
    op by op: the same state and count, and the same error at the same op."""
    with tempfile.TemporaryDirectory() as directory:
        one = registered(RocksDBStateTable(Path(directory) / "one"))
        batched = registered(RocksDBStateTable(Path(directory) / "batched"))
        memory = registered(StateTable())
        try:
            expected_error = _apply_one_by_one(one, ops)
            error = ""
            for start in range(0, len(ops), batch_size):
                try:
                    batched.apply_batch(ops[start:start + batch_size])
                except StateMismatchError as exc:
                    error = str(exc)
                    break
            assert error == expected_error
            assert_same(batched, one)
            if not expected_error:  # the in-memory table does not check kinds
                _apply_one_by_one(memory, ops)
                assert_same(batched, memory)
        finally:
            one.close()
            batched.close()


def test_a_map_entry_removed_put_and_removed_again_in_one_batch_is_gone(
        rocks: RocksDBStateTable) -> None:
    registered(rocks)
    put = StateOp("pages", OpKind.MAP_PUT, b"u", b"home", b"1")
    remove = StateOp("pages", OpKind.MAP_REMOVE, b"u", b"home")
    other = StateOp("pages", OpKind.MAP_PUT, b"u", b"cart", b"2")
    rocks.apply(3, put)
    rocks.apply_batch([(3, remove), (3, put), (3, other), (3, remove)])
    memory = registered(StateTable())
    for op in (put, remove, put, other, remove):
        memory.apply(3, op)
    assert_same(rocks, memory)
    assert rocks.get_map_value(3, "pages", b"u", b"home") is None
    assert rocks.entry_count() == 1


_MAP_OPS = st.tuples(st.just(3), st.one_of(
    st.builds(lambda k, m, v: StateOp("pages", OpKind.MAP_PUT, k, m, v),
              st.sampled_from([b"a", b"b\x00"]), st.sampled_from([b"x", b"y"]),
              st.sampled_from([b"1", b"2"])),
    st.builds(lambda k, m: StateOp("pages", OpKind.MAP_REMOVE, k, m),
              st.sampled_from([b"a", b"b\x00"]), st.sampled_from([b"x", b"y"])),
    st.builds(lambda k: StateOp("pages", OpKind.DELETE, k), st.sampled_from([b"a", b"b\x00"])),
    st.just(StateOp("count", OpKind.SET, b"a", value=b"9"))))


@settings(max_examples=80, deadline=None)
@given(st.lists(_MAP_OPS, max_size=12), st.lists(_MAP_OPS, max_size=40))
def test_map_ops_in_a_batch_give_what_one_by_one_gives(
        before: list[tuple[int, StateOp]], ops: list[tuple[int, StateOp]]) -> None:
    """Few keys and map keys, so a batch puts, removes and puts again the same entries on
    top of committed ones."""
    with tempfile.TemporaryDirectory() as directory:
        one = registered(RocksDBStateTable(Path(directory) / "one", track_changes=True))
        batched = registered(RocksDBStateTable(Path(directory) / "b", track_changes=True))
        try:
            for table in (one, batched):
                _apply_one_by_one(table, before)
            _apply_one_by_one(one, ops)
            batched.apply_batch(ops)
            assert_same(batched, one)
            assert list(batched.changed_keys_by_group()) == list(one.changed_keys_by_group())
        finally:
            one.close()
            batched.close()


def _apply_as_columns(table: RocksDBStateTable, ops: list[tuple[int, StateOp]]) -> None:
    """``apply_columns`` of each run of consecutive ops of one state and op kind."""
    start = 0
    while start < len(ops):
        state, kind = ops[start][1].state, ops[start][1].op
        end = start
        while end < len(ops) and (ops[end][1].state, ops[end][1].op) == (state, kind):
            end += 1
        run = ops[start:end]
        table.apply_columns(state, kind, [kg for kg, _ in run], [op.key for _, op in run],
                            [op.map_key for _, op in run], [op.value for _, op in run],
                            [op.values for _, op in run])
        start = end


@settings(max_examples=60, deadline=None)
@given(st.lists(op_strategy(), max_size=25), st.lists(op_strategy(), max_size=80),
       st.sampled_from([1, 3, 80]), st.booleans())
def test_single_batched_and_columnar_paths_give_the_same_store(
    before: list[tuple[int, StateOp]], ops: list[tuple[int, StateOp]], batch_size: int,
    read_first: bool,
) -> None:
    """One plan per op, three ways to feed it: ``apply`` op by op, ``apply_batch`` and
    ``apply_columns`` (runs of one state and op) end with the same entries, entry count,
    snapshot bytes and changed-key marks, on top of committed state, after reads that
    fill the table's memory of which keys exist (or not), and after reopening."""
    with tempfile.TemporaryDirectory() as directory:
        tables = [registered(RocksDBStateTable(Path(directory) / name, track_changes=True))
                  for name in ("single", "batched", "columns")]
        memory = registered(StateTable())
        try:
            for table in (*tables, memory):
                _apply_one_by_one(table, before)
                if read_first:
                    for key_group, op in ops[::2]:
                        table.get(key_group, op.state, op.key)
            single, batched, columns = tables
            _apply_one_by_one(single, ops)
            _apply_one_by_one(memory, ops)
            for start in range(0, len(ops), batch_size):
                batched.apply_batch(ops[start:start + batch_size])
            _apply_as_columns(columns, ops)
            for table in (batched, columns):
                assert_same(table, single)
                assert list(table.changed_keys_by_group()) == list(
                    single.changed_keys_by_group())
            assert_same(single, memory)
            for table in tables:
                table.flush()
                table.close()
                table.reopen()
                assert_same(table, memory)
        finally:
            for table in tables:
                table.close()


def test_a_refused_op_writes_nothing_and_leaves_the_ops_before_it(
        rocks: RocksDBStateTable) -> None:
    registered(rocks)
    rocks.apply_batch([(1, StateOp("count", OpKind.SET, b"a", value=b"1"))])
    with pytest.raises(StateMismatchError, match="LIST_ADD on VALUE state 'count'"):
        rocks.apply_batch([(1, StateOp("count", OpKind.SET, b"b", value=b"2")),
                           (1, StateOp("count", OpKind.LIST_ADD, b"c", values=(b"x",))),
                           (1, StateOp("count", OpKind.SET, b"d", value=b"4"))])
    with pytest.raises(StateMismatchError, match="MAP_PUT on VALUE state 'count'"):
        rocks.apply_columns("count", OpKind.MAP_PUT, [1], [b"e"], [b"m"], [b"5"])
    with pytest.raises(StateMismatchError, match="unregistered state 'nope'"):
        rocks.apply_columns("nope", OpKind.SET, [1], [b"f"], values=[b"6"])
    assert list(rocks.entries(1)) == [("count", b"a", b"1"), ("count", b"b", b"2")]
    assert rocks.entry_count() == 2
