"""The changelog record: one writer's changes for one partition, self-describing for tools.

Key: the log id (UTF-8). Value: a ``ChangeBatch`` (``schemas/change_batch.avsc``,
schemaless Avro binary). Headers say what the record holds without decoding it,
so ``kcat -f '%k %h'`` shows it: ``kc.log_id``, ``kc.key_groups`` and
``kc.sequence_numbers`` (``first-last``, inclusive) and ``kc.schema``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..avro_binary import varint
from ..avro_columns import Int64s, varint_rows
from ..change import META_KEY_GROUP
from ..serialization import HEADER_SCHEMA, load_schema

SCHEMA_NAME = "change_batch"
SCHEMA_VERSION = 1
SCHEMA_HEADER_VALUE = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"

HEADER_LOG_ID = "kc.log_id"
HEADER_KEY_GROUPS = "kc.key_groups"
HEADER_SEQUENCE_NUMBERS = "kc.sequence_numbers"

#: Bytes an encoded change may take beyond its payload (varints, conservatively).
CHANGE_OVERHEAD_BYTES = 30


#: (sequence number, index in its change set, key group, payload): a change on the wire.
RawChange = tuple[int, int, int, bytes]


@dataclass(frozen=True)
class EncodedRecord:
    """A record ready to produce, with what it covers.

    ``value`` is ``bytes`` or a read-only Arrow buffer (a slice of the encoder's output,
    which the producer copies without a copy of ours first): ``bytes(record.value)`` is
    the Avro value either way.
    """

    key: bytes
    value: bytes | pa.Buffer
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
    #: A ``large_binary`` array (possibly a slice of a larger one).
    payloads: pa.Array

    @classmethod
    def of(cls, changes: Sequence[RawChange]) -> ChangeColumns:
        """The columns of ``changes`` (tools and tests; the writer builds columns directly)."""
        return cls(
            np.array([c[0] for c in changes], np.int64),
            np.array([c[1] for c in changes], np.int64),
            np.array([c[2] for c in changes], np.int64),
            pa.array([c[3] for c in changes], pa.large_binary()),
        )

    def __len__(self) -> int:
        return len(self.sequence_numbers)

    def payload_sizes(self) -> Int64s:
        """The payloads' lengths (read off the array's offsets, not the payloads)."""
        array = self.payloads
        offsets = np.frombuffer(array.buffers()[1], np.int64, len(array) + 1, array.offset * 8)
        return np.diff(offsets)


_NO_SEPARATOR = pa.scalar(b"", pa.large_binary())


def _sparse_column(rows: int, at: Sequence[int], values: Sequence[bytes]) -> pa.Array:
    """A ``large_binary`` column of ``rows`` rows: ``values[k]`` in row ``at[k]``, empty
    elsewhere."""
    lengths = np.zeros(rows, np.int64)
    lengths[list(at)] = [len(v) for v in values]
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def encode_records(
    log_id: str, columns: ChangeColumns, max_record_bytes: int
) -> list[EncodedRecord]:
    """Records of ``columns`` in order, each at most ``max_record_bytes`` (counting
    ``CHANGE_OVERHEAD_BYTES`` per change; a larger single change gets a record of its own).

    Values are byte-identical to fastavro's ``ChangeBatch`` encoding (tested). Column by
    column, without a Python object per change: NumPy encodes the per-change headers (four
    Avro longs), and one Arrow join lays out every record's bytes in one buffer (each
    record's start, then change header and payload after header and payload, then its
    end), so a record's value is a slice of that buffer.
    """
    count = len(columns)
    if count == 0:
        return []
    sizes = columns.payload_sizes()
    sequence_numbers, key_groups = columns.sequence_numbers, columns.key_groups
    ends = np.cumsum(sizes + CHANGE_OVERHEAD_BYTES)
    starts: list[int] = []
    start = 0
    while start < count:
        starts.append(start)
        budget = (int(ends[start - 1]) if start else 0) + max_record_bytes
        start = max(start + 1, int(np.searchsorted(ends, budget, side="right")))
    stops = [*starts[1:], count]
    name = log_id.encode()
    name_part = varint(len(name)) + name
    header_data, header_offsets = varint_rows(
        [sequence_numbers, columns.indexes, key_groups, sizes])
    joined = pc.binary_join_element_wise(
        _sparse_column(count, starts,
                       [name_part + varint(stop - first) for first, stop in zip(
                           starts, stops, strict=True)]),
        pa.Array.from_buffers(pa.large_binary(), count,
                              [None, pa.py_buffer(header_offsets), pa.py_buffer(header_data)]),
        columns.payloads,
        _sparse_column(count, [stop - 1 for stop in stops], [b"\x00"] * len(stops)),
        _NO_SEPARATOR,
    )
    offsets = np.frombuffer(joined.buffers()[1], np.int64, count + 1, joined.offset * 8)
    data = joined.buffers()[2]
    records = []
    for first, stop in zip(starts, stops, strict=True):
        groups = key_groups[first:stop]
        groups = groups[groups != META_KEY_GROUP]
        group_span = ((int(groups.min()), int(groups.max())) if len(groups)
                      else (META_KEY_GROUP, META_KEY_GROUP))
        sqn_span = (int(sequence_numbers[first]), int(sequence_numbers[stop - 1]))
        records.append(EncodedRecord(
            name, data[int(offsets[first]):int(offsets[stop])],
            record_headers(log_id, sqn_span, group_span), sqn_span, group_span,
            tuple(np.unique(sequence_numbers[first:stop]).tolist())))
    return records


def encode_changes(
    log_id: str, changes: Sequence[RawChange], max_record_bytes: int = 2**62
) -> list[EncodedRecord]:
    """:func:`encode_records` of ``changes`` (one record unless they exceed the bound)."""
    return encode_records(log_id, ChangeColumns.of(changes), max_record_bytes)


def empty_value(log_id: str) -> bytes:
    """The value of a record with no changes (never written; a malformed-input case)."""
    name = log_id.encode()
    return varint(len(name)) + name + b"\x00"


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


def check_schema_header(headers: Sequence[tuple[str, str | bytes | None]] | None) -> None:
    """Refuse a record whose ``kc.schema`` header is missing or names another version."""
    for name, value in headers or ():
        if name == HEADER_SCHEMA:
            found = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if found != SCHEMA_HEADER_VALUE:
                raise UnknownSchemaError(
                    f"record schema {found!r} is not supported (this library reads "
                    f"{SCHEMA_HEADER_VALUE!r})"
                )
            return
    raise UnknownSchemaError(f"record has no {HEADER_SCHEMA} header")


def decode_record_fields(value: bytes) -> tuple[str, list[dict[str, Any]]]:
    """The log id and changes (Avro field dicts) of a record value; ``ValueError`` if malformed."""
    buffer = io.BytesIO(value)
    try:
        record = fastavro.schemaless_reader(buffer, load_schema(SCHEMA_NAME), None)
    except Exception as exc:  # fastavro raises several types for garbage input
        raise ValueError(f"not a {SCHEMA_NAME} Avro value: {exc}") from exc
    if buffer.tell() != len(value) or not isinstance(record, dict):
        raise ValueError(f"{len(value) - buffer.tell()} trailing bytes after the batch")
    return record["log_id"], record["changes"]
