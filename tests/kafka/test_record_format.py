"""The hand-written record encoder is byte-identical to Avro (fastavro) with the schema file;
the column-wise decoder agrees with the per-change one; 0.2.0's records convert exactly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_changelog.avro_binary import varint
from kafka_changelog.avro_columns import padded
from kafka_changelog.kafka.record_columns import (
    ChangeFilter,
    RecordGroup,
    kept_columns,
    record_layout,
)
from kafka_changelog.kafka.record_format import (
    CHANGE_OVERHEAD_BYTES,
    ChangeColumns,
    UnknownSchemaError,
    check_schema_header,
    current_value,
    empty_value,
    encode_changes,
    encode_records,
)
from tests.record_helpers import LoggedChange, decode_record

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SCHEMA = fastavro.parse_schema(json.loads((SCHEMAS / "change_batch.avsc").read_text()))
LEGACY_SCHEMA = fastavro.parse_schema(json.loads((SCHEMAS / "change_batch_v1.avsc").read_text()))

changes = st.lists(st.builds(
    LoggedChange,
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 32767)),
    st.binary(max_size=300),
), max_size=40)


@given(log_id=st.text(max_size=80), batch=changes)
def test_encoder_matches_avro(log_id: str, batch: list[LoggedChange]) -> None:
    expected = io.BytesIO()
    fastavro.schemaless_writer(expected, SCHEMA, {"log_id": log_id, "changes": [
        {"sequence_number": c.sequence_number, "index": c.position, "key_group": c.key_group,
         "payload_size": len(c.payload)} for c in batch],
        "payloads": b"".join(c.payload for c in batch)})
    if not batch:
        assert empty_value(log_id) == expected.getvalue()
        assert decode_record(empty_value(log_id)) == (log_id, [])
        assert encode_changes(log_id, batch) == []
        return
    [record] = encode_changes(log_id, batch)
    assert record.value == expected.getvalue()
    assert decode_record(record.value) == (log_id, batch)


def legacy_value(log_id: str, batch: list[LoggedChange]) -> bytes:
    """A record value as kafka-changelog 0.2.0 wrote it (``change_batch/1``)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, LEGACY_SCHEMA, {"log_id": log_id, "changes": [
        {"sequence_number": c.sequence_number, "index": c.position, "key_group": c.key_group,
         "payload": c.payload} for c in batch]})
    return out.getvalue()


@given(log_id=st.text(max_size=80), batch=changes)
def test_a_legacy_record_converts_to_the_same_changes(log_id: str,
                                                      batch: list[LoggedChange]) -> None:
    converted = current_value(legacy_value(log_id, batch), 1)
    assert decode_record(converted) == (log_id, batch)
    assert converted == (encode_changes(log_id, batch)[0].value if batch
                         else empty_value(log_id))
    assert current_value(converted, 2) is converted


def test_a_malformed_legacy_record_is_refused() -> None:
    value = legacy_value("log-a", [LoggedChange(1, 0, 3, b"abc")])
    with pytest.raises(ValueError, match="not a change_batch_v1 Avro value"):
        current_value(value[:-2], 1)
    with pytest.raises(ValueError, match="1 trailing bytes after the batch"):
        current_value(value + b"\x00", 1)


def raw_value(log_id: bytes, fields: bytes, count: int, payloads: bytes) -> bytes:
    """A record value from hand-written fields (``count`` changes' varints, one block)."""
    return b"".join((varint(len(log_id)), log_id, varint(count), fields,
                     b"\x00" if count else b"", varint(len(payloads)), payloads))


def test_payload_sizes_must_add_up() -> None:
    [record] = encode_changes("log-a", [(1, 0, 3, b"abc"), (1, 1, 4, b"de")])
    # Fields of the two changes: sequence number 1, index 0 and 1, key group 3 and 4,
    # payload sizes 3 and 2 (zig-zag varints).
    assert record.value == raw_value(b"log-a", b"\x02\x00\x06\x06\x02\x02\x08\x04", 2,
                                     b"abcde")
    with pytest.raises(ValueError, match="not a change_batch Avro value"):
        decode_record(record.value[:-1])
    short = raw_value(b"log-a", b"\x02\x00\x06\x06\x02\x02\x08\x04", 2, b"abcd")
    with pytest.raises(ValueError, match="add up to 5 bytes but payloads holds 4"):
        decode_record(short)
    negative = raw_value(b"log-a", b"\x02\x00\x06\x05\x02\x02\x08\x10", 2, b"abcde")
    with pytest.raises(ValueError, match="payload_size is negative: -3"):
        decode_record(negative)
    for bad in (record.value[:-1], short, negative):
        assert column_changes([bad], log_id="log-a") is None


EVERY_CHANGE = ChangeFilter(0, 2**63 - 1, 0, 32767)


