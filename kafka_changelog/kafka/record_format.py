"""The changelog record: one writer's changes for one partition, self-describing for tools.

Key: the log id (UTF-8). Value: a ``ChangeBatch`` (``schemas/change_batch.avsc``,
schemaless Avro binary), column-wise: the changes' fixed fields (sequence number,
index, key group, payload size), then their payloads laid end to end. A reader finds
every change's fields and payload with a few NumPy passes per record
(:mod:`.record_columns`), never a Python step per change. Headers say what the record
holds without decoding it, so ``kcat -f '%k %h'`` shows it: ``kc.log_id``,
``kc.key_groups`` and ``kc.sequence_numbers`` (``first-last``, inclusive) and
``kc.schema`` (``change_batch/2``).

Records of kafka-changelog 0.2.0 (``change_batch/1``, ``schemas/change_batch_v1.avsc``:
each change's fields and payload together) are still read: the reader converts each one
to the current layout as it arrives (:func:`current_value`), so everything after it
decodes one layout.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import fastavro
import numpy as np

from ..avro_binary import varint
from ..avro_columns import Int64s, varint_rows
from ..change import META_KEY_GROUP
from ..serialization import HEADER_SCHEMA, load_schema

SCHEMA_NAME = "change_batch"
SCHEMA_VERSION = 2
SCHEMA_HEADER_VALUE = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"
#: The layout of kafka-changelog 0.2.0's records, read and converted.
LEGACY_SCHEMA_VERSION = 1
LEGACY_SCHEMA_NAME = f"{SCHEMA_NAME}_v{LEGACY_SCHEMA_VERSION}"
LEGACY_SCHEMA_HEADER_VALUE = f"{SCHEMA_NAME}/{LEGACY_SCHEMA_VERSION}"

HEADER_LOG_ID = "kc.log_id"
HEADER_KEY_GROUPS = "kc.key_groups"
HEADER_SEQUENCE_NUMBERS = "kc.sequence_numbers"

#: Bytes an encoded change may take beyond its payload (varints, conservatively).
CHANGE_OVERHEAD_BYTES = 30


#: (sequence number, index in its change set, key group, payload): a change on the wire.
RawChange = tuple[int, int, int, bytes]


@dataclass(frozen=True)
class EncodedRecord:
    """A record ready to produce, with what it covers."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    sequence_numbers: tuple[int, int]
    key_groups: tuple[int, int]
    #: Distinct sequence numbers of the changes in the record, ascending.
    members: tuple[int, ...]


@dataclass(frozen=True)
class ChangeColumns:
    """Changes of one writer for one partition, as columns, in the order they are logged
    (ascending sequence number, then index).

    Row ``i`` is the change at ``indexes[i]`` of change set ``sequence_numbers[i]``, in key
    group ``key_groups[i]`` (``-1``: meta), with payload ``payloads[i]``.
    """

    sequence_numbers: Int64s
    indexes: Int64s
    key_groups: Int64s
    payloads: Sequence[bytes]

    @classmethod
    def of(cls, changes: Sequence[RawChange]) -> ChangeColumns:
        """The columns of ``changes`` (tools and tests; the writer builds columns directly)."""
        return cls(
            np.array([c[0] for c in changes], np.int64),
            np.array([c[1] for c in changes], np.int64),
            np.array([c[2] for c in changes], np.int64),
            [c[3] for c in changes],
        )

    def __len__(self) -> int:
        return len(self.sequence_numbers)


def encode_records(
    log_id: str, columns: ChangeColumns, max_record_bytes: int, breaks: Sequence[int] = ()
) -> list[tuple[int, EncodedRecord]]:
    """Records of ``columns`` in order, each with the row it starts at.

    A record holds at most ``max_record_bytes`` (counting ``CHANGE_OVERHEAD_BYTES`` per
    change; a larger single change gets a record of its own) and never spans a row of
    ``breaks`` and the row before it (the writer breaks at each partition's first row).
    Values are byte-identical to fastavro's ``ChangeBatch`` encoding (tested).

    Column by column: NumPy encodes the changes' fixed fields (four Avro longs each) at
    once, and a record's value is one join of its framing, the slice of those fields that
    is its own and its payloads: one copy of the payloads' bytes, no Python step per
    change but the join's.
    """
    count = len(columns)
    if count == 0:
        return []
    payloads = columns.payloads
    sizes = np.fromiter(map(len, payloads), np.int64, count)
    sequence_numbers, key_groups = columns.sequence_numbers, columns.key_groups
    ends = np.cumsum(sizes + CHANGE_OVERHEAD_BYTES)
    forced = sorted({b for b in breaks if 0 < b < count})
    starts: list[int] = []
    start = 0
    for limit in [*forced, count]:
        while start < limit:
            starts.append(start)
            budget = (int(ends[start - 1]) if start else 0) + max_record_bytes
            stop = int(np.searchsorted(ends, budget, side="right"))
            start = min(limit, max(start + 1, stop))
    stops = [*starts[1:], count]
    name = log_id.encode()
    name_part = varint(len(name)) + name
    header_data, header_offsets = varint_rows(
        [sequence_numbers, columns.indexes, key_groups, sizes])
    # Where each record's rows start and stop, in the fields' bytes and in the payloads'.
    cuts = [*starts, count]
    field_cuts = header_offsets[cuts].tolist()
    payload_cuts = np.concatenate(([0], np.cumsum(sizes)))[cuts].tolist()
    values: list[bytes] = []
    for k, (first, stop) in enumerate(zip(starts, stops, strict=True)):
        # The changes array (one block, then its end), then the payloads' length.
        parts = list(payloads[first:stop])
        parts[0:0] = (name_part, varint(stop - first),
                      header_data[field_cuts[k]:field_cuts[k + 1]],
                      b"\x00" + varint(payload_cuts[k + 1] - payload_cuts[k]))
        values.append(b"".join(parts))
    # Per record: the first and last sequence number, the span of non-meta key groups.
    first_sqns = sequence_numbers[starts].tolist()
    last_sqns = sequence_numbers[[stop - 1 for stop in stops]].tolist()
    is_meta = key_groups == META_KEY_GROUP
    low_groups = np.minimum.reduceat(np.where(is_meta, np.iinfo(np.int64).max, key_groups),
                                     starts).tolist()
    high_groups = np.maximum.reduceat(key_groups, starts).tolist()
    records = []
    for k, (first, stop) in enumerate(zip(starts, stops, strict=True)):
        group_span = ((low_groups[k], high_groups[k]) if high_groups[k] != META_KEY_GROUP
                      else (META_KEY_GROUP, META_KEY_GROUP))
        sqn_span = (first_sqns[k], last_sqns[k])
        members = ((sqn_span[0],) if sqn_span[0] == sqn_span[1] else
                   tuple(np.unique(sequence_numbers[first:stop]).tolist()))
        records.append((first, EncodedRecord(
            name, values[k], record_headers(log_id, sqn_span, group_span), sqn_span,
            group_span, members)))
    return records


