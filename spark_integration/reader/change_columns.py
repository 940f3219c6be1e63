"""Mode ``changes``, column-wise: changelog records to Arrow record batches in bulk.

The records of an offset slice are decoded in groups of about a batch of changes.
For each record a NumPy pass over its changes' fixed fields finds where each starts, and
everything else is read for all changes of the group at once with NumPy (sequence
numbers, key groups, payload places, the slice's filter:
:mod:`kafka_changelog.kafka.record_columns`; the ``StateOp`` fields:
:mod:`kafka_changelog.state.schema.op_columns`) and the Arrow columns are made from byte
positions in the group's buffer (:mod:`.change_arrow`). No Python object is made per
change, except for registrations (a handful per log).

The rows are exactly those of the per-change path (:func:`~.rows.change_batches`
over :meth:`~.scan.SliceReader.scan`), which stays the reference: a group holding
anything the column-wise readers leave to it (a record or payload that does not decode,
array blocks with byte sizes or several of them, long lists, ...) is decoded by that
path, so its rows, and its errors naming the offset, are the same. Batches hold at most
``batch_rows`` rows, as there (where they fall may differ).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import cache

import numpy as np
import pyarrow as pa

from kafka_changelog.avro_columns import Int64s, padded, read_lengths
from kafka_changelog.change import META_KEY_GROUP
from kafka_changelog.kafka.reader import decode_log_record
from kafka_changelog.kafka.record_columns import (
    ChangeFilter,
    KeptColumns,
    RecordGroup,
    kept_columns,
)
from kafka_changelog.keys import key_text
from kafka_changelog.state.schema.op_columns import Lists, OpColumns, Slices, decode_ops
from kafka_changelog.state.schema.ops import StateMeta

from .change_arrow import binary_array, decoded_strings, list_array, utf8
from .change_schema import BATCH_ROWS, BINARY_LIST, CHANGES_SCHEMA, META_OP
from .rows import change_batches
from .scan import OP_SYMBOLS, OffsetSlice, ScannedChange, kept_changes

#: Record bytes decoded together at most (far below Arrow's 2 GiB per binary column).
GROUP_BYTES = 64 << 20


@cache
def _op_names() -> pa.Array:
    """``op`` by code: the enum symbols, then :data:`META_OP` for registrations (made on
    first use: ``pa.array`` imports pandas, which a planning process need not)."""
    return pa.array([*OP_SYMBOLS, META_OP], pa.string())


_META_CODE = len(OP_SYMBOLS)


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


def _filter_of(piece: OffsetSlice) -> ChangeFilter:
    return ChangeFilter(piece.from_sequence_number, piece.to_sequence_number,
                        piece.key_group_start, piece.key_group_end)


def _registrations_agree(data: bytes, kept: KeptColumns, rows: Int64s, state: Slices) -> bool:
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


def _column_batch(group: RecordGroup, piece: OffsetSlice, operator: str, subtask: int,
                  key_types: Sequence[str] | None) -> pa.RecordBatch | None:
    """The group's rows as one batch; None to leave the group to the per-change path."""
    data = b"".join(group.values)
    buffer, limit = padded(data)
    kept = kept_columns(group, buffer, limit, _filter_of(piece))
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
        _op_names().take(pa.array(codes, pa.int64())),
        states,
        key,
        binary_array(buffer, _scatter(ops.map_key, op_rows, n)),
        binary_array(buffer, value),
        list_array(buffer, _scatter_lists(ops.values, op_rows, n), BINARY_LIST),
        decoded,
    ], schema=CHANGES_SCHEMA)


def _per_change(group: RecordGroup, piece: OffsetSlice) -> Iterator[ScannedChange]:
    """The group's kept changes, decoded one by one (the reference path)."""
    for offset, value in zip(group.offsets, group.values, strict=True):
        changes = decode_log_record(piece.topic, piece.partition, offset, value, piece.log_id)
        yield from kept_changes(piece, offset, changes)


def _group_batches(group: RecordGroup, piece: OffsetSlice, operator: str, subtask: int,
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
        group = RecordGroup()
        for offset, value in records:
            group.add(offset, value, log_id)
            # A record left to the per-change path is decoded on its own, at once.
            if (not group.columnar or group.changes >= batch_rows
                    or group.size >= GROUP_BYTES):
                yield from _group_batches(group, piece, operator, subtask, batch_rows,
                                          key_types)
                group = RecordGroup()
        if group.offsets:
            yield from _group_batches(group, piece, operator, subtask, batch_rows, key_types)

    return at_most(groups(), batch_rows)


__all__ = ["GROUP_BYTES", "at_most", "column_change_batches"]
