"""A changelog replayed column-wise gives what the change-by-change replay gives: the same
entries, entry count, registrations and changed key groups, in the memory and the RocksDB
table, whatever the mix of states, op kinds, registrations and key groups; what the
column-wise decoder leaves to the per-change path is left with nothing applied. The same
for a restore's tail collected column-wise to be merged into the snapshot."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog import KeyGroupRange
from kafka_changelog.avro_columns import padded
from kafka_changelog.change import StateChange
from kafka_changelog.change_columns import DecodedChanges
from kafka_changelog.state.backend.column_replay import collect_columns, replay_columns
from kafka_changelog.state.backend.restore import collect_changes, replay_changes
from kafka_changelog.state.errors import StateMismatchError
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.op_run import OpRun
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

from .test_rocksdb_table import KEY_GROUPS, METAS, assert_same, op_strategy

#: The range replayed: some of KEY_GROUPS fall outside it.
RANGE = KeyGroupRange(1, 256)


def decoded(changes: list[StateChange]) -> DecodedChanges:
    """``changes`` as a reader decodes them column-wise."""
    data = b"".join(c.payload for c in changes)
    lengths = np.array([len(c.payload) for c in changes], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    buffer, limit = padded(data)
    return DecodedChanges(data, buffer, limit,
                          np.array([c.key_group for c in changes], np.int64), starts, lengths)


def log_of(ops: list[tuple[int, StateOp]], registered_at: list[int]) -> list[StateChange]:
    """The ops as changes, each registration of METAS placed before the op at its index."""
    changes: list[StateChange] = []
    for index, (key_group, op) in enumerate(ops):
        for meta, at in zip(METAS, registered_at, strict=True):
            if at == index:
                changes.append(StateChange.meta(meta.to_bytes()))
        changes.append(StateChange(key_group, op.to_bytes()))
    for meta, at in zip(METAS, registered_at, strict=True):
        if at >= len(ops):
            changes.append(StateChange.meta(meta.to_bytes()))
    return changes


def both_tables(directory: str) -> list[tuple[KeyedStateTable, KeyedStateTable]]:
    """(reference, column-wise) pairs: memory and RocksDB."""
    return [(StateTable(), StateTable()),
            (RocksDBStateTable(Path(directory) / "reference", track_changes=True),
             RocksDBStateTable(Path(directory) / "columns", track_changes=True))]


def replay_both(reference: KeyedStateTable, columns: KeyedStateTable,
                changes: list[StateChange]) -> tuple[set[int], set[int], str, str]:
    expected: set[int] = set()
    found: set[int] = set()
    expected_error = error = ""
    try:
        replay_changes(reference, changes, RANGE, expected)
    except StateMismatchError as exc:
        expected_error = str(exc)
    try:
        # As a restore does: what the column-wise replay leaves goes change by change.
        if not replay_columns(columns, decoded(changes), RANGE, found):
            replay_changes(columns, decoded(changes).changes(), RANGE, found)
    except StateMismatchError as exc:
        error = str(exc)
    return expected, found, expected_error, error


def assert_replays_alike(changes: list[StateChange]) -> None:
    """Replayed into fresh tables (memory, RocksDB) column-wise and change by change, the
    log gives the same tables, changed key groups and no error."""
    with tempfile.TemporaryDirectory() as directory:
        for reference, columns in both_tables(directory):
            try:
                expected, found, expected_error, error = replay_both(reference, columns,
                                                                     changes)
                assert (found, error, expected_error) == (expected, "", "")
                assert_same(columns, reference)
                assert columns.entry_count() == reference.entry_count() > 0
            finally:
                reference.close()
                columns.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(op_strategy(), max_size=80),
       st.lists(st.integers(min_value=0, max_value=80), min_size=len(METAS),
                max_size=len(METAS)),
       st.lists(op_strategy(), max_size=20), st.booleans())
def test_a_column_wise_replay_gives_what_the_per_change_replay_gives(
        ops: list[tuple[int, StateOp]], registered_at: list[int],
        before: list[tuple[int, StateOp]], registered_before: bool) -> None:
    """On top of state already there (``before``) or into empty tables, with registrations
    anywhere in the log (an op of a state not yet registered fails both ways, at the same
    op)."""
    changes = log_of(ops, registered_at)
    with tempfile.TemporaryDirectory() as directory:
        for reference, columns in both_tables(directory):
            try:
                for table in (reference, columns) if registered_before else ():
                    for meta in METAS:
                        table.register(meta)
                    replay_changes(table, [StateChange(kg, op.to_bytes()) for kg, op in before],
                                   KeyGroupRange(0, 32767), set())
                expected, found, expected_error, error = replay_both(reference, columns,
                                                                     changes)
                assert error == expected_error
                if not error:
                    assert found == expected
                assert_same(columns, reference)
                if isinstance(columns, RocksDBStateTable):
                    assert isinstance(reference, RocksDBStateTable)
                    assert list(columns.changed_keys_by_group()) == list(
                        reference.changed_keys_by_group())
            finally:
                reference.close()
                columns.close()


def test_registrations_and_ops_of_other_key_groups_are_kept_as_the_reference_keeps_them(
        ) -> None:
    ops = [(kg, StateOp("count", OpKind.SET, b"k%d" % kg, value=b"%d" % kg))
           for kg in KEY_GROUPS]
    changes = log_of(ops, [0, 0, 0, 0])
    memory = StateTable()
    changed: set[int] = set()
    assert replay_columns(memory, decoded(changes), RANGE, changed)
    assert changed == {1, 255, 256}
    assert memory.key_groups() == [1, 255, 256]
    assert dict(memory.metas) == {meta.state: meta for meta in METAS}
    assert memory.get(255, "count", b"k255") == b"255"


def test_ops_whose_fields_are_present_for_some_only_apply_op_by_op() -> None:
    """A run of one state and kind with a field present in some ops only is applied
    through ``apply_batch``: what each op says, in order."""
    ops = [(1, StateOp("count", OpKind.SET, b"a", value=b"1")),
           (1, StateOp("count", OpKind.SET, b"b", value=b"2")),
           (1, StateOp("count", OpKind.SET, b"c", value=b"3")),
           # A value a DELETE does not need, in one of the two.
           (1, StateOp("count", OpKind.DELETE, b"a", value=b"ignored")),
           (1, StateOp("count", OpKind.DELETE, b"b"))]
    assert_replays_alike(log_of(ops, [0, 0, 0, 0]))


#: Op payloads the column-wise decoder leaves to the per-change one.
LEFT_TO_PER_CHANGE = [
    # An array block with its byte size (count -1, 2 bytes): valid Avro, read per change.
    b"\x0cevents\x04\x02a\x00\x00\x02\x01\x04\x02x\x00",
    b"\x0acount\x00\x02a\x00\x02\x02",  # truncated: the per-change decoder names the field
]


def log_ending_with(payload: bytes) -> list[StateChange]:
    """Every registration, a valid op, then ``payload`` as an op."""
    return [*(StateChange.meta(meta.to_bytes()) for meta in METAS),
            StateChange(1, StateOp("count", OpKind.SET, b"a", value=b"1").to_bytes()),
            StateChange(1, payload)]


@pytest.mark.parametrize("payload", LEFT_TO_PER_CHANGE)
def test_what_the_column_wise_decoder_leaves_is_left_with_nothing_applied(
        payload: bytes) -> None:
    memory = StateTable()
    changed: set[int] = set()
    assert not replay_columns(memory, decoded(log_ending_with(payload)), RANGE, changed)
    assert (memory.key_groups(), dict(memory.metas), changed) == ([], {}, set())


def test_a_registration_that_conflicts_fails_as_the_per_change_replay_fails() -> None:
    conflicting = StateMeta("count", METAS[2].kind, "utf8")
    changes = [StateChange.meta(METAS[0].to_bytes()),
               StateChange(1, StateOp("count", OpKind.SET, b"a", value=b"1").to_bytes()),
               StateChange.meta(conflicting.to_bytes())]
    reference, columns = StateTable(), StateTable()
    _, _, expected_error, error = replay_both(reference, columns, changes)
    assert expected_error and error == expected_error
    assert_same(columns, reference)


def test_interleaved_states_and_alternating_kinds_replay_as_logged() -> None:
    """A per-key function's log: each key's ops of four states one after the other, a map
    whose entries are removed and put in turn (as timers move), deletes between: long runs
    per state go column-wise, the alternating ones op by op, with the reference's result."""
    ops: list[tuple[int, StateOp]] = []
    for i in range(300):
        key, group = b"k%d" % (i % 120), KEY_GROUPS[1 + i % 3]
        ops += [(group, StateOp("count", OpKind.SET, key, value=b"%d" % i)),
                (group, StateOp("events", OpKind.LIST_ADD, key, values=(b"e%d" % i,))),
                (group, StateOp("pages", OpKind.MAP_REMOVE, key, b"p%d" % (i - 1))),
                (group, StateOp("pages", OpKind.MAP_PUT, key, b"p%d" % i, b"%d" % i))]
        if i % 50 == 49:
            ops.append((group, StateOp("count", OpKind.DELETE, key)))
            ops.append((group, StateOp("events", OpKind.LIST_REPLACE, key, values=())))
    assert_replays_alike(log_of(ops, [0, 0, 0, 0]))


