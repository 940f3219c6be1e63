"""The column-wise change decoder gives exactly the rows (and errors) of the per-change path.

``column_change_batches`` (what Spark tasks run in mode ``changes``) against
``change_batches`` over the same records decoded change by change (the reference),
on records built here: every op kind, registrations, the slice's filters, exotic but
valid Avro encodings, garbage. No broker: the records are what the broker would hand
over (``test_change_columns_spark.py`` reads real ones through Spark).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.avro_binary import AvroDecodeError, read_long, zigzag_varint
from kafka_changelog.avro_columns import padded, read_longs
from kafka_changelog.kafka.reader import decode_log_record
from kafka_changelog.kafka.record_columns import FIELDS, record_layout
from kafka_changelog.kafka.record_format import RawChange, empty_value, encode_changes
from kafka_changelog.keys import encode_key
from kafka_changelog.state.schema.kinds import StateKind
from kafka_changelog.state.schema.op_columns import MAX_ITEMS
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from spark_integration.reader import change_columns
from spark_integration.reader.change_columns import column_change_batches
from spark_integration.reader.change_schema import CHANGES_SCHEMA
from spark_integration.reader.rows import change_batches
from spark_integration.reader.scan import OffsetSlice, kept_changes

LOG = "w-1"
#: Sequence numbers 3..9, key groups 64..95 kept.
SLICE = OffsetSlice("log", 2, 0, 10**9, LOG, 64, 95, 3, 9)
META = StateMeta("pages", StateKind.MAP, "int64", "utf8").to_bytes()

Record = tuple[int, bytes]


def reference(records: Sequence[Record], batch_rows: int = 10_000,
              key_types: Sequence[str] | None = None) -> list[pa.RecordBatch]:
    """The per-change path over the records."""
    def changes() -> Iterator[Any]:
        for offset, value in records:
            decoded = decode_log_record(SLICE.topic, SLICE.partition, offset, value, LOG)
            yield from kept_changes(SLICE, offset, decoded)
    return list(change_batches(changes(), "op", 1, SLICE, batch_rows, key_types))


def columns(records: Iterable[Record], batch_rows: int = 10_000,
            key_types: Sequence[str] | None = None) -> list[pa.RecordBatch]:
    return list(column_change_batches(iter(records), "op", 1, SLICE, batch_rows, key_types))


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def assert_same_rows(records: Sequence[Record], batch_rows: int = 10_000,
                     key_types: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Both paths give the same rows, in the same order, in schema-exact batches."""
    expected = reference(records, batch_rows, key_types)
    found = columns(records, batch_rows, key_types)
    assert all(b.schema.equals(CHANGES_SCHEMA) for b in found)
    assert all(0 < b.num_rows <= batch_rows for b in found)
    rows = rows_of(found)
    assert rows == rows_of(expected)
    if expected:
        assert pa.Table.from_batches(found).equals(pa.Table.from_batches(expected))
    return rows


def outcome(run: Any) -> tuple[str, Any]:
    """("rows", the rows) or ("error", type name and message)."""
    try:
        return "rows", rows_of(run())
    except Exception as exc:
        return "error", (type(exc).__name__, str(exc))


def record(changes: Sequence[RawChange], log_id: str = LOG) -> bytes:
    if not changes:
        return empty_value(log_id)
    [one] = encode_changes(log_id, changes)
    return bytes(one.value)


def every_kind() -> list[RawChange]:
    """Each op kind, with and without its optional fields, a registration, and changes the
    slice drops (sequence numbers and key groups outside it)."""
    ops = [
        StateOp("count", OpKind.SET, b"u1", value=(7).to_bytes(8, "big")),
        StateOp("count", OpKind.SET, b"", value=b""),
        StateOp("count", OpKind.DELETE, b"u2"),
        StateOp("pages", OpKind.MAP_PUT, b"u1", b"home", b"\x01" * 300),
        StateOp("pages", OpKind.MAP_REMOVE, b"u3", b"cart"),
        StateOp("events", OpKind.LIST_ADD, b"u1", values=(b"click",)),
        StateOp("events", OpKind.LIST_REPLACE, b"u4", values=()),
        StateOp("events", OpKind.LIST_REPLACE, b"u5", values=tuple(b"x" * i for i in range(70))),
        StateOp("événements", OpKind.LIST_ADD, b"\x00\xff", values=(b"", b"a")),
    ]
    changes: list[RawChange] = [(3, 0, -1, META)]
    for i, op in enumerate(ops):
        changes.append((4, i, 64 + i, op.to_bytes()))
    changes += [(2, 0, 70, ops[0].to_bytes()), (10, 0, 70, ops[0].to_bytes()),
                (5, 0, 63, ops[0].to_bytes()), (5, 1, 96, ops[0].to_bytes()),
                (5, 2, 95, ops[2].to_bytes()), (9, 0, -1, META)]
    return changes


