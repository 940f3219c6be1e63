"""Loading snapshots into a RocksDB store through SST files (``load_groups``): exactly
the state ``load_group`` of each gives, and never over entries the store already holds."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.state.backend.restore import load_layers
from kafka_changelog.state.rocksdb import ingest as rocksdb_ingest
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.key_group_codec import encode_key_group
from kafka_changelog.state.schema.op_run import OpRun
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from kafka_changelog.state.snapshots.delta_layer import encode_delta
from kafka_changelog.state.tables.memory import StateTable

from .test_rocksdb_table import KEY_GROUPS, assert_same, op_strategy, registered


def _memory_state(ops: list[tuple[int, StateOp]]) -> StateTable:
    memory = registered(StateTable())
    for key_group, op in ops:
        memory.apply(key_group, op)
    assert isinstance(memory, StateTable)
    return memory


def _snapshots(memory: StateTable) -> list[tuple[int, bytes]]:
    return [(kg, memory.serialize_group(kg)) for kg in memory.key_groups()]


def _runs(ops: list[tuple[int, StateOp]], sparse: bool) -> dict[int, list[OpRun]]:
    """``ops`` as a restore's tail: by key group, runs of consecutive ops of one state
    and kind; ``sparse``: a column absent from every op of a run is None, as the
    column-wise collector makes it (else every column is a list, as the per-change one)."""
    tail: dict[int, list[OpRun]] = {}
    for key_group, op in ops:
        runs = tail.setdefault(key_group, [])
        if runs and runs[-1].state == op.state and runs[-1].op is op.op:
            runs[-1].add(op)
        else:
            runs.append(OpRun.started(op))
    if sparse:
        tail = {kg: [OpRun(run.state, run.op, run.keys, *(
            None if column is None or all(item is None for item in column) else column
            for column in (run.map_keys, run.values, run.items))) for run in runs]
            for kg, runs in tail.items()}
    return tail


def _sst_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("restore-*.sst"))


@settings(max_examples=60, deadline=None)
@given(st.lists(op_strategy(), max_size=80), st.permutations(range(len(KEY_GROUPS))))
def test_ingesting_gives_the_state_loading_each_group_gives(
        ops: list[tuple[int, StateOp]], order: list[int]) -> None:
    memory = _memory_state(ops)
    groups = dict(_snapshots(memory))
    # Key groups in any order: one out of order starts a new file.
    ordered = [(KEY_GROUPS[i], groups[KEY_GROUPS[i]]) for i in order
               if KEY_GROUPS[i] in groups]
    with tempfile.TemporaryDirectory() as directory:
        ingested = RocksDBStateTable(Path(directory) / "ingested")
        loaded = RocksDBStateTable(Path(directory) / "loaded")
        try:
            ingested.load_groups(ordered)
            for key_group, data in ordered:
                loaded.load_group(key_group, data)
            assert_same(ingested, memory, metas=False)
            assert_same(ingested, loaded)
            assert _sst_files(ingested.path) == []
            # Ops after the ingestion see its entries (counts, list appends, maps).
            registered(ingested)
            for key_group, op in ops:
                memory.apply(key_group, op)
                ingested.apply(key_group, op)
            assert_same(ingested, memory, metas=False)
            ingested.flush()
            ingested.close()
            ingested.reopen()
            assert_same(ingested, memory, metas=False)
        finally:
            ingested.close()
            loaded.close()


def test_every_shape_deltas_tombstones_and_odd_entries_match_load_group(
        tmp_path: Path) -> None:
    """Entries without data (a delta's deleted keys), empty maps and lists, an entry of
    another shape than its state's, states named against their registration order."""
    metas = [StateMeta("z-first", StateKind.VALUE, "bytes"),
             StateMeta("a-list", StateKind.LIST, "bytes"),
             StateMeta("m-map", StateKind.MAP, "bytes", "bytes")]
    data = encode_key_group([
        (metas[1], [(b"k1", [b"x", b"\x00y"]), (b"k2", []), (b"k3", None)]),
        (metas[2], [(b"a\x00", {b"\x00": b"1", b"b": b"2"}), (b"a", {b"c": b"3"}),
                    (b"e", {}), (b"gone", None)]),
        (metas[0], [(b"", b"empty key"), (b"v", b"1"), (b"w", None)]),
    ])
    ingested = RocksDBStateTable(tmp_path / "ingested")
    loaded = RocksDBStateTable(tmp_path / "loaded")
    for table in (ingested, loaded):
        for meta in metas:  # registered first: sids against name order
            table.register(meta)
    ingested.load_groups([(3, data)])
    loaded.load_group(3, data)
    # Stored entries: k1 and k2 (an empty list is stored), the maps' three entries, two
    # values.
    assert ingested.entry_count() == loaded.entry_count() == 7
    assert list(ingested.entries(3)) == list(loaded.entries(3))
    assert ingested.serialize_group(3) == loaded.serialize_group(3)
    assert ingested.get(3, "m-map", b"a\x00") == {b"\x00": b"1", b"b": b"2"}
    ingested.close()
    loaded.close()


def test_an_entry_of_another_kind_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    wrong = encode_key_group([(StateMeta("count", StateKind.VALUE, "int64"),
                               [(b"k", [b"list?"])])])
    table = RocksDBStateTable(tmp_path / "db")
    with pytest.raises(Exception, match="another kind"):
        table.load_groups([(0, _valid()), (1, wrong)])
    assert _sst_files(table.path) == []
    table.close()


def _valid() -> bytes:
    memory = registered(StateTable())
    memory.apply(0, StateOp("count", OpKind.SET, b"a", value=b"1"))
    return memory.serialize_group(0)


def test_an_empty_snapshot_and_empty_groups_ingest_nothing(tmp_path: Path) -> None:
    table = RocksDBStateTable(tmp_path / "db")
    table.load_groups([])
    table.load_groups([(4, StateTable().serialize_group(4))])
    assert table.entry_count() == 0
    assert table.key_groups() == []
    assert _sst_files(table.path) == []
    table.close()


def test_a_store_with_entries_is_loaded_group_by_group_keeping_newer_data(
        tmp_path: Path) -> None:
    """An ingested file's entries would be newer than the store's: into a store that is
    not empty, load_groups replaces key groups as load_group does, other key groups
    keep their entries."""
    table = registered(RocksDBStateTable(tmp_path / "db"))
    assert isinstance(table, RocksDBStateTable)
    table.apply(1, StateOp("count", OpKind.SET, b"kept", value=b"new"))
    table.apply(2, StateOp("count", OpKind.SET, b"replaced", value=b"old"))
    old = registered(StateTable())
    old.apply(2, StateOp("count", OpKind.SET, b"loaded", value=b"2"))
    table.load_groups([(2, old.serialize_group(2))])
    assert table.get(1, "count", b"kept") == b"new"
    assert table.get(2, "count", b"replaced") is None
    assert table.get(2, "count", b"loaded") == b"2"
    assert table.entry_count() == 2
    assert _sst_files(table.path) == []
    table.close()


def test_a_key_group_given_twice_ends_with_the_second(tmp_path: Path) -> None:
    first, second = registered(StateTable()), registered(StateTable())
    first.apply(6, StateOp("count", OpKind.SET, b"a", value=b"1"))
    first.apply(6, StateOp("count", OpKind.SET, b"b", value=b"1"))
    second.apply(6, StateOp("pages", OpKind.MAP_PUT, b"c", b"m", b"2"))
    table = RocksDBStateTable(tmp_path / "db")
    table.load_groups([(6, first.serialize_group(6)), (7, first.serialize_group(6)),
                       (6, second.serialize_group(6))])
    assert list(table.entries(6)) == [("pages", b"c", {b"m": b"2"})]
    assert table.entry_count() == 3
    table.close()


def test_large_state_goes_into_several_bounded_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocksdb_ingest, "MAX_FILE_BYTES", 64 << 10)
    memory = registered(StateTable())
    for i in range(20_000):
        key_group = i % 8
        memory.apply(key_group, StateOp("count", OpKind.SET, b"user-%06d" % i,
                                        value=random.randbytes(100)))
    table = RocksDBStateTable(tmp_path / "db")
    ingest = rocksdb_ingest.SstIngest
    created: list[rocksdb_ingest.SstIngest] = []

    def tracked(*args: object, **kwargs: object) -> rocksdb_ingest.SstIngest:
        made = ingest(*args, **kwargs)  # type: ignore[arg-type]
        created.append(made)
        return made

    monkeypatch.setattr("kafka_changelog.state.rocksdb.table.SstIngest", tracked)
    table.load_groups(_snapshots(memory))
    assert created[0].files_ingested >= 8  # ~250 KB per key group: a file each
    assert_same(table, memory, metas=False)
    table.close()


