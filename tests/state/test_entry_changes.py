"""What a state write's rows become (``entry_changes.state_ops``): the ops a backend would
log for them, and the refusals that name the state, key and column (pure: no Kafka; the
ops applied through a restore are checked in ``tests/spark/test_state_writer.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kafka_changelog.keygroups import key_group_for_key
from kafka_changelog.state.history.entry_changes import (
    EntryChange,
    StateWriteError,
    WrittenChanges,
    WrittenUnits,
    colliding_units,
    state_ops,
    unit_hash,
)
from kafka_changelog.state.schema.descriptors import list_state, map_state, value_state
from kafka_changelog.state.schema.evolution import requested_meta
from kafka_changelog.state.schema.ops import (
    DELETE,
    LIST_REPLACE,
    MAP_PUT,
    MAP_REMOVE,
    SET,
    StateMeta,
    StateOp,
)
from kafka_changelog.state.schema.serializers import INT64, UTF8
from kafka_changelog.state.time.timers import TIMERS_STATE

COUNT = value_state("count", INT64)
EVENTS = list_state("events", UTF8)
PAGES = map_state("pages", UTF8, INT64)
SEEN = value_state("seen", INT64, ttl=60.0)
METAS: dict[str, StateMeta] = {d.name: requested_meta(d) for d in (COUNT, EVENTS, PAGES, SEEN)}


def ops(*changes: EntryChange) -> list[StateOp]:
    found = list(state_ops(changes, METAS, WrittenUnits(sorted(METAS))))
    assert [group for group, _ in found] == [key_group_for_key(op.key, 128) for _, op in found]
    return [op for _, op in found]


def test_each_kind_of_row_is_the_op_a_backend_logs() -> None:
    assert ops(EntryChange("count", b"u1", b"\x01"), EntryChange("count", b"u2", None)) == [
        StateOp("count", SET, b"u1", value=b"\x01"), StateOp("count", DELETE, b"u2")]
    # A list's rows, in any order, are its new list in list_index order.
    assert ops(EntryChange("events", b"u1", b"b", list_index=1),
               EntryChange("events", b"u1", b"a", list_index=0),
               EntryChange("events", b"u2", None)) == [
        StateOp("events", LIST_REPLACE, b"u1", values=(b"a", b"b")),
        StateOp("events", DELETE, b"u2")]
    assert ops(EntryChange("pages", b"u1", b"\x02", map_key=b"home"),
               EntryChange("pages", b"u1", None, map_key=b"cart"),
               EntryChange("pages", b"u2", None)) == [
        StateOp("pages", MAP_PUT, b"u1", map_key=b"home", value=b"\x02"),
        StateOp("pages", MAP_REMOVE, b"u1", map_key=b"cart"),
        StateOp("pages", DELETE, b"u2")]
    # A TTL'd state's value is stored behind its expiry (8 bytes, big endian, ms).
    assert ops(EntryChange("seen", b"u1", b"\x07", expires_at_ms=1000)) == [
        StateOp("seen", SET, b"u1", value=(1000).to_bytes(8, "big") + b"\x07")]


@pytest.mark.parametrize(("changes", "message"), [
    ([EntryChange("pages", b"u1", None), EntryChange("pages", b"u1", b"2", map_key=b"m")],
     "state 'pages' key b'u1': a row deleting the whole map and rows of its entries"),
    ([EntryChange("pages", b"u1", b"2")],
     "state 'pages' key b'u1': a map state's row with a value needs a map_key"),
    ([EntryChange("events", b"u1", b"a"), EntryChange("events", b"u1", b"b")],
     r"state 'events' key b'u1': 2 list elements need distinct list_index values to be put "
     r"in order \(found \[None, None\]\)"),
    ([EntryChange("events", b"u1", b"a", list_index=0), EntryChange("events", b"u1", None)],
     "a list row without value deletes the list and must be its key's only row"),
    ([EntryChange("events", b"u1", b"a", map_key=b"m")],
     "column map_key is for map states; this state is a LIST"),
    ([EntryChange("count", b"u1", b"1", list_index=0)],
     "column list_index must be null for a VALUE state"),
    ([EntryChange("seen", b"u1", b"1")],
     "state 'seen' key b'u1': the state has a TTL, so each row with a value needs "
     "expires_at"),
    ([EntryChange("count", b"u1", b"1", expires_at_ms=5)],
     "column expires_at must be null: the state has no TTL"),
    ([EntryChange("visits", b"u1", b"1")],
     r"state 'visits' is not a registered state of the application \(known: \['count', "
     r"'events', 'pages', 'seen'\]\): declare it"),
    ([EntryChange(TIMERS_STATE, b"u1", b"1")],
     "holds the timers, which a state write does not write"),
])
def test_rows_that_do_not_say_one_thing_are_refused_naming_why(
        changes: list[EntryChange], message: str) -> None:
    with pytest.raises(StateWriteError, match=message):
        ops(*changes)


def test_entries_written_twice_are_named_by_state_and_task() -> None:
    def written(*units: tuple[str, bytes, bytes | None]) -> WrittenChanges:
        states = sorted(METAS)
        return WrittenChanges(b"", states, np.array([unit_hash(*u) for u in units], np.uint64),
                              np.array([states.index(u[0]) for u in units], np.int32))

    apart: list[tuple[int, Any]] = [
        (0, written(("count", b"u1", None), ("pages", b"u1", b"m"))),
        (1, written(("count", b"u2", None), ("pages", b"u1", b"n"))),
        (2, WrittenChanges(None))]
    assert colliding_units(apart) is None
    both = [*apart, (3, written(("count", b"u2", None), ("pages", b"u1", b"m")))]
    assert colliding_units(both) == (
        "2 entries have more than one row (state 'count': in Spark task(s) [1, 3]; "
        "state 'pages': in Spark task(s) [0, 3]); each entry may be written once per state "
        "write (drop the duplicates)")
    # Twice in one task: a value's key, a map entry (the ops are made; the driver refuses).
    units = WrittenUnits(sorted(METAS))
    list(state_ops([EntryChange("count", b"u1", b"1"), EntryChange("count", b"u1", b"2"),
                    EntryChange("pages", b"u1", b"1", map_key=b"m"),
                    EntryChange("pages", b"u1", b"2", map_key=b"m"),
                    EntryChange("pages", b"u1", b"2", map_key=b"n")], METAS, units))
    one = WrittenChanges(b"", sorted(METAS), np.frombuffer(units.hashes, np.uint64),
                         np.frombuffer(units.states, np.int32))
    assert colliding_units([(5, one)]) == (
        "2 entries have more than one row (state 'count': in Spark task(s) [5]; "
        "state 'pages': in Spark task(s) [5]); each entry may be written once per state "
        "write (drop the duplicates)")
    assert unit_hash("a", b"b", None) != unit_hash("a", b"b", b"")