# -- the common case -----------------------------------------------------------------------------


def test_every_op_kind_and_registrations_give_the_reference_rows() -> None:
    records = [(100, record(every_kind())), (101, record([])), (103, record(every_kind()))]
    rows = assert_same_rows(records)
    assert len(rows) == 2 * 12
    assert rows[0] == {
        "operator": "op", "subtask": 1, "log_id": LOG, "key_group": None, "topic": "log",
        "partition": 2, "offset": 100, "sequence_number": 3, "position": 0, "op": "META",
        "state": "pages", "key": None, "map_key": None, "value": META, "values": None,
        "key_decoded": None}
    assert [(r["op"], r["state"], r["key"], r["map_key"], r["values"]) for r in rows[1:12]] == [
        ("SET", "count", b"u1", None, None),
        ("SET", "count", b"", None, None),
        ("DELETE", "count", b"u2", None, None),
        ("MAP_PUT", "pages", b"u1", b"home", None),
        ("MAP_REMOVE", "pages", b"u3", b"cart", None),
        ("LIST_ADD", "events", b"u1", None, [b"click"]),
        ("LIST_REPLACE", "events", b"u4", None, []),
        ("LIST_REPLACE", "events", b"u5", None, [b"x" * i for i in range(70)]),
        ("LIST_ADD", "événements", b"\x00\xff", None, [b"", b"a"]),
        ("DELETE", "count", b"u2", None, None),
        ("META", "pages", None, None, None),
    ]
    assert [r["value"] for r in rows[1:5]] == [(7).to_bytes(8, "big"), b"", None, b"\x01" * 300]
    assert [r["offset"] for r in rows] == [100] * 12 + [103] * 12