@settings(max_examples=80, deadline=None)
@given(st.lists(op_strategy(), max_size=60), st.lists(op_strategy(), max_size=60),
       st.booleans(), st.booleans())
def test_a_tail_merged_into_the_ingestion_gives_what_replaying_it_after_gives(
        snapshot_ops: list[tuple[int, StateOp]], tail_ops: list[tuple[int, StateOp]],
        tracked: bool, sparse: bool) -> None:
    """Tail ops of every kind (map puts and removes over snapshot maps, list appends to
    snapshot lists, deletes, keys new in the tail, key groups only the tail has), in
    runs as either collector makes them: the same entries, count and (tracked) changed
    keys as load_group then apply_batch."""
    memory = _memory_state(snapshot_ops)
    snapshots = _snapshots(memory)
    tail = _runs(tail_ops, sparse)
    with tempfile.TemporaryDirectory() as directory:
        merged = registered(RocksDBStateTable(Path(directory) / "merged",
                                              track_changes=tracked))
        replayed = registered(RocksDBStateTable(Path(directory) / "replayed",
                                                track_changes=tracked))
        assert isinstance(merged, RocksDBStateTable)
        assert isinstance(replayed, RocksDBStateTable)
        try:
            merged.load_groups(snapshots, tail)
            for key_group, data in snapshots:
                replayed.load_group(key_group, data)
            replayed.apply_batch(tail_ops)
            for key_group, op in tail_ops:
                memory.apply(key_group, op)
            assert_same(merged, replayed)
            assert_same(merged, memory)
            assert list(merged.changed_keys_by_group()) == list(
                replayed.changed_keys_by_group())
            assert _sst_files(merged.path) == []
        finally:
            merged.close()
            replayed.close()


