"""The hand-written ChangeBatch decoder reads exactly what Avro (fastavro) reads."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.avro_binary import AvroDecodeError, encode_bytes, encode_string, varint
from kafka_changelog.kafka.record_format import decode_record_changes, encode_value

SCHEMA = fastavro.parse_schema(json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "change_batch.avsc").read_text()))

raw_changes = st.lists(st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 32767), st.integers(-(2**31), 2**31 - 1)),
    st.binary(max_size=300),
), max_size=40)


#: Every error says what the value is not, then what is wrong.
PREFIX = r"^not a change_batch Avro value: "


def avro_bytes(log_id: str, changes: list[tuple[int, int, int, bytes]]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, SCHEMA, {"log_id": log_id, "changes": [
        {"sequence_number": s, "index": i, "key_group": k, "payload": p}
        for s, i, k, p in changes]})
    return out.getvalue()


def avro_read(data: bytes) -> Any:
    buffer = io.BytesIO(data)
    record = fastavro.schemaless_reader(buffer, SCHEMA, None)
    assert buffer.tell() == len(data)
    return record


@given(st.text(max_size=60), raw_changes)
def test_reads_what_avro_writes(log_id: str, changes: list[tuple[int, int, int, bytes]]) -> None:
    data = avro_bytes(log_id, changes)
    assert decode_record_changes(data) == (log_id, changes)


written_changes = st.lists(st.tuples(
    st.integers(0, 2**63 - 1), st.integers(0, 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 32767)), st.binary(max_size=300)), max_size=40)


@given(st.text(max_size=20), written_changes)
def test_reads_what_the_encoder_writes(log_id: str,
                                       changes: list[tuple[int, int, int, bytes]]) -> None:
    assert decode_record_changes(encode_value(log_id, changes)) == (log_id, changes)


def change_bytes(sqn: int, index: int, key_group: int, payload: bytes) -> bytes:
    return varint(sqn) + varint(index) + varint(key_group) + encode_bytes(payload)


def test_multi_block_and_sized_block_arrays_are_read() -> None:
    first = change_bytes(7, 0, 3, b"a")
    second = change_bytes(7, 1, 100, b"bc")
    third = change_bytes(8, 0, -1, b"")
    data = (encode_string("log") + varint(1) + first  # a block of one
            + varint(-2) + varint(len(second + third)) + second + third  # a sized block
            + b"\x00")
    expected = [(7, 0, 3, b"a"), (7, 1, 100, b"bc"), (8, 0, -1, b"")]
    assert decode_record_changes(data) == ("log", expected)
    record = avro_read(data)
    assert [(c["sequence_number"], c["index"], c["key_group"], c["payload"])
            for c in record["changes"]] == expected


def test_every_truncation_is_an_error_naming_the_field() -> None:
    data = encode_value("log-1", [(5, 0, 70, b"payload"), (5, 1, 2, b"x" * 200)])
    for cut in range(len(data)):
        with pytest.raises(AvroDecodeError, match=PREFIX + r"truncated (length of )?\S+"):
            decode_record_changes(data[:cut])


@pytest.mark.parametrize(("data", "message"), [
    (encode_value("l", [(1, 0, 0, b"p")]) + b"\x00",
     PREFIX + r"malformed ChangeBatch: 1 trailing bytes after byte 9$"),
    (encode_string("l") + varint(1) + varint(1) + varint(0) + varint(0) + varint(-3),
     PREFIX + r"malformed LoggedChange.payload: negative length -3 at "
     r"byte 6$"),
    (encode_string("l") + b"\xff" * 11,
     PREFIX + r"malformed ChangeBatch.changes block count: the varint at byte 2 is "
     r"longer than 10 bytes$"),
    (b"\x04\xff\xfe" + b"\x00",
     PREFIX + r"malformed ChangeBatch.log_id at byte 0: not UTF-8"),
], ids=["trailing", "negative-length", "long-varint", "utf8"])
def test_malformed_values_are_named(data: bytes, message: str) -> None:
    with pytest.raises(AvroDecodeError, match=message):
        decode_record_changes(data)


@settings(max_examples=300)
@given(st.binary(max_size=80))
def test_garbage_is_an_error_or_what_avro_reads(data: bytes) -> None:
    try:
        log_id, changes = decode_record_changes(data)
    except AvroDecodeError:
        return
    record = avro_read(data)
    assert (log_id, changes) == (record["log_id"], [
        (c["sequence_number"], c["index"], c["key_group"], c["payload"])
        for c in record["changes"]])