def test_the_common_encodings_never_take_the_per_change_path(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = rows_of(reference([(7, record(every_kind()))]))

    def refuse(*args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        raise AssertionError("the per-change path was taken")

    monkeypatch.setattr(change_columns, "change_batches", refuse)
    assert rows_of(columns([(7, record(every_kind()))])) == expected


@pytest.mark.parametrize("batch_rows", [1, 5, 12, 13, 10_000])
def test_batches_hold_at_most_batch_rows(batch_rows: int) -> None:
    records = [(offset, record(every_kind())) for offset in range(0, 40, 3)]
    rows = assert_same_rows(records, batch_rows)
    assert len(rows) == 12 * len(records)


def test_a_range_over_many_records_in_several_groups() -> None:
    op = StateOp("count", OpKind.SET, b"k", value=b"v")
    records = [(offset, record([(4, i, 64 + i % 32, op.to_bytes()) for i in range(997)]))
               for offset in range(25)]
    rows = assert_same_rows(records, 1000)
    assert len(rows) == 25 * 997
    assert [r["position"] for r in rows[995:999]] == [995, 996, 0, 1]


def test_nothing_to_read_gives_no_batch() -> None:
    assert columns([]) == []
    assert columns([(5, record([]))]) == []
    dropped = StateOp("count", OpKind.DELETE, b"u").to_bytes()
    assert columns([(5, record([(1, 0, 70, dropped), (4, 0, 7, dropped)]))]) == []


def test_key_decoded_follows_the_recorded_key_types() -> None:
    ids = [encode_key((n,), ("bigint",)) for n in (7, 7, -2)]
    changes: list[RawChange] = [(3, 0, -1, META)] + [
        (4, i, 70, StateOp("count", OpKind.DELETE, key).to_bytes())
        for i, key in enumerate([*ids, b"odd"])]
    rows = assert_same_rows([(1, record(changes))], key_types=("bigint",))
    assert [r["key_decoded"] for r in rows] == [None, "7", "7", "-2", None]
    assert [r["key_decoded"] for r in assert_same_rows([(1, record(changes))])] == [None] * 5


# -- valid encodings other writers may produce -----------------------------------------------


def _long(value: int, extra: int = 0) -> bytes:
    """The Avro long, with ``extra`` needless continuation bytes (non-minimal, valid)."""
    encoded = bytearray(zigzag_varint(value))
    for _ in range(extra):
        encoded[-1] |= 0x80
        encoded.append(0)
    return bytes(encoded)


def _blob(data: bytes, extra: int = 0) -> bytes:
    return _long(len(data), extra) + data


def test_non_minimal_varints_and_multi_block_arrays_read_like_the_reference() -> None:
    # StateOp: state "s", LIST_ADD, key "k" (length in 3 bytes), no map key, value
    # present, values in two blocks of one item each.
    op = (_blob(b"s", 2) + _long(2, 1) + _blob(b"k", 2) + _long(0, 1) + _long(1) + _blob(b"v")
          + _long(1) + _long(1) + _blob(b"a") + _long(1) + _blob(b"b", 4) + _long(0, 3))
    # ChangeBatch: the changes' fields non-minimal too, in two blocks (left to the
    # per-change path) and in one (read column-wise).
    fields = [_long(4, 5) + _long(0, 1) + _long(70, 2) + _long(len(op), 1),
              _long(5) + _long(1) + _long(-1, 1) + _long(len(META)),
              _long(6) + _long(2) + _long(71) + _long(len(op))]
    payloads = _blob(op + META + op, 1)
    blocks = (_blob(LOG.encode()) + _long(1) + fields[0] + _long(2) + fields[1] + fields[2]
              + _long(0, 2) + payloads)
    one_block = _blob(LOG.encode()) + _long(3, 1) + b"".join(fields) + _long(0, 2) + payloads
    rows = assert_same_rows([(9, blocks), (10, one_block)])
    assert [(r["sequence_number"], r["position"], r["key_group"]) for r in rows] == [
        (4, 0, 70), (5, 1, None), (6, 2, 71)] * 2
    assert rows[0]["values"] == [b"a", b"b"] and rows[0]["value"] == b"v"
    assert rows[3]["values"] == [b"a", b"b"] and rows[3]["value"] == b"v"


def test_encodings_left_to_the_per_change_path_read_like_the_reference() -> None:
    # A block of values with its byte size (negative count), a list longer than MAX_ITEMS,
    # a ChangeBatch block with its byte size.
    sized = (_blob(b"s") + _long(2) + _blob(b"k") + _long(0) + _long(0) + _long(1)
             + _long(-2) + _long(4) + _blob(b"a") + _blob(b"b") + _long(0))
    long_list = StateOp("s", OpKind.LIST_REPLACE, b"k",
                        values=tuple(b"%d" % i for i in range(MAX_ITEMS + 1))).to_bytes()
    common = StateOp("s", OpKind.DELETE, b"k").to_bytes()
    inner = _long(4) + _long(0) + _long(70) + _long(len(common))
    sized_batch = (_blob(LOG.encode()) + _long(-1) + _long(len(inner)) + inner + _long(0)
                   + _blob(common))
    records = [(1, record([(4, 0, 70, sized), (4, 1, 70, common)])),
               (2, record([(4, 0, 70, long_list)])), (3, sized_batch),
               (4, record([(4, 0, 71, common)]))]
    rows = assert_same_rows(records)
    assert rows[0]["values"] == [b"a", b"b"]
    assert len(rows[2]["values"]) == MAX_ITEMS + 1
    assert [r["offset"] for r in rows] == [1, 1, 2, 3, 4]


# -- errors ----------------------------------------------------------------------------------


def test_an_undecodable_payload_or_record_fails_as_in_the_reference() -> None:
    good = record(every_kind())
    bad_op = record([(4, 0, 70, StateOp("s", OpKind.DELETE, b"k").to_bytes()),
                     (4, 1, 70, b"\xff\xff")])
    bad_meta = record([(4, 0, -1, b"\xff")])
    bad_name = record([(4, 0, 70, b"\x02\xff\x02\x02k\x00\x00\x00")])
    for value, message in [
        (bad_op, "change 1 of change set 4 (log w-1) is not a state op"),
        (bad_meta, "change 0 of change set 4 (log w-1) is not a registration"),
        (bad_name, "change 0 of change set 4 (log w-1) is not a state op"),
        (b"\x06w-1\x02", "not a change_batch Avro value"),
        (good + b"\x00", "trailing bytes after the batch"),
        (record(every_kind(), log_id="w-2"), "record key says log w-1 but value says w-2"),
    ]:
        records = [(10, good), (11, value)]
        expected = outcome(lambda records=records: reference(records))
        assert expected[0] == "error" and message in expected[1][1], expected
        assert expected[1][0] == "RecordDecodeError" and "log[2]@11" in expected[1][1]
        assert outcome(lambda records=records: columns(records)) == expected


def test_garbage_the_slice_drops_is_never_decoded() -> None:
    records = [(1, record([(1, 0, 70, b"\xff"), (4, 0, 10, b"\xff\xff"),
                           (4, 1, 70, StateOp("s", OpKind.DELETE, b"k").to_bytes())]))]
    assert len(assert_same_rows(records)) == 1


# -- properties ------------------------------------------------------------------------------

blobs = st.binary(max_size=40)
state_ops = st.builds(
    StateOp,
    state=st.sampled_from(["count", "pages", "ü"]) | st.text(min_size=1, max_size=8),
    op=st.sampled_from(list(OpKind)),
    key=blobs,
    map_key=st.none() | blobs,
    value=st.none() | blobs,
    values=st.none() | st.lists(blobs, max_size=6).map(tuple),
)
payloads = st.one_of(state_ops.map(StateOp.to_bytes), st.just(META),
                     st.binary(max_size=12))
changes = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 70_000),
                             st.sampled_from([-1, 0, 63, 64, 80, 95, 96, 2**20]), payloads),
                   max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.lists(changes, min_size=1, max_size=4), st.integers(1, 30),
       st.sampled_from([None, ("string",), ("bigint",)]), st.booleans())