def collected_both(changes: list[StateChange]
                   ) -> tuple[StateTable, dict[int, list[OpRun]], dict[int, list[OpRun]]]:
    """The tail of ``changes`` collected change by change (registrations into the table
    returned) and column-wise (into a table of its own, checked to match)."""
    reference, columns = StateTable(), StateTable()
    by_change: dict[int, list[OpRun]] = {}
    by_column: dict[int, list[OpRun]] = {}
    collect_changes(reference, changes, RANGE, by_change)
    assert collect_columns(columns, decoded(changes), RANGE, by_column)
    assert dict(columns.metas) == dict(reference.metas)
    return reference, by_change, by_column


@settings(max_examples=60, deadline=None)
@given(st.lists(op_strategy(), max_size=80), st.lists(op_strategy(), max_size=40),
       st.lists(st.integers(min_value=0, max_value=80), min_size=len(METAS),
                max_size=len(METAS)))
def test_a_tail_collected_column_wise_merges_as_one_collected_change_by_change(
        ops: list[tuple[int, StateOp]], snapshot_ops: list[tuple[int, StateOp]],
        registered_at: list[int]) -> None:
    """A restore's merged tail (``load_groups``): collected column-wise, the same key
    groups, entries, count and changed keys as collected change by change, and as the
    log replayed after the snapshot (registrations anywhere: both collectors register
    them all before any op is applied)."""
    changes = log_of(ops, registered_at)
    _, by_change, by_column = collected_both(changes)
    assert set(by_column) == set(by_change) == {kg for kg, _ in ops if RANGE.contains(kg)}
    memory = StateTable()
    for meta in METAS:
        memory.register(meta)
    for key_group, op in snapshot_ops:
        memory.apply(key_group, op)
    snapshots = [(kg, memory.serialize_group(kg)) for kg in memory.key_groups()]
    with tempfile.TemporaryDirectory() as directory:
        tables = [RocksDBStateTable(Path(directory) / name, track_changes=True)
                  for name in ("columns", "changes", "replayed")]
        try:
            for table in tables:
                for meta in METAS:
                    table.register(meta)
            tables[0].load_groups(snapshots, by_column)
            tables[1].load_groups(snapshots, by_change)
            for key_group, data in snapshots:
                tables[2].load_group(key_group, data)
            replay_changes(tables[2], [c for c in changes if not c.is_meta], RANGE, set())
            for table in tables[:2]:
                assert_same(table, tables[2])
                assert table.entry_count() == tables[2].entry_count()
                assert list(table.changed_keys_by_group()) == list(
                    tables[2].changed_keys_by_group())
        finally:
            for table in tables:
                table.close()


