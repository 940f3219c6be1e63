"""The hand-written record encoder is byte-identical to Avro (fastavro) with the schema file."""

from __future__ import annotations

import io
import json
from pathlib import Path
from unittest import mock

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_changelog.kafka import record_format
from kafka_changelog.kafka.record_format import (
    CHANGE_OVERHEAD_BYTES,
    ChangeColumns,
    UnknownSchemaError,
    check_schema_header,
    empty_value,
    encode_changes,
    encode_records,
)
from tests.record_helpers import LoggedChange, decode_record

SCHEMA = fastavro.parse_schema(json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "change_batch.avsc").read_text()))

changes = st.lists(st.builds(
    LoggedChange,
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 32767)),
    st.binary(max_size=300),
), max_size=40)


#: The mean payload size from which records are joined in Python, not laid out by Arrow:
#: every test of the encoder runs with both layouts.
LAYOUTS = pytest.mark.parametrize("arrow_below", [record_format.ARROW_LAYOUT_BELOW_BYTES, 0],
                                  ids=["arrow", "join"])


@LAYOUTS
@given(log_id=st.text(max_size=80), batch=changes)
def test_encoder_matches_avro(arrow_below: int, log_id: str, batch: list[LoggedChange]) -> None:
    with mock.patch.object(record_format, "ARROW_LAYOUT_BELOW_BYTES", arrow_below):
        check_encoding(log_id, batch)


def check_encoding(log_id: str, batch: list[LoggedChange]) -> None:
    expected = io.BytesIO()
    fastavro.schemaless_writer(expected, SCHEMA, {"log_id": log_id, "changes": [
        {"sequence_number": c.sequence_number, "index": c.position, "key_group": c.key_group,
         "payload": c.payload} for c in batch]})
    if not batch:
        assert empty_value(log_id) == expected.getvalue()
        assert decode_record(empty_value(log_id)) == (log_id, [])
        assert encode_changes(log_id, batch) == []
        return
    [record] = encode_changes(log_id, batch)
    assert bytes(record.value) == expected.getvalue()
    assert decode_record(bytes(record.value)) == (log_id, batch)


def test_records_stay_below_the_bound_and_describe_themselves() -> None:
    batch = [LoggedChange(7 + i // 10, i % 10, i % 4, b"x" * 100) for i in range(100)]
    records = encode_changes("log-a", batch, 1024)
    assert all(len(r.value) <= 1024 for r in records)
    assert [c for r in records for c in decode_record(bytes(r.value))[1]] == batch
    first = records[0]
    headers = dict(first.headers)
    assert headers["kc.log_id"] == b"log-a"
    assert headers["kc.sequence_numbers"] == b"7-7"
    assert headers["kc.key_groups"] == b"0-3"
    assert headers["kc.schema"] == b"change_batch/1"
    assert first.members == (7,)
    [meta_only] = encode_changes("log-a", [LoggedChange(1, 0, -1, b"m")])
    assert dict(meta_only.headers)["kc.key_groups"] == b"-1--1"


def test_schema_header_is_checked() -> None:
    check_schema_header([("kc.schema", b"change_batch/1")])
    with pytest.raises(UnknownSchemaError, match="'change_batch/2' is not supported"):
        check_schema_header([("kc.schema", b"change_batch/2")])
    with pytest.raises(UnknownSchemaError, match=r"no kc\.schema header"):
        check_schema_header([])


@LAYOUTS
@given(batch=changes.filter(bool), bound=st.integers(40, 2000),
       breaks=st.lists(st.integers(0, 40), max_size=4))
def test_records_split_at_breaks_and_at_the_bound(
    arrow_below: int, batch: list[LoggedChange], bound: int, breaks: list[int]
) -> None:
    with mock.patch.object(record_format, "ARROW_LAYOUT_BELOW_BYTES", arrow_below):
        check_split(batch, bound, breaks)


def check_split(batch: list[LoggedChange], bound: int, breaks: list[int]) -> None:
    batch.sort(key=lambda c: (c.sequence_number, c.position))
    records = encode_records("log-b", ChangeColumns.of(batch), bound, breaks)
    firsts = [first for first, _ in records]
    assert firsts[0] == 0 and firsts == sorted(set(firsts))
    assert {b for b in breaks if 0 < b < len(batch)} <= set(firsts)
    decoded = []
    for (first, record), stop in zip(records, [*firsts[1:], len(batch)], strict=True):
        _, held = decode_record(bytes(record.value))
        assert held == batch[first:stop]
        cost = sum(len(c.payload) + CHANGE_OVERHEAD_BYTES for c in held)
        assert cost <= bound or len(held) == 1
        groups = [c.key_group for c in held if not c.is_meta] or [-1]
        assert record.key_groups == (min(groups), max(groups))
        assert record.sequence_numbers == (held[0].sequence_number, held[-1].sequence_number)
        assert record.members == tuple(sorted({c.sequence_number for c in held}))
        decoded += held
    assert decoded == batch