def encode_changes(
    log_id: str, changes: Sequence[RawChange], max_record_bytes: int = 2**62
) -> list[EncodedRecord]:
    """The records of ``changes`` (one unless they exceed the bound): tools and tests."""
    return [record for _, record in encode_records(
        log_id, ChangeColumns.of(changes), max_record_bytes)]


def empty_value(log_id: str) -> bytes:
    """The value of a record with no changes (never written; a malformed-input case)."""
    name = log_id.encode()
    return varint(len(name)) + name + b"\x00\x00"


def record_headers(
    log_id: str, sequence_numbers: tuple[int, int], key_groups: tuple[int, int]
) -> list[tuple[str, bytes]]:
    """The headers that describe a record to tools (``kcat -f '%h'``)."""
    return [
        (HEADER_LOG_ID, log_id.encode()),
        (HEADER_KEY_GROUPS, f"{key_groups[0]}-{key_groups[1]}".encode()),
        (HEADER_SEQUENCE_NUMBERS, f"{sequence_numbers[0]}-{sequence_numbers[1]}".encode()),
        (HEADER_SCHEMA, SCHEMA_HEADER_VALUE.encode()),
    ]


class UnknownSchemaError(ValueError):
    """The record says it was written with a schema this library does not read."""


def check_schema_header(headers: Sequence[tuple[str, str | bytes | None]] | None) -> int:
    """The schema version a record's ``kc.schema`` header names: :data:`SCHEMA_VERSION`
    or :data:`LEGACY_SCHEMA_VERSION`; :class:`UnknownSchemaError` when the header is
    missing or names anything else."""
    for name, value in headers or ():
        if name == HEADER_SCHEMA:
            found = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if found == SCHEMA_HEADER_VALUE:
                return SCHEMA_VERSION
            if found == LEGACY_SCHEMA_HEADER_VALUE:
                return LEGACY_SCHEMA_VERSION
            raise UnknownSchemaError(
                f"record schema {found!r} is not supported (this library reads "
                f"{SCHEMA_HEADER_VALUE!r} and {LEGACY_SCHEMA_HEADER_VALUE!r})"
            )
    raise UnknownSchemaError(f"record has no {HEADER_SCHEMA} header")


def _avro_record(value: bytes, schema_name: str) -> dict[str, Any]:
    buffer = io.BytesIO(value)
    try:
        record = fastavro.schemaless_reader(buffer, load_schema(schema_name), None)
    except Exception as exc:  # fastavro raises several types for garbage input
        raise ValueError(f"not a {schema_name} Avro value: {exc}") from exc
    if buffer.tell() != len(value) or not isinstance(record, dict):
        raise ValueError(f"{len(value) - buffer.tell()} trailing bytes after the batch")
    return record


def decode_record(value: bytes) -> tuple[str, list[RawChange]]:
    """The log id and changes of a record value (the current layout), change by change:
    the reference the column-wise decoder (:mod:`.record_columns`) agrees with.
    ``ValueError`` naming what is wrong if it is malformed."""
    record = _avro_record(value, SCHEMA_NAME)
    headers, payloads = record["changes"], record["payloads"]
    sizes = [h["payload_size"] for h in headers]
    if any(size < 0 for size in sizes):
        raise ValueError(f"a change's payload_size is negative: {min(sizes)}")
    ends = list(accumulate(sizes))
    if (ends[-1] if ends else 0) != len(payloads):
        raise ValueError(f"the changes' payload sizes add up to {ends[-1] if ends else 0} "
                         f"bytes but payloads holds {len(payloads)}")
    return record["log_id"], [
        (h["sequence_number"], h["index"], h["key_group"], payloads[end - size:end])
        for h, size, end in zip(headers, sizes, ends, strict=True)]


def current_value(value: bytes, version: int) -> bytes:
    """``value``, written with schema ``version``, in the current layout: a legacy
    record (``change_batch/1``) decoded and encoded again with the same changes in the
    same order; ``ValueError`` naming what is wrong if it does not decode."""
    if version == SCHEMA_VERSION:
        return value
    record = _avro_record(value, LEGACY_SCHEMA_NAME)
    changes = record["changes"]
    if not changes:
        return empty_value(record["log_id"])
    [converted] = encode_changes(record["log_id"], [
        (c["sequence_number"], c["index"], c["key_group"], c["payload"]) for c in changes])
    return converted.value
