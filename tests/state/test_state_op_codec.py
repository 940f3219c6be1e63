"""The hand-written StateOp codec is Avro (fastavro with ``schemas/state_op.avsc``), byte for byte.

Also the primitives of ``kafka_changelog.avro_binary`` it is built from, and the errors
for payloads that are not exactly one StateOp.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import pickle
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.avro_binary import (
    AvroDecodeError,
    encode_bytes,
    encode_string,
    read_bytes,
    read_long,
    read_string,
    varint,
    zigzag_varint,
)
from kafka_changelog.errors import ChangelogError
from kafka_changelog.serialization import load_schema
from kafka_changelog.state.schema import ops as ops_module
from kafka_changelog.state.schema.ops import OpKind, StateOp

SCHEMA = load_schema("state_op")


def avro_bytes(op: StateOp) -> bytes:
    """What fastavro writes for ``op``."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, SCHEMA, {
        "state": op.state, "op": op.op.value, "key": op.key, "map_key": op.map_key,
        "value": op.value, "values": list(op.values) if op.values is not None else None,
    })
    return buffer.getvalue()


def avro_read(data: bytes) -> StateOp | None:
    """What fastavro reads from ``data`` as one StateOp (None: it fails or leaves bytes)."""
    buffer = io.BytesIO(data)
    try:
        r = fastavro.schemaless_reader(buffer, SCHEMA, None)
    except Exception:  # fastavro raises several types for garbage
        return None
    if buffer.tell() != len(data) or not isinstance(r, dict):
        return None
    values = r["values"]
    return StateOp(r["state"], OpKind(r["op"]), r["key"], r["map_key"], r["value"],
                   tuple(values) if values is not None else None)


def decode_outcome(decoder: Any, data: bytes) -> StateOp | str:
    """The op ``decoder`` reads, or the message of the AvroDecodeError it raises."""
    try:
        return decoder(data)  # type: ignore[no-any-return]
    except AvroDecodeError as exc:
        return f"error: {exc}"


def via_general_decoder(data: bytes) -> StateOp:
    return ops_module._decode_any(StateOp, data)


# Lengths and counts on both sides of the one-byte varint (64) and of the caches.
blobs = st.binary(max_size=70) | st.binary(min_size=1020, max_size=1030)
state_ops = st.builds(
    StateOp,
    state=st.text(max_size=70),
    op=st.sampled_from(list(OpKind)),
    key=blobs,
    map_key=st.none() | blobs,
    value=st.none() | blobs,
    values=st.none() | st.lists(st.binary(max_size=70), max_size=70).map(tuple),
)

#: state "s", op LIST_ADD (index 2), key b"k", no map key, no value, values present.
LIST_ADD_HEAD = b"\x02s" + b"\x04" + b"\x02k" + b"\x00" + b"\x00" + b"\x02"


def test_op_kinds_are_the_schema_symbols_in_order() -> None:
    op_field = next(f for f in SCHEMA["fields"] if f["name"] == "op")
    assert [kind.value for kind in OpKind] == op_field["type"]["symbols"]


@settings(max_examples=400)
@given(state_ops)
def test_encoding_is_fastavros_and_decodes_back(op: StateOp) -> None:
    expected = avro_bytes(op)
    assert op.to_bytes() == expected
    assert StateOp.from_bytes(expected) == op
    assert via_general_decoder(expected) == op  # the path for unusual encodings, too


def test_large_lengths_and_counts_beyond_every_cache() -> None:
    op = StateOp("s" * 20_000, OpKind.LIST_REPLACE, b"k" * 17_000, b"m" * 2_000,
                 b"v" * 16_384, tuple(bytes([i % 256]) * (i % 5) for i in range(1_500)))
    assert op.to_bytes() == avro_bytes(op)
    assert StateOp.from_bytes(op.to_bytes()) == op


def test_empty_and_absent_values_differ() -> None:
    empty = StateOp("s", OpKind.LIST_REPLACE, b"k", values=())
    absent = StateOp("s", OpKind.DELETE, b"k")
    assert empty.to_bytes() == avro_bytes(empty) == b"\x02s\x06\x02k\x00\x00\x02\x00"
    assert StateOp.from_bytes(empty.to_bytes()).values == ()
    assert StateOp.from_bytes(absent.to_bytes()).values is None


def test_fastavro_writes_one_block_then_the_end_marker() -> None:
    op = StateOp("s", OpKind.LIST_ADD, b"k", values=(b"a", b"b"))
    assert avro_bytes(op) == LIST_ADD_HEAD + b"\x04" + b"\x02a\x02b" + b"\x00"