def test_a_refused_tail_op_fails_the_load_and_leaves_no_file(tmp_path: Path) -> None:
    table = registered(RocksDBStateTable(tmp_path / "db"))
    with pytest.raises(Exception, match="LIST_ADD on VALUE state 'count'"):
        table.load_groups([(0, _valid())], {
            0: [OpRun("count", OpKind.LIST_ADD, [b"a"], items=[(b"x",)])]})
    assert _sst_files(table.path) == []
    table.close()


def test_snapshot_deltas_apply_after_the_ingested_whole_states(tmp_path: Path) -> None:
    """Layers as a layered snapshot gives them (every whole state, then the deltas): the
    whole states are ingested, each delta merged into its key group afterwards."""
    before = registered(RocksDBStateTable(tmp_path / "source", track_changes=True))
    assert isinstance(before, RocksDBStateTable)
    for i in range(50):
        before.apply(i % 4, StateOp("count", OpKind.SET, b"k%d" % i, value=b"1"))
        before.apply(i % 4, StateOp("pages", OpKind.MAP_PUT, b"k%d" % i, b"m", b"1"))
    wholes = [(kg, before.serialize_group(kg), False) for kg in before.key_groups()]
    epoch = before.start_change_epoch()
    before.clear_changes(epoch)
    for i in range(0, 50, 3):
        before.apply(i % 4, StateOp("count", OpKind.DELETE, b"k%d" % i))
        before.apply(i % 4, StateOp("pages", OpKind.MAP_PUT, b"k%d" % i, b"n", b"2"))
    deltas = [(kg, encode_delta(before, kg, before.changed_keys(kg)), True)
              for kg in before.key_groups()]
    target = RocksDBStateTable(tmp_path / "target")
    load_layers(target, [*wholes, *deltas])
    assert_same(target, before, metas=False)
    other = RocksDBStateTable(tmp_path / "other")
    with pytest.raises(ValueError, match="after its deltas"):
        load_layers(other, [*wholes, *deltas], {})
    other.close()
    target.close()
    before.close()


@pytest.mark.parametrize("sparse", [False, True])
def test_map_entries_a_tail_run_puts_after_a_whole_map_delete_are_deleted_with_it(
        tmp_path: Path, sparse: bool) -> None:
    """A whole-map delete reads the key group's map entries (an index of the keys is
    made then); entries a later run of puts adds to that map must be found by the next
    whole-map delete, and survive when no delete follows."""
    memory = registered(StateTable())
    for user in (b"u", b"v"):
        memory.apply(0, StateOp("pages", OpKind.MAP_PUT, user, b"a", b"1"))
    ops = [(0, StateOp("pages", OpKind.DELETE, b"u")),
           (0, StateOp("pages", OpKind.MAP_PUT, b"u", b"b", b"2")),
           (0, StateOp("pages", OpKind.MAP_PUT, b"v", b"c", b"3")),
           (0, StateOp("pages", OpKind.DELETE, b"u")),
           (0, StateOp("pages", OpKind.MAP_PUT, b"v", b"d", b"4"))]
    table = registered(RocksDBStateTable(tmp_path / "db", track_changes=True))
    try:
        table.load_groups(_snapshots(memory), _runs(ops, sparse))
        for key_group, op in ops:
            memory.apply(key_group, op)
        assert table.get(0, "pages", b"u") is None
        assert table.get(0, "pages", b"v") == {b"a": b"1", b"c": b"3", b"d": b"4"}
        assert table.entry_count() == 3
        assert_same(table, memory)
    finally:
        table.close()
