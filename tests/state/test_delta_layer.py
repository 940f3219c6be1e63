"""Delta layers: a RocksDB table that tracks changes names every key a mutation touched;
the delta of those keys, applied to the key group's earlier snapshot, gives the key group
as it is now (deletions included), in either kind of table; layered snapshot handles."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.key_group_codec import iter_key_group
from kafka_changelog.state.schema.ops import OpKind, StateOp
from kafka_changelog.state.snapshots.delta_layer import (
    MAX_LAYERS,
    apply_delta,
    encode_delta,
    worth_a_delta,
)
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle
from kafka_changelog.state.tables.memory import StateTable

from .test_rocksdb_table import KEY_GROUPS, assert_same, op_strategy, registered


@settings(max_examples=60, deadline=None)
@given(st.lists(op_strategy(), max_size=40), st.lists(op_strategy(), max_size=40))
def test_a_delta_on_the_earlier_snapshot_gives_the_state_now(
    before: list[tuple[int, StateOp]], after: list[tuple[int, StateOp]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rocks = registered(RocksDBStateTable(Path(directory) / "db", track_changes=True))
        try:
            assert rocks.changes_complete
            for key_group, op in before:
                rocks.apply(key_group, op)
            snapshot = {kg: rocks.serialize_group(kg) for kg in KEY_GROUPS}
            epoch = rocks.start_change_epoch()
            rocks.clear_changes(epoch)  # the snapshot holds everything up to here
            assert all(list(rocks.changed_keys(kg)) == [] for kg in KEY_GROUPS)
            rocks.apply_batch(after[: len(after) // 2])
            for key_group, op in after[len(after) // 2:]:
                rocks.apply(key_group, op)
            touched = {(kg, op.state, op.key) for kg, op in after}
            marked = {(kg, state, key) for kg in KEY_GROUPS
                      for state, key in rocks.changed_keys(kg)}
            assert marked == touched
            for target in (StateTable(), RocksDBStateTable(Path(directory) / "target")):
                for key_group, data in snapshot.items():
                    target.load_group(key_group, data)
                for key_group in KEY_GROUPS:
                    apply_delta(target, key_group,
                                encode_delta(rocks, key_group, rocks.changed_keys(key_group)))
                assert_same(target, rocks, metas=False)
                if isinstance(target, RocksDBStateTable):
                    target.close()
        finally:
            rocks.close()


def test_only_mutations_are_marked_and_clearing_keeps_later_epochs(tmp_path: Path) -> None:
    source = registered(StateTable())
    source.apply(3, StateOp("count", OpKind.SET, b"loaded", value=b"1"))
    rocks = registered(RocksDBStateTable(tmp_path / "db", track_changes=True))
    rocks.load_group(3, source.serialize_group(3))  # a snapshot load is no change
    assert list(rocks.changed_keys(3)) == []
    rocks.apply(3, StateOp("count", OpKind.SET, b"a", value=b"1"))
    rocks.apply_columns("pages", OpKind.MAP_PUT, [3], [b"m"], [b"k"], [b"v"])
    ended = rocks.start_change_epoch()
    rocks.apply(3, StateOp("count", OpKind.SET, b"a", value=b"2"))  # in both epochs
    rocks.apply(3, StateOp("count", OpKind.DELETE, b"b"))
    rocks.apply_columns("count", OpKind.SET, [3], [b"c"], values=[b"2"])
    assert sorted(rocks.changed_keys(3)) == [("count", b"a"), ("count", b"b"),
                                             ("count", b"c"), ("pages", b"m")]
    rocks.clear_changes(ended)
    assert sorted(rocks.changed_keys(3)) == [("count", b"a"), ("count", b"b"),
                                             ("count", b"c")]
    # Marks are not entries: counts and key groups are the table's own.
    assert rocks.entry_count() == 4 and rocks.key_groups() == [3]
    rocks.close()


def test_changes_are_complete_only_if_tracked_since_the_store_was_empty(
    tmp_path: Path
) -> None:
    untracked = registered(RocksDBStateTable(tmp_path / "a"))
    untracked.apply(1, StateOp("count", OpKind.SET, b"k", value=b"1"))
    untracked.close()
    late = RocksDBStateTable(tmp_path / "a", track_changes=True)
    assert not late.changes_complete  # the change above was never marked
    late.close()
    tracked = registered(RocksDBStateTable(tmp_path / "b", track_changes=True))
    tracked.apply(1, StateOp("count", OpKind.SET, b"k", value=b"1"))
    tracked.close()
    again = RocksDBStateTable(tmp_path / "b", track_changes=True)
    assert again.changes_complete
    again.close()
    # One untracked writer ends it for good (until the store is emptied).
    RocksDBStateTable(tmp_path / "b").close()
    assert not RocksDBStateTable(tmp_path / "b", track_changes=True).changes_complete


def test_a_deleted_key_is_a_key_without_data_in_the_delta(tmp_path: Path) -> None:
    rocks = registered(RocksDBStateTable(tmp_path / "db", track_changes=True))
    rocks.apply(5, StateOp("pages", OpKind.MAP_PUT, b"gone", b"p", b"1"))
    rocks.apply(5, StateOp("pages", OpKind.DELETE, b"gone"))
    [(meta, _, *_), (_, key, value, values, items)] = list(
        iter_key_group(encode_delta(rocks, 5, rocks.changed_keys(5))))
    assert meta.state == "pages"
    assert (key, value, values, items) == (b"gone", None, None, None)
    rocks.close()


def _chunk(key_group: int, materialization_id: int, chunk_no: int = 0, count: int = 1,
           size: int = 100) -> ChunkRef:
    return ChunkRef(key_group, materialization_id, chunk_no, count, 0, 7, size, 1)


def test_a_layered_handle_orders_its_layers_and_round_trips() -> None:
    chunks = (_chunk(2, 30), _chunk(2, 10, 1, 2), _chunk(2, 10, 0, 2), _chunk(4, 10),
              _chunk(2, 20))
    handle = SnapshotHandle("b", 30, KeyGroupRange(0, 7), "t", chunks, 0)
    assert [[(c.materialization_id, c.chunk_no) for c in layer]
            for layer in handle.layers_of(2)] == [[(10, 0), (10, 1)], [(20, 0)], [(30, 0)]]
    assert handle.layered
    assert SnapshotHandle.from_bytes(handle.to_bytes()) == handle
    whole = SnapshotHandle("b", 10, KeyGroupRange(0, 7), "t", (_chunk(4, 10),), 0)
    assert not whole.layered
    with pytest.raises(ValueError, match="materialization 20 are not one complete set"):
        SnapshotHandle("b", 30, KeyGroupRange(0, 7), "t",
                       (_chunk(2, 10), _chunk(2, 20, 1, 2)), 0)


def test_a_delta_is_worth_writing_while_layers_stay_few_and_small() -> None:
    base = (_chunk(1, 10, size=1000),)
    assert worth_a_delta((base,), 500)
    assert not worth_a_delta((base,), 501)
    assert not worth_a_delta((base, (_chunk(1, 20, size=400),)), 101)
    assert not worth_a_delta((), 1)
    full = tuple((_chunk(1, 10 + i, size=1 if i else 1000),) for i in range(MAX_LAYERS))
    assert not worth_a_delta(full, 1)