def test_a_tail_is_collected_in_runs_of_one_key_group_state_and_kind() -> None:
    """Per key group, each state's ops in log order, cut where the kind changes; a field
    present for some ops of a run only is None for the others."""
    ops = [(1, StateOp("count", OpKind.SET, b"a", value=b"1")),
           (2, StateOp("count", OpKind.SET, b"b", value=b"2")),
           (1, StateOp("pages", OpKind.MAP_PUT, b"a", b"m", b"3")),
           (1, StateOp("count", OpKind.SET, b"c", value=b"4")),
           (1, StateOp("count", OpKind.DELETE, b"a", value=b"ignored")),
           (1, StateOp("count", OpKind.DELETE, b"c")),
           (1, StateOp("count", OpKind.SET, b"a", value=b"5")),
           (0, StateOp("count", OpKind.SET, b"z", value=b"out of range"))]
    _, _, tail = collected_both(log_of(ops, [0, 0, 0, 0]))
    assert tail == {
        1: [OpRun("count", OpKind.SET, [b"a", b"c"], None, [b"1", b"4"]),
            OpRun("count", OpKind.DELETE, [b"a", b"c"], None, [b"ignored", None]),
            OpRun("count", OpKind.SET, [b"a"], None, [b"5"]),
            OpRun("pages", OpKind.MAP_PUT, [b"a"], [b"m"], [b"3"])],
        2: [OpRun("count", OpKind.SET, [b"b"], None, [b"2"])]}


@pytest.mark.parametrize("payload", LEFT_TO_PER_CHANGE)
def test_what_the_column_wise_decoder_leaves_is_left_with_nothing_collected(
        payload: bytes) -> None:
    memory = StateTable()
    tail: dict[int, list[OpRun]] = {}
    assert not collect_columns(memory, decoded(log_ending_with(payload)), RANGE, tail)
    assert (dict(memory.metas), tail) == ({}, {})