def column_changes(values: list[bytes], log_id: str = "log-c",
                   kept: ChangeFilter = EVERY_CHANGE) -> list[LoggedChange] | None:
    """The changes the column-wise decoder finds in ``values`` (None: it leaves them to
    the per-change decoder)."""
    group = RecordGroup()
    for offset, value in enumerate(values):
        group.add(offset, value, log_id.encode())
    if not group.columnar:
        return None
    data = b"".join(values)
    buffer, limit = padded(data)
    columns = kept_columns(group, buffer, limit, kept)
    if columns is None:
        return None
    return [LoggedChange(int(s), int(i), int(k), data[a:a + n]) for s, i, k, a, n in zip(
        columns.sequence_numbers, columns.positions, columns.key_groups,
        columns.payload_starts, columns.payload_lengths, strict=True)]


@given(batches=st.lists(changes, max_size=5),
       low=st.integers(0, 2**63 - 1), high=st.integers(0, 32767))
def test_the_column_wise_decoder_agrees_with_the_per_change_one(
    batches: list[list[LoggedChange]], low: int, high: int
) -> None:
    values = [encode_changes("log-c", batch)[0].value if batch else empty_value("log-c")
              for batch in batches]
    expected = [c for batch in batches for c in batch
                if c.sequence_number >= low and (c.is_meta or c.key_group <= high)]
    assert column_changes(values, kept=ChangeFilter(low, 2**63 - 1, 0, high)) == expected


def test_the_column_wise_decoder_leaves_what_it_does_not_read() -> None:
    [record] = encode_changes("log-c", [(1, 0, 3, b"abc"), (1, 1, 4, b"de")])
    value = record.value
    assert column_changes([value]) == [LoggedChange(1, 0, 3, b"abc"),
                                       LoggedChange(1, 1, 4, b"de")]
    assert column_changes([value], log_id="log-d") is None  # another log's
    assert column_changes([value[:-1]]) is None  # truncated
    assert column_changes([value + b"\x00"]) is None  # trailing bytes
    # The same changes in two array blocks: valid Avro, left to the per-change decoder.
    split = (b"\x0alog-c\x02\x02\x00\x06\x06" + b"\x02\x02\x02\x08\x04\x00"
             + b"\x0aabcde")
    assert decode_record(split) == ("log-c", [(1, 0, 3, b"abc"), (1, 1, 4, b"de")])
    assert record_layout(split, b"log-c") is None
    # A key group beyond an Avro int: left to the per-change decoder too.
    wide = raw_value(b"log-c", b"\x02\x00" + varint(2**40) + b"\x06", 1, b"abc")
    assert column_changes([wide], kept=ChangeFilter(0, 2**63 - 1, 0, 2**62)) is None


def test_records_stay_below_the_bound_and_describe_themselves() -> None:
    batch = [LoggedChange(7 + i // 10, i % 10, i % 4, b"x" * 100) for i in range(100)]
    records = encode_changes("log-a", batch, 1024)
    assert all(len(r.value) <= 1024 for r in records)
    assert [c for r in records for c in decode_record(r.value)[1]] == batch
    first = records[0]
    headers = dict(first.headers)
    assert headers["kc.log_id"] == b"log-a"
    assert headers["kc.sequence_numbers"] == b"7-7"
    assert headers["kc.key_groups"] == b"0-3"
    assert headers["kc.schema"] == b"change_batch/2"
    assert first.members == (7,)
    [meta_only] = encode_changes("log-a", [LoggedChange(1, 0, -1, b"m")])
    assert dict(meta_only.headers)["kc.key_groups"] == b"-1--1"


def test_schema_header_is_checked() -> None:
    assert check_schema_header([("kc.schema", b"change_batch/2")]) == 2
    assert check_schema_header([("kc.schema", "change_batch/1")]) == 1
    with pytest.raises(UnknownSchemaError, match="'change_batch/3' is not supported"):
        check_schema_header([("kc.schema", b"change_batch/3")])
    with pytest.raises(UnknownSchemaError, match=r"no kc\.schema header"):
        check_schema_header([])


@given(batch=changes.filter(bool), bound=st.integers(40, 2000),
       breaks=st.lists(st.integers(0, 40), max_size=4))
def test_records_split_at_breaks_and_at_the_bound(
    batch: list[LoggedChange], bound: int, breaks: list[int]
) -> None:
    batch.sort(key=lambda c: (c.sequence_number, c.position))
    records = encode_records("log-b", ChangeColumns.of(batch), bound, breaks)
    firsts = [first for first, _ in records]
    assert firsts[0] == 0 and firsts == sorted(set(firsts))
    assert {b for b in breaks if 0 < b < len(batch)} <= set(firsts)
    decoded = []
    for (first, record), stop in zip(records, [*firsts[1:], len(batch)], strict=True):
        _, held = decode_record(record.value)
        assert held == batch[first:stop]
        cost = sum(len(c.payload) + CHANGE_OVERHEAD_BYTES for c in held)
        assert cost <= bound or len(held) == 1
        groups = [c.key_group for c in held if not c.is_meta] or [-1]
        assert record.key_groups == (min(groups), max(groups))
        assert record.sequence_numbers == (held[0].sequence_number, held[-1].sequence_number)
        assert record.members == tuple(sorted({c.sequence_number for c in held}))
        decoded += held
    assert decoded == batch
