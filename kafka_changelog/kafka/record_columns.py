"""Changelog records decoded column-wise: where each change lies, its fixed fields in bulk.

A :class:`RecordGroup` collects the values of a log's records; for each one Python loop
finds where its changes start (:func:`change_starts`, skipping each payload). Everything
else is read for all changes of the group at once with NumPy (:func:`kept_columns`:
sequence numbers, positions in their change sets, key groups, payload slices, and a
handle's filter). No Python object is made per change.

Only well-formed records are decoded here: a record that is not a ``ChangeBatch`` of the
log, or uses an encoding left to the per-change decoder (array blocks with byte sizes),
makes the group non-columnar (:attr:`RecordGroup.columnar`) or :func:`kept_columns` give
None; the caller then decodes the records one by one
(:func:`~kafka_changelog.kafka.reader.decode_log_record`), which names what is wrong.
Used by restores (:meth:`KafkaChangelogReader.read_columns
<kafka_changelog.kafka.reader.KafkaChangelogReader.read_columns>`) and by the Spark
reader's mode ``changes`` (:mod:`spark_integration.reader.change_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..avro_binary import AvroDecodeError, read_long
from ..avro_columns import Bytes, Int64s, read_lengths, read_longs
from ..change import META_KEY_GROUP

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def change_starts(value: bytes, log_id: bytes, base: int, starts: list[int]) -> int | None:
    """Append ``base`` plus the position of every change in the ``ChangeBatch`` ``value``
    (``schemas/change_batch.avsc``) to ``starts``; how many there are.

    None (``starts`` then holds garbage at its end) when ``value`` is not a well-formed
    batch of log ``log_id`` or has array blocks with byte sizes: the per-change path
    decodes those (and names what is wrong).
    """
    try:
        size, pos = read_long(value, 0)
        if size < 0 or value[pos:pos + size] != log_id:
            return None
        pos += size
        count = 0
        append = starts.append
        while True:
            block, pos = read_long(value, pos)
            if block == 0:
                break
            if block < 0:
                return None
            count += block
            # The hot loop: skip three varints (sequence number, index, key group), read
            # the payload's length, skip the payload.
            for _ in range(block):
                append(base + pos)
                while value[pos] > 127:
                    pos += 1
                pos += 1
                while value[pos] > 127:
                    pos += 1
                pos += 1
                while value[pos] > 127:
                    pos += 1
                byte = value[pos + 1]
                if byte < 128:
                    if byte & 1:
                        return None  # a negative length
                    pos += 2 + (byte >> 1)
                else:
                    size, pos = read_long(value, pos + 1)
                    if size < 0:
                        return None
                    pos += size
        return count if pos == len(value) else None
    except (IndexError, AvroDecodeError):
        return None


@dataclass
class RecordGroup:
    """Records of one log collected for one column-wise decode: their offsets and values,
    and where each change starts in the values laid end to end."""

    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    #: Changes per record (while :attr:`columnar`).
    counts: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    #: Bytes of the values so far.
    size: int = 0
    #: False once a record is left to the per-change path (the group then is).
    columnar: bool = True

    @property
    def changes(self) -> int:
        return len(self.starts)

    def add(self, offset: int, value: bytes, log_id: bytes) -> None:
        """Add the record at ``offset`` (its value) of log ``log_id``."""
        self.offsets.append(offset)
        self.values.append(value)
        if self.columnar:
            count = change_starts(value, log_id, self.size, self.starts)
            if count is None:
                self.columnar = False
            else:
                self.counts.append(count)
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
    does not decode or is out of an Avro int's range (the per-change path says what)."""
    at = np.array(group.starts, np.int64)
    fields: list[Int64s] = []
    for _ in range(3):  # sequence number, position, key group
        read = read_longs(buffer, limit, at)
        if read is None:
            return None
        fields.append(read[0])
        at = read[1]
    sqn, position, key_group = fields
    content = read_lengths(buffer, limit, at)
    if content is None:
        return None
    payload_lengths, payload_starts = content
    offsets = np.repeat(np.array(group.offsets, np.int64), np.array(group.counts, np.int64))
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


__all__ = ["ChangeFilter", "KeptColumns", "RecordGroup", "change_starts", "in_log_order",
           "kept_columns"]
