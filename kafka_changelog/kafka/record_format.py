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
from functools import cache
from typing import TYPE_CHECKING, Any

import fastavro
import numpy as np

from ..avro_binary import varint
from ..avro_columns import Int64s, varint_rows
from ..change import META_KEY_GROUP
from ..serialization import HEADER_SCHEMA, load_schema

if TYPE_CHECKING:
    import pyarrow as pa

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


#: Below this mean payload size, records are laid out by Arrow (no Python object per
#: change); from it on, by joining the payloads in Python (one copy of their bytes
#: instead of two, which matters more than a Python step per change).
ARROW_LAYOUT_BELOW_BYTES = 1024

@cache
def _no_separator() -> pa.Scalar:
    # Made on first use: pyarrow's scalar() imports pandas, which a process that only
    # reads records (the CLI, a materialization job) does not need.
    import pyarrow as pa

    return pa.scalar(b"", pa.large_binary())


@dataclass(frozen=True)
class _Layout:
    """Where the records of an upload start and stop (rows), and their change headers."""

    name_part: bytes
    starts: list[int]
    stops: list[int]
    header_data: bytes
    header_offsets: Int64s

    def framing(self) -> list[bytes]:
        """Each record's start: log id, then change count (the array block's)."""
        return [self.name_part + varint(stop - first)
                for first, stop in zip(self.starts, self.stops, strict=True)]


def _values_by_arrow(layout: _Layout, payloads: Sequence[bytes]) -> list[bytes | pa.Buffer]:
    # One Arrow join of headers and payloads lays out every record in one buffer, and a
    # record's value is a slice of it. Record framing rides in the headers: the header of
    # a record's first change starts with the end of the record before (a 0 byte) and the
    # start of its own. Only the last record's end is added apart, by copying that record.
    # (Arrow is imported here: a process that never writes small changes, the CLI or a
    # materialization job, starts ~0.5 CPU-s sooner without it.)
    import pyarrow as pa
    import pyarrow.compute as pc

    count, starts = len(payloads), layout.starts
    framing = [(b"\x00" if k else b"") + part for k, part in enumerate(layout.framing())]
    framing_lengths = np.array([len(f) for f in framing], np.int64)
    framed_data = np.insert(np.frombuffer(layout.header_data, np.uint8),
                            np.repeat(layout.header_offsets[starts], framing_lengths),
                            np.frombuffer(b"".join(framing), np.uint8))
    inserted = np.zeros(count + 1, np.int64)
    inserted[starts] = framing_lengths
    framed_offsets = layout.header_offsets + np.cumsum(inserted) - inserted
    joined = pc.binary_join_element_wise(
        pa.Array.from_buffers(pa.large_binary(), count,
                              [None, pa.py_buffer(framed_offsets), pa.py_buffer(framed_data)]),
        pa.array(payloads, pa.large_binary()), _no_separator())
    offsets = np.frombuffer(joined.buffers()[1], np.int64, count + 1, joined.offset * 8)
    data = joined.buffers()[2]
    # From just after the 0 byte closing the record before to just after the 0 byte the
    # next one starts with.
    byte_starts = (offsets[starts] + (np.arange(len(starts)) > 0)).tolist()
    byte_stops = (offsets[layout.stops] + 1).tolist()
    values: list[bytes | pa.Buffer] = [data[a:b] for a, b in zip(
        byte_starts[:-1], byte_stops[:-1], strict=True)]
    values.append(b"".join((data[byte_starts[-1]:int(offsets[count])], b"\x00")))
    return values


def _values_by_join(layout: _Layout, payloads: Sequence[bytes]) -> list[bytes | pa.Buffer]:
    # Large payloads: one bytes join per record, headers and payloads interleaved.
    header_data, bounds = layout.header_data, layout.header_offsets.tolist()
    values: list[bytes | pa.Buffer] = []
    for start_part, first, stop in zip(layout.framing(), layout.starts, layout.stops,
                                       strict=True):
        parts = [start_part]
        for i in range(first, stop):
            parts += (header_data[bounds[i]:bounds[i + 1]], payloads[i])
        parts.append(b"\x00")
        values.append(b"".join(parts))
    return values


def encode_records(
    log_id: str, columns: ChangeColumns, max_record_bytes: int, breaks: Sequence[int] = ()
) -> list[tuple[int, EncodedRecord]]:
    """Records of ``columns`` in order, each with the row it starts at.

    A record holds at most ``max_record_bytes`` (counting ``CHANGE_OVERHEAD_BYTES`` per
    change; a larger single change gets a record of its own) and never spans a row of
    ``breaks`` and the row before it (the writer breaks at each partition's first row).
    Values are byte-identical to fastavro's ``ChangeBatch`` encoding (tested).

    Column by column: NumPy encodes the per-change headers (four Avro longs) at once;
    small payloads are laid out with them by Arrow, without a Python object per change,
    large ones joined with them in Python (see ``ARROW_LAYOUT_BELOW_BYTES``).
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
    header_data, header_offsets = varint_rows(
        [sequence_numbers, columns.indexes, key_groups, sizes])
    layout = _Layout(varint(len(name)) + name, starts, stops, header_data, header_offsets)
    small = int(ends[-1]) < (ARROW_LAYOUT_BELOW_BYTES + CHANGE_OVERHEAD_BYTES) * count
    values = (_values_by_arrow if small else _values_by_join)(layout, payloads)
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
