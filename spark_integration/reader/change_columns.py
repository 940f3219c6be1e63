"""Mode ``changes``, column-wise: changelog records to Arrow record batches in bulk.

The records of an offset slice are decoded in groups of about a batch of changes.
For each record one Python loop finds where its changes start (:func:`change_starts`,
skipping each payload); everything else is read for all changes of the group at once
with NumPy (sequence numbers, key groups, the slice's filter, the ``StateOp`` fields:
:mod:`.op_columns`) and the Arrow columns are made from byte
positions in the group's buffer (:mod:`.change_arrow`). No Python
object is made per change, except for registrations (a handful per log).

The rows are exactly those of the per-change path (:func:`~.rows.change_batches`
over :meth:`~.scan.SliceReader.scan`), which stays the reference: a group holding
anything the column-wise readers leave to it (a record or payload that does not
decode, array blocks with byte sizes, long lists, ...) is decoded by that path, so its
rows, and its errors naming the offset, are the same. Batches hold at most
``batch_rows`` rows, as there (where they fall may differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kafka_changelog.avro_binary import AvroDecodeError, read_long
from kafka_changelog.avro_columns import Bytes, Int64s, padded, read_lengths, read_longs
from kafka_changelog.change import META_KEY_GROUP
from kafka_changelog.kafka.reader import decode_log_record
from kafka_changelog.keys import key_text
from kafka_changelog.state.schema.ops import StateMeta

from .change_arrow import binary_array, decoded_strings, list_array, utf8
from .change_schema import BATCH_ROWS, BINARY_LIST, CHANGES_SCHEMA, META_OP
from .op_columns import Lists, OpColumns, Slices, decode_ops
from .rows import change_batches
from .scan import OP_SYMBOLS, OffsetSlice, ScannedChange, kept_changes

#: Record bytes decoded together at most (far below Arrow's 2 GiB per binary column).
GROUP_BYTES = 64 << 20

#: ``op`` by code: the enum symbols, then :data:`META_OP` for registrations.
_OP_NAMES = pa.array([*OP_SYMBOLS, META_OP], pa.string())
_META_CODE = len(OP_SYMBOLS)

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
class _Group:
    """Records scanned for one column-wise decode."""

    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    size: int = 0
    #: False once a record is left to the per-change path (the group then is).
    columnar: bool = True

    @property
    def changes(self) -> int:
        return len(self.starts)

    def add(self, offset: int, value: bytes, log_id: bytes) -> None:
        self.offsets.append(offset)
        self.values.append(value)
        if self.columnar:
            count = change_starts(value, log_id, self.size, self.starts)
            if count is None:
                self.columnar = False
            else:
                self.counts.append(count)
        self.size += len(value)


def _scatter(part: Slices, rows: Int64s, n: int) -> Slices:
    """``part`` (of the rows ``rows``) as slices of ``n`` rows, null elsewhere."""
    starts = np.zeros(n, np.int64)
    lengths = np.zeros(n, np.int64)
    present = np.zeros(n, np.bool_)
    starts[rows] = part.starts
    lengths[rows] = part.lengths
    present[rows] = True if part.present is None else part.present
    return Slices(starts, lengths, present)


def _scatter_lists(part: Lists, rows: Int64s, n: int) -> Lists:
    counts = np.zeros(n, np.int64)
    present = np.zeros(n, np.bool_)
    counts[rows] = part.counts
    present[rows] = part.present
    return Lists(counts, present, part.items)


@dataclass(frozen=True)
class _Kept:
    """The kept changes of a group: where each lies and its fixed fields."""

    offsets: Int64s
    sequence_numbers: Int64s
    positions: Int64s
    key_groups: Int64s
    payload_starts: Int64s
    payload_lengths: Int64s


def _kept(group: _Group, buffer: Bytes, limit: int, piece: OffsetSlice) -> _Kept | None:
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
    keep = ((sqn >= piece.from_sequence_number) & (sqn <= piece.to_sequence_number)
            & ((key_group == META_KEY_GROUP)
               | ((key_group >= piece.key_group_start) & (key_group <= piece.key_group_end))))
    if not bool(keep.all()):
        offsets, sqn, position = offsets[keep], sqn[keep], position[keep]
        key_group, payload_starts = key_group[keep], payload_starts[keep]
        payload_lengths = payload_lengths[keep]
    for ints in (position, key_group):  # Avro ints: the per-change path fails on others
        if ints.size and (int(ints.min()) < _INT32_MIN or int(ints.max()) > _INT32_MAX):
            return None
    return _Kept(offsets, sqn, position, key_group, payload_starts, payload_lengths)


def _registrations_agree(data: bytes, kept: _Kept, rows: Int64s, state: Slices) -> bool:
    """Every registration decodes, with the state name read column-wise."""
    for row in rows.tolist():
        start = int(kept.payload_starts[row])
        try:
            meta = StateMeta.from_bytes(data[start:start + int(kept.payload_lengths[row])])
        except Exception:  # fastavro raises several types for garbage
            return False
        name_at = int(state.starts[row])
        if meta.state.encode() != data[name_at:name_at + int(state.lengths[row])]:
            return False
    return True


def _column_batch(group: _Group, piece: OffsetSlice, operator: str, subtask: int,
                  key_types: Sequence[str] | None) -> pa.RecordBatch | None:
    """The group's rows as one batch; None to leave the group to the per-change path."""
    data = b"".join(group.values)
    buffer, limit = padded(data)
    kept = _kept(group, buffer, limit, piece)
    if kept is None:
        return None
    n = kept.offsets.size
    meta = kept.key_groups == META_KEY_GROUP
    content = read_lengths(buffer, limit, kept.payload_starts)  # the state name leads both
    if content is None:
        return None
    state = Slices(content[1], content[0])
    op_rows = np.flatnonzero(~meta)
    meta_rows = np.flatnonzero(meta)
    ops: OpColumns | None = decode_ops(
        buffer, limit, state.starts[op_rows] + state.lengths[op_rows],
        kept.payload_starts[op_rows] + kept.payload_lengths[op_rows])
    if ops is None or not _registrations_agree(data, kept, meta_rows, state):
        return None
    try:
        states = decoded_strings(binary_array(buffer, state), utf8)
    except UnicodeDecodeError:
        return None
    codes = np.full(n, _META_CODE, np.int64)
    codes[op_rows] = ops.op
    key = binary_array(buffer, _scatter(ops.key, op_rows, n))
    value = _scatter(ops.value, op_rows, n)
    value.starts[meta_rows] = kept.payload_starts[meta_rows]  # a registration's value:
    value.lengths[meta_rows] = kept.payload_lengths[meta_rows]  # its payload
    assert value.present is not None
    value.present[meta_rows] = True
    if key_types is None:
        decoded = pa.nulls(n, pa.string())
    else:
        decoded = decoded_strings(key, lambda k: key_text(k, key_types))
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(operator, pa.string()), n),
        pa.repeat(pa.scalar(subtask, pa.int32()), n),
        pa.repeat(pa.scalar(piece.log_id, pa.string()), n),
        pa.array(kept.key_groups.astype(np.int32), pa.int32(), mask=meta),
        pa.repeat(pa.scalar(piece.topic, pa.string()), n),
        pa.repeat(pa.scalar(piece.partition, pa.int32()), n),
        pa.array(kept.offsets, pa.int64()),
        pa.array(kept.sequence_numbers, pa.int64()),
        pa.array(kept.positions.astype(np.int32), pa.int32()),
        _OP_NAMES.take(pa.array(codes, pa.int64())),
        states,
        key,
        binary_array(buffer, _scatter(ops.map_key, op_rows, n)),
        binary_array(buffer, value),
        list_array(buffer, _scatter_lists(ops.values, op_rows, n), BINARY_LIST),
        decoded,
    ], schema=CHANGES_SCHEMA)


