"""Changelog records decoded column-wise: every change's fields and payload in bulk.

A record's value lays its changes out column-wise (``schemas/change_batch.avsc``): the
fixed fields of all its changes (four Avro longs each), then the payloads end to end.
A :class:`RecordGroup` collects the values of a log's records; for each one a few NumPy
passes over its fields find where each field starts (:func:`record_layout`), and
:func:`kept_columns` reads the fields of all changes of the group at once (sequence
numbers, positions in their change sets, key groups, payload sizes, hence where each
payload lies) and applies a handle's filter. No Python object is made per change.

Only well-formed records are decoded here: a record that is not a ``ChangeBatch`` of the
log, or uses an encoding left to the per-change decoder (array blocks with byte sizes,
several blocks), makes the group non-columnar (:attr:`RecordGroup.columnar`) or
:func:`kept_columns` give None; the caller then decodes the records one by one
(:func:`~kafka_changelog.kafka.reader.decode_log_record`), which names what is wrong.
Used by restores (:meth:`KafkaChangelogReader.read_columns
<kafka_changelog.kafka.reader.KafkaChangelogReader.read_columns>`) and by the Spark
reader's mode ``changes`` (:mod:`spark_integration.reader.change_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..avro_binary import AvroDecodeError, read_long
from ..avro_columns import Bytes, Int64s, read_longs
from ..change import META_KEY_GROUP

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1

#: Avro longs of a change's fixed fields: sequence number, index, key group, payload size.
FIELDS = 4
#: The most bytes an Avro long takes.
_LONGEST_VARINT = 10
_HIGH_BIT = np.uint8(0x80)


@dataclass(frozen=True)
class RecordLayout:
    """Where a record's parts lie in its value: each change's fields (``field_starts``,
    :data:`FIELDS` per change, in order) and the payloads (``payloads_start``, ``payloads_size``
    bytes)."""

    field_starts: Int64s
    payloads_start: int
    payloads_size: int

    @property
    def changes(self) -> int:
        return self.field_starts.size // FIELDS


def record_layout(value: bytes, log_id: bytes, base: int = 0) -> RecordLayout | None:
    """The layout of the ``ChangeBatch`` ``value`` (``schemas/change_batch.avsc``), its
    positions counted from ``base`` (where ``value`` lies in a larger buffer), found with
    NumPy: the fields are varints laid end to end, so the byte ending each one (high bit
    clear) tells where the next starts.

    None when ``value`` is not a well-formed batch of log ``log_id``, or its changes array
    is not one block (the per-change path decodes those, and names what is wrong).
    """
    try:
        size, pos = read_long(value, 0)
        if size < 0 or value[pos:pos + size] != log_id:
            return None
        count, pos = read_long(value, pos + size)
        if count < 0:
            return None
        if count == 0:
            starts = np.zeros(0, np.int64)
        else:
            fields = FIELDS * count
            window = np.frombuffer(value, np.uint8, min(len(value) - pos,
                                                        _LONGEST_VARINT * fields), pos)
            ends = np.flatnonzero(window < _HIGH_BIT)
            if ends.size < fields:
                return None
            starts = np.empty(fields, np.int64)
            starts[0] = base + pos
            starts[1:] = ends[:fields - 1] + (base + pos + 1)
            pos += int(ends[fields - 1]) + 1
            block_end, pos = read_long(value, pos)
            if block_end != 0:
                return None
        payloads_size, pos = read_long(value, pos)
    except (IndexError, AvroDecodeError):
        return None
    if payloads_size < 0 or pos + payloads_size != len(value):
        return None
    return RecordLayout(starts, base + pos, payloads_size)


@dataclass
class RecordGroup:
    """Records of one log collected for one column-wise decode: their offsets and values,
    and the layout of each in the values laid end to end."""

    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    #: Each record's layout, positions counted from the group's start (while
    #: :attr:`columnar`).
    layouts: list[RecordLayout] = field(default_factory=list)
    #: Changes of the records so far (while :attr:`columnar`).
    changes: int = 0
    #: Bytes of the values so far.
    size: int = 0
    #: False once a record is left to the per-change path (the group then is).
    columnar: bool = True

    def add(self, offset: int, value: bytes, log_id: bytes) -> None:
        """Add the record at ``offset`` (its value) of log ``log_id``."""
        self.offsets.append(offset)
        self.values.append(value)
        if self.columnar:
            layout = record_layout(value, log_id, self.size)
            if layout is None:
                self.columnar = False
            else:
                self.layouts.append(layout)
                self.changes += layout.changes
        self.size += len(value)


@dataclass(frozen=True)
class ChangeFilter:
    """Which changes of a log's records a reader keeps: sequence numbers in
    ``[from_sequence_number, to_sequence_number]`` and key groups in
    ``[key_group_start, key_group_end]`` (meta changes always)."""

    from_sequence_number: int
    to_sequence_number: int
    key_group_start: int
    key_group_end: int


@dataclass(frozen=True)
class KeptColumns:
    """The kept changes of a group, in record order: the offset of each one's record, its
    fixed fields and where its payload lies in the group's buffer."""

    offsets: Int64s
    sequence_numbers: Int64s
    positions: Int64s
    key_groups: Int64s
    payload_starts: Int64s
    payload_lengths: Int64s

    def taken(self, rows: Int64s) -> KeptColumns:
        """These columns' rows ``rows``, in that order."""
        return KeptColumns(self.offsets[rows], self.sequence_numbers[rows],
                           self.positions[rows], self.key_groups[rows],
                           self.payload_starts[rows], self.payload_lengths[rows])