def test_bytes_like_input_is_read_into_bytes() -> None:
    op = StateOp("count", OpKind.MAP_PUT, b"user", b"home", b"\x00" * 8)
    data = op.to_bytes()
    for view in (bytearray(data), memoryview(data)):
        decoded = StateOp.from_bytes(view)  # type: ignore[arg-type]
        assert decoded == op and type(decoded.key) is bytes and type(decoded.value) is bytes


@pytest.mark.parametrize(("blocks", "items"), [
    # two blocks with plain counts
    (b"\x02" + b"\x02a" + b"\x04" + b"\x02b\x02c", [b"a", b"b", b"c"]),
    # a negative count (-2) is followed by the block's size in bytes (4)
    (b"\x03" + b"\x08" + b"\x02a\x02b", [b"a", b"b"]),
    # mixed: sized block, plain block, sized block of one empty item
    (b"\x03\x08\x02a\x02b" + b"\x02\x02c" + b"\x01\x02\x00", [b"a", b"b", b"c", b""]),
    # 65 items in one block: the count takes two varint bytes
    (b"\x82\x01" + b"\x02x" * 65, [b"x"] * 65),
], ids=["two-blocks", "sized-block", "mixed", "two-byte-count"])
def test_multi_block_arrays_are_read(blocks: bytes, items: list[bytes]) -> None:
    payload = LIST_ADD_HEAD + blocks + b"\x00"
    expected = StateOp("s", OpKind.LIST_ADD, b"k", values=tuple(items))
    assert avro_read(payload) == expected  # fastavro agrees it is valid Avro
    assert StateOp.from_bytes(payload) == expected


def test_non_minimal_varints_are_read() -> None:
    # The op index 2 as a two-byte varint, then the map key union index 0 likewise.
    payload = b"\x02s" + b"\x84\x00" + b"\x02k" + b"\x80\x00" + b"\x00" + b"\x00"
    expected = StateOp("s", OpKind.LIST_ADD, b"k")
    assert avro_read(payload) == expected
    assert StateOp.from_bytes(payload) == expected


def test_every_truncation_is_an_error_naming_it() -> None:
    data = StateOp("count", OpKind.LIST_REPLACE, b"user-1", b"mk", b"val",
                   (b"a", b"b" * 70)).to_bytes()
    for end in range(len(data)):
        with pytest.raises(AvroDecodeError, match=r"^truncated (length of |block count of )?"
                                                  r"StateOp\.(state|op|key|map_key|value|"
                                                  r"values): "):
            StateOp.from_bytes(data[:end])


@pytest.mark.parametrize(("payload", "message"), [
    (b"", r"^truncated length of StateOp\.state: the varint at byte 0 runs past the end of "
          r"the 0-byte input$"),
    (b"\x0acount\x00\x10user", r"^truncated StateOp\.key: 8 bytes from byte 8, but only 4 "
                               r"left$"),
    (b"\x02s\x00\x02k\x02", r"^truncated length of StateOp\.map_key: the varint at byte 6 "
                            r"runs past the end of the 6-byte input$"),
    (b"\x02s\x00\x02k", r"^truncated StateOp\.map_key: the varint at byte 5 runs past the end "
                        r"of the 5-byte input$"),
    (b"\x02s\x0e\x02k\x00\x00\x00", r"^malformed StateOp\.op: enum index 7 is not one of the 6 "
                                    r"symbols \(SET, DELETE, LIST_ADD, LIST_REPLACE, MAP_PUT, "
                                    r"MAP_REMOVE\)$"),
    (b"\x02s\x01\x02k\x00\x00\x00", r"^malformed StateOp\.op: enum index -1 is not one of"),
    (b"\x02s\x00\x02k\x04\x00\x00", r"^malformed StateOp\.map_key: union index 2 is neither 0 "
                                    r"\(null\) nor 1 \(bytes\)$"),
    (b"\x02s\x00\x02k\x00\x00\x06", r"^malformed StateOp\.values: union index 3 is neither 0 "
                                    r"\(null\) nor 1 \(array\)$"),
    (b"\x02s\x00\x03k\x00\x00\x00", r"^malformed StateOp\.key: negative length -2 at byte 3$"),
    (b"\x02\xff\x00\x02k\x00\x00\x00", r"^malformed StateOp\.state at byte 0: not UTF-8"),
    (b"\x02s\x00\x02k\x00\x00\x00\x00\x00", r"^2 trailing bytes after the StateOp \(it ends at "
                                            r"byte 8 of 10\)$"),
    (LIST_ADD_HEAD + b"\x03\x06\x02a\x02b\x00", r"^malformed StateOp\.values: the block at byte "
                                                r"8 says it has 3 bytes but its 2 items take 4$"),
    (LIST_ADD_HEAD + b"\x03\x03\x02a\x02b\x00", r"^malformed StateOp\.values: negative block "
                                                r"size -2 at byte 8$"),
    (b"\x02s" + b"\xff" * 11, r"^malformed StateOp\.op: the varint at byte 2 is longer than 10 "
                              r"bytes$"),
    (b"\x02s" + b"\xff" * 9 + b"\x7f", r"^malformed StateOp\.op: the varint at byte 2 exceeds "
                                       r"64 bits$"),
], ids=["empty", "key", "map-key-length", "map-key", "enum", "negative-enum", "map-key-union",
        "values-union", "negative-length", "utf8", "trailing", "block-size",
        "negative-block-size", "long-varint", "wide-varint"])
