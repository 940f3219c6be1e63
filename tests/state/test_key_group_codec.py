"""The hand-written key group snapshot codec is Avro (fastavro with
``schemas/key_group_state.avsc``), byte for byte, and reads any valid encoding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.avro_binary import AvroDecodeError, encode_bytes, encode_string
from kafka_changelog.serialization import decode, encode, load_schema
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.key_group_codec import (
    KINDS,
    SHAPE_LIST,
    SHAPE_MAP,
    SHAPE_VALUE,
    TICK_ENTRIES,
    StateLoad,
    assemble_key_group,
    encode_entries,
    encode_key_group,
    encode_value_entries,
    iter_key_group,
    load_key_group,
    shape_of,
)
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.tables.protocol import Entry

small = st.binary(max_size=80)
big = st.binary(min_size=60, max_size=300)  # lengths past one varint byte
blob = st.one_of(small, big)
entry = st.one_of(blob, st.lists(blob, max_size=4),
                  st.dictionaries(blob, blob, max_size=4).map(lambda d: dict(sorted(d.items()))))
meta = st.builds(StateMeta, st.text(max_size=20), st.sampled_from(KINDS),
                 st.text(max_size=10), st.one_of(st.none(), st.text(max_size=10)))
states = st.lists(st.tuples(meta, st.dictionaries(small, entry, max_size=5)), max_size=4)


def record_of(tables: list[tuple[StateMeta, dict[bytes, Entry]]]) -> dict[str, Any]:
    """The record fastavro writes from (what the tables serialized before this codec)."""
    out = []
    for table_meta, entries in tables:
        records = []
        for key in sorted(entries):
            value = entries[key]
            records.append({
                "key": key,
                "value": value if isinstance(value, bytes) else None,
                "values": value if isinstance(value, list) else None,
                "map": ([{"key": k, "value": v} for k, v in value.items()]
                        if isinstance(value, dict) else None)})
        if records:
            out.append({"meta": table_meta.to_record(), "entries": records})
    return {"states": out}


def decoded(data: bytes) -> list[tuple[Any, ...]]:
    return list(iter_key_group(data))


def expected(tables: list[tuple[StateMeta, dict[bytes, Entry]]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for table_meta, entries in tables:
        if not entries:
            continue
        out.append((table_meta, None, None, None, None))
        for key in sorted(entries):
            value = entries[key]
            out.append((table_meta, key, value if isinstance(value, bytes) else None,
                        value if isinstance(value, list) else None,
                        list(value.items()) if isinstance(value, dict) else None))
    return out


@settings(max_examples=300, deadline=None)
@given(states)
def test_encoding_is_fastavros_and_decoding_gives_it_back(
    tables: list[tuple[StateMeta, dict[bytes, Entry]]]
) -> None:
    data = encode_key_group((m, ((k, e[k]) for k in sorted(e))) for m, e in tables)
    assert data == encode("key_group_state", record_of(tables))
    assert decoded(data) == expected(tables)
    assert decode("key_group_state", data) == record_of(tables)


def test_the_kinds_are_the_schemas_symbols_in_order() -> None:
    schema = load_schema("key_group_state")
    kind = schema["fields"][0]["type"]["items"]["fields"][0]["type"]["fields"][1]["type"]
    assert [k.value for k in KINDS] == kind["symbols"]


def test_blocks_with_byte_sizes_and_several_blocks_are_read() -> None:
    """Avro lets a writer split arrays into blocks and give a block's byte size (a negative
    count); fastavro never does, other writers may."""
    meta = StateMeta("s", StateKind.LIST, "bytes")
    head = encode_string("s") + b"\x02" + encode_string("bytes") + b"\x00"
    item_a, item_b = encode_bytes(b"a"), encode_bytes(b"bb")
    values = (b"\x01" + bytes([2 * len(item_a)]) + item_a  # count -1, size, one item
              + b"\x02" + item_b + b"\x00")  # then a block of one, then the end
    entry = encode_bytes(b"k") + b"\x00" + b"\x02" + values + b"\x00"
    data = b"\x02" + head + b"\x02" + entry + b"\x00" + b"\x00"
    assert decoded(data) == [(meta, None, None, None, None),
                             (meta, b"k", None, [b"a", b"bb"], None)]


@pytest.mark.parametrize(("data", "message"), [
    (b"", "truncated"),
    (encode_key_group([(StateMeta("s", StateKind.VALUE, "b"), [(b"k", b"v")])])[:-3],
     "truncated"),
    (encode_key_group([(StateMeta("s", StateKind.VALUE, "b"), [(b"k", b"v")])]) + b"\x00",
     "1 trailing bytes"),
    (b"\x02" + encode_string("s") + b"\x0e", "enum index 7"),
    (b"\x02" + encode_string("s") + b"\x00" + encode_string("b") + b"\x04",
     "union index byte 0x4"),
])
def test_malformed_snapshots_are_refused_naming_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(AvroDecodeError, match=message):
        decoded(data)


def test_an_empty_key_group_is_one_byte() -> None:
    assert encode_key_group([]) == encode_key_group(
        [(StateMeta("s", StateKind.VALUE, "b"), [])]) == b"\x00"
    assert decoded(b"\x00") == []


def loaded(data: bytes, with_map_start: bool) -> tuple[list[tuple[Any, ...]], int]:
    """What ``load_key_group`` stores, recorded: puts and entries of other shapes."""
    stored: list[tuple[Any, ...]] = []

    def state(meta: StateMeta) -> StateLoad:
        stored.append(("state", meta))

        def other(key: bytes, value: bytes | None, values: list[bytes] | None,
                  items: list[tuple[bytes, bytes]] | None) -> int:
            stored.append(("other", key, value, values, items))
            return 0 if value is None and values is None and items is None else 1

        return StateLoad(shape_of(meta.kind), b"<" + meta.state.encode() + b">",
                         lambda key, value: stored.append(("put", key, value)), other,
                         list_value=tuple,
                         map_start=(lambda key: b"[" + key + b"]") if with_map_start else None)

    return stored, load_key_group(data, state)


def expected_loads(data: bytes, with_map_start: bool) -> tuple[list[tuple[Any, ...]], int]:
    """The same, from :func:`iter_key_group` and the rules of :class:`StateLoad`."""
    out: list[tuple[Any, ...]] = []
    count = 0
    for meta, key, value, values, items in iter_key_group(data):
        if key is None:
            out.append(("state", meta))
            continue
        prefix = b"<" + meta.state.encode() + b">"
        shape = shape_of(meta.kind)
        if shape == SHAPE_VALUE and value is not None and values is None and items is None:
            out.append(("put", prefix + key, value))
        elif shape == SHAPE_LIST and value is None and values is not None and items is None:
            out.append(("put", prefix + key, tuple(values)))
        elif shape == SHAPE_MAP and value is None and values is None and items is not None:
            if not with_map_start:
                out.append(("put", prefix + key, dict(items)))
            else:
                out.extend(("put", b"[" + key + b"]" + k, v) for k, v in items)
            count += len(items)  # a map's entries each
            continue
        else:
            out.append(("other", key, value, values, items))
            if value is None and values is None and items is None:
                continue
        count += 1
    return out, count


@settings(max_examples=300, deadline=None)
@given(states, st.booleans())
def test_load_key_group_stores_exactly_what_iter_key_group_reads(
    tables: list[tuple[StateMeta, dict[bytes, Entry]]], with_map_start: bool
) -> None:
    """The inline loader (one loop per state, the usual shape of each kind read without
    helper calls) agrees with the generic decoder on every shape, length and kind."""
    data = encode_key_group((m, ((k, e[k]) for k in sorted(e))) for m, e in tables)
    assert loaded(data, with_map_start) == expected_loads(data, with_map_start)


def test_load_key_group_reads_values_of_every_varint_length() -> None:
    meta = StateMeta("s", StateKind.VALUE, "bytes")
    entries = [(bytes([i]) * (i % 90), bytes([i]) * size)
               for i, size in enumerate([0, 1, 63, 64, 127, 128, 8191, 8192, 20_000])]
    entries.sort()
    data = encode_key_group([(meta, entries)])
    stored, count = loaded(data, True)
    assert count == len(entries)
    assert stored == [("state", meta)] + [("put", b"<s>" + k, v) for k, v in entries]


def test_load_key_group_ticks_and_refuses_malformed_snapshots() -> None:
    meta = StateMeta("s", StateKind.VALUE, "bytes")
    data = encode_key_group([(meta, [(b"%08d" % i, b"v") for i in range(20_000)])])
    ticks: list[int] = []
    count = load_key_group(data, lambda m: StateLoad(SHAPE_VALUE, b"", lambda k, v: None,
                                                     lambda *a: 1),
                           lambda: ticks.append(1))
    assert count == 20_000 and len(ticks) == 20_000 // TICK_ENTRIES
    for broken, message in [(data[:-3], "truncated"), (data + b"\x00", "1 trailing bytes"),
                            (data[:len(data) // 2], "truncated")]:
        with pytest.raises(AvroDecodeError, match=message):
            load_key_group(broken, lambda m: StateLoad(SHAPE_VALUE, b"", lambda k, v: None,
                                                       lambda *a: 1))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(blob, blob, max_size=6), st.binary(max_size=5))
def test_value_entries_from_stored_keys_encode_as_entries_do(
    entries: dict[bytes, bytes], prefix: bytes
) -> None:
    ordered = sorted(entries.items())
    stored = [(prefix + key, value) for key, value in ordered]
    assert encode_value_entries(stored, len(prefix)) == encode_entries(ordered)
    meta = StateMeta("s", StateKind.VALUE, "bytes")
    assert assemble_key_group([(meta, *encode_value_entries(stored, len(prefix)))]) == (
        encode_key_group([(meta, ordered)]))


def test_load_key_group_reads_lists_and_maps_of_every_item_count_and_length() -> None:
    """Item counts and lengths around one varint byte (63, 64): the inline list and map
    reads and the general one agree."""
    lists = StateMeta("l", StateKind.LIST, "bytes")
    maps = StateMeta("m", StateKind.MAP, "bytes", "bytes")
    sizes = [0, 1, 63, 64, 65]
    list_entries = [(b"k%d-%d" % (n, size), [bytes([n % 7]) * size] * n)
                    for n in sizes for size in (0, 63, 64)]
    map_entries = [(b"k%d-%d" % (n, size), {b"%03d" % i + b"x" * size: b"v" * size
                                            for i in range(n)})
                   for n in sizes for size in (0, 60, 64)]
    data = encode_key_group([(lists, sorted(list_entries)), (maps, sorted(map_entries))])
    for with_map_start in (True, False):
        assert loaded(data, with_map_start) == expected_loads(data, with_map_start)