def _per_change(group: _Group, piece: OffsetSlice) -> Iterator[ScannedChange]:
    """The group's kept changes, decoded one by one (the reference path)."""
    for offset, value in zip(group.offsets, group.values, strict=True):
        changes = decode_log_record(piece.topic, piece.partition, offset, value, piece.log_id)
        yield from kept_changes(piece, offset, changes)


def _group_batches(group: _Group, piece: OffsetSlice, operator: str, subtask: int,
                   batch_rows: int, key_types: Sequence[str] | None
                   ) -> Iterator[pa.RecordBatch]:
    batch = _column_batch(group, piece, operator, subtask, key_types) if group.columnar else None
    if batch is not None:
        yield batch
        return
    yield from change_batches(_per_change(group, piece), operator, subtask, piece,
                              batch_rows, key_types)


def at_most(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` in the same order, in batches of at most ``rows`` rows (each
    batch cut into slices, without copying; no empty batch)."""
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def column_change_batches(records: Iterable[tuple[int, bytes]], operator: str, subtask: int,
                          piece: OffsetSlice, batch_rows: int = BATCH_ROWS,
                          key_types: Sequence[str] | None = None
                          ) -> Iterator[pa.RecordBatch]:
    """Record batches of the slice's kept changes of ``records`` ((offset, value) of the
    log's records, in offset order): exactly the rows, in the same order, of
    :func:`~.rows.change_batches` over the same records decoded change by change, and its
    errors; at most ``batch_rows`` rows per batch."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    log_id = piece.log_id.encode()

    def groups() -> Iterator[pa.RecordBatch]:
        group = _Group()
        for offset, value in records:
            group.add(offset, value, log_id)
            # A record left to the per-change path is decoded on its own, at once.
            if (not group.columnar or group.changes >= batch_rows
                    or group.size >= GROUP_BYTES):
                yield from _group_batches(group, piece, operator, subtask, batch_rows,
                                          key_types)
                group = _Group()
        if group.offsets:
            yield from _group_batches(group, piece, operator, subtask, batch_rows, key_types)

    return at_most(groups(), batch_rows)


__all__ = ["GROUP_BYTES", "at_most", "change_starts", "column_change_batches"]