def test_malformed_payloads_raise_naming_what(payload: bytes, message: str) -> None:
    with pytest.raises(AvroDecodeError, match=message) as caught:
        StateOp.from_bytes(payload)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ChangelogError)


@settings(max_examples=500)
@given(st.binary(max_size=40) | state_ops.map(lambda op: op.to_bytes()[:-1] + b"\x00"))
def test_garbage_is_an_error_or_what_avro_reads(data: bytes) -> None:
    outcome = decode_outcome(StateOp.from_bytes, data)
    # The fast path and the general decoder agree, on errors too.
    assert outcome == decode_outcome(via_general_decoder, data)
    if isinstance(outcome, StateOp):
        assert avro_read(data) == outcome


# -- the dataclass itself --------------------------------------------------------------------


def test_the_hand_written_init_has_the_dataclass_signature() -> None:
    parameters = list(inspect.signature(StateOp).parameters.values())
    fields = dataclasses.fields(StateOp)
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]


def test_state_op_stays_a_frozen_value() -> None:
    op = StateOp("count", OpKind.SET, b"k", value=b"v")
    assert op == StateOp("count", OpKind.SET, b"k", None, b"v", None)
    assert hash(op) == hash(StateOp("count", OpKind.SET, b"k", value=b"v"))
    assert op != StateOp("count", OpKind.SET, b"k", value=b"w")
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.key = b"x"  # type: ignore[misc]
    assert dataclasses.replace(op, key=b"x").key == b"x"
    assert pickle.loads(pickle.dumps(op)) == op == copy.copy(op)
    assert repr(op) == ("StateOp(state='count', op=<OpKind.SET: 'SET'>, key=b'k', "
                        "map_key=None, value=b'v', values=None)")


# -- primitives -------------------------------------------------------------------------------

LONG = fastavro.parse_schema({"type": "long"})
int64 = st.integers(-(2**63), 2**63 - 1)


def avro_long(value: int) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, LONG, value)
    return buffer.getvalue()


@given(int64 | st.integers(-2, 20_000))
def test_longs_are_avros(value: int) -> None:
    encoded = avro_long(value)
    assert varint(value) == zigzag_varint(value) == encoded
    assert read_long(encoded + b"rest", 0) == (value, len(encoded))
    assert read_long(memoryview(b"xx" + encoded), 2) == (value, 2 + len(encoded))


@given(st.binary(max_size=200), st.text(max_size=100))
def test_bytes_and_strings_are_avros(data: bytes, text: str) -> None:
    raw_buffer, text_buffer = io.BytesIO(), io.BytesIO()
    fastavro.schemaless_writer(raw_buffer, "bytes", data)
    fastavro.schemaless_writer(text_buffer, "string", text)
    assert encode_bytes(data) == raw_buffer.getvalue()
    assert encode_string(text) == text_buffer.getvalue()
    view = memoryview(b"." + encode_bytes(data))
    found, end = read_bytes(view, 1)
    assert (found, end) == (data, len(view)) and type(found) is bytes
    assert read_string(bytearray(encode_string(text)), 0)[0] == text


def test_primitive_errors_name_what_was_read() -> None:
    with pytest.raises(AvroDecodeError, match=r"^truncated offset: the varint at byte 1 runs "
                                              r"past the end of the 2-byte input$"):
        read_long(b"\x00\x80", 1, "offset")
    with pytest.raises(AvroDecodeError, match=r"^truncated name: 3 bytes from byte 1, but only "
                                              r"1 left$"):
        read_string(b"\x06a", 0, "name")
    with pytest.raises(AvroDecodeError, match=r"^malformed blob: negative length -1 at byte 0$"):
        read_bytes(b"\x01", 0, "blob")