def test_any_records_give_the_reference_rows_or_error(
    batches: list[list[RawChange]], batch_rows: int, key_types: Sequence[str] | None,
    corrupt: bool
) -> None:
    records = [(10 + i, record(c)) for i, c in enumerate(batches)]
    if corrupt:
        offset, value = records[-1]
        records[-1] = (offset, value[: len(value) // 2])
    expected = outcome(lambda: reference(records, batch_rows, key_types))
    found = outcome(lambda: columns(records, batch_rows, key_types))
    assert found == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 3)), max_size=20))
def test_column_longs_read_what_read_long_reads(values: list[tuple[int, int]]) -> None:
    # At most 10 bytes each: longer varints are refused (next test).
    data = b"".join(_long(v, min(extra, 10 - len(_long(v)))) for v, extra in values)
    buffer, limit = padded(data)
    positions, pos = [], 0
    expected = []
    for _ in values:
        positions.append(pos)
        value, pos = read_long(data, pos)
        expected.append((value, pos))
    read = read_longs(buffer, limit, np.array(positions, np.int64))
    assert read is not None
    assert list(zip(read[0].tolist(), read[1].tolist(), strict=True)) == expected


@pytest.mark.parametrize("data", [
    b"\x80" * 10 + b"\x01",         # 11 bytes
    b"\xff" * 9 + b"\x02",          # beyond 64 bits
    b"\x80\x80",                    # runs past the end
])
def test_column_longs_refuse_what_read_long_refuses(data: bytes) -> None:
    with pytest.raises(AvroDecodeError):
        read_long(data, 0)
    buffer, limit = padded(data)
    if data == b"\x80\x80":
        # Past the end the padding reads as a value; the callers' end checks refuse it.
        read = read_longs(buffer, limit, np.array([0], np.int64))
        assert read is not None and int(read[1][0]) > limit
        return
    assert read_longs(buffer, limit, np.array([0], np.int64)) is None


def test_record_layout_finds_every_change_or_refuses() -> None:
    value = record(every_kind())
    layout = record_layout(value, LOG.encode())
    assert layout is not None and layout.changes == len(every_kind())
    assert int(layout.field_starts[0]) == 1 + len(LOG) + len(_long(len(every_kind())))
    assert layout.field_starts.size == FIELDS * len(every_kind())
    payloads = b"".join(change[3] for change in every_kind())
    assert value[layout.payloads_start:] == payloads == value[-layout.payloads_size:]
    assert record_layout(value, b"w-2") is None
    assert record_layout(value[:-1], LOG.encode()) is None
    assert record_layout(value + b"\x00", LOG.encode()) is None