def kept_columns(group: RecordGroup, buffer: Bytes, limit: int,
                 kept: ChangeFilter) -> KeptColumns | None:
    """The changes of a columnar ``group`` that ``kept`` keeps; ``buffer`` is the group's
    values laid end to end, :func:`~kafka_changelog.avro_columns.padded`. None when a field
    does not decode, is out of an Avro int's range, or the payload sizes do not add up to
    their records' payloads (the per-change path says what)."""
    layouts = group.layouts
    counts = np.array([layout.changes for layout in layouts], np.int64)
    at = (np.concatenate([layout.field_starts for layout in layouts]) if layouts
          else np.zeros(0, np.int64))
    read = read_longs(buffer, limit, at)
    if read is None:
        return None
    # One row per field, each contiguous.
    sqn, position, key_group, payload_lengths = read[0].reshape(-1, FIELDS).T.copy()
    if payload_lengths.size and int(payload_lengths.min()) < 0:
        return None
    # Each payload starts where the ones before it in its record end.
    ends = np.cumsum(payload_lengths)
    firsts = np.cumsum(counts) - counts
    filled = counts > 0
    before = np.zeros(counts.size, np.int64)
    before[filled] = ends[firsts[filled]] - payload_lengths[firsts[filled]]
    payload_sizes = np.array([layout.payloads_size for layout in layouts], np.int64)
    if filled.any() and not np.array_equal(
            ends[(firsts + counts - 1)[filled]] - before[filled], payload_sizes[filled]):
        return None
    if (payload_sizes[~filled] != 0).any():
        return None
    bases = np.array([layout.payloads_start for layout in layouts], np.int64) - before
    payload_starts = np.repeat(bases, counts) + ends - payload_lengths
    offsets = np.repeat(np.array(group.offsets, np.int64), counts)
    keep = ((sqn >= kept.from_sequence_number) & (sqn <= kept.to_sequence_number)
            & ((key_group == META_KEY_GROUP)
               | ((key_group >= kept.key_group_start) & (key_group <= kept.key_group_end))))
    columns = KeptColumns(offsets, sqn, position, key_group, payload_starts, payload_lengths)
    if not bool(keep.all()):
        columns = columns.taken(np.flatnonzero(keep))
    for ints in (columns.positions, columns.key_groups):  # Avro ints: others fail per change
        if ints.size and (int(ints.min()) < _INT32_MIN or int(ints.max()) > _INT32_MAX):
            return None
    return columns


def in_log_order(columns: KeptColumns) -> KeptColumns:
    """``columns`` in sequence order (position within a change set second), each (sequence
    number, position) once: copies from retried uploads dropped, as a reader's
    :meth:`~kafka_changelog.reader.StateChangelogReader.read` does."""
    order = np.lexsort((columns.positions, columns.sequence_numbers))
    sqn, position = columns.sequence_numbers[order], columns.positions[order]
    first = np.ones(order.size, np.bool_)
    first[1:] = (sqn[1:] != sqn[:-1]) | (position[1:] != position[:-1])
    return columns.taken(order if bool(first.all()) else order[first])


__all__ = ["FIELDS", "ChangeFilter", "KeptColumns", "RecordGroup", "RecordLayout",
           "in_log_order", "kept_columns", "record_layout"]
