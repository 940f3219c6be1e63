"""``StateOp`` payloads (``schemas/state_op.avsc``) decoded field by field, many at once.

:func:`decode_ops` reads the fields after ``state`` of thousands of payloads lying in
one byte buffer, each field of all payloads in one NumPy step
(:mod:`kafka_changelog.avro_columns`), and gives where each byte field lies instead
of copying it: a restore applies runs of them to a table
(:mod:`kafka_changelog.state.backend.column_replay`), the Spark reader builds Arrow
columns from them in one copy (:mod:`spark_integration.reader.change_arrow`).

It reads what :meth:`~kafka_changelog.state.schema.ops.StateOp.from_bytes` reads, with the
same result, except two encodings it leaves to that decoder: array blocks that carry
their byte size (a negative count) and lists of more than :data:`MAX_ITEMS` values.
For those, and for anything malformed, it returns ``None`` and the caller decodes
the payloads one by one (which raises the error naming what is wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kafka_changelog.avro_columns import Bytes, Int64s, read_lengths, read_longs

#: Values of a ``values`` field read column-wise at most (a round per value).
MAX_ITEMS = 256

#: Symbols of ``StateOp.op``: six (the schema's enum; ``scan.OP_SYMBOLS`` names them).
OP_COUNT = 6

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Slices:
    """Byte fields of ``n`` rows: row ``i`` is ``buffer[starts[i]:starts[i] + lengths[i]]``
    when ``present[i]`` (else null, with length 0); ``present`` None: all present."""

    starts: Int64s
    lengths: Int64s
    present: Mask | None = None

    @classmethod
    def nulls(cls, n: int) -> Slices:
        """``n`` null fields."""
        return cls(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.bool_))


@dataclass(frozen=True)
class Lists:
    """A ``values`` field of ``n`` rows: row ``i`` has ``counts[i]`` items (null when not
    ``present[i]``, with count 0); ``items`` are every row's items, row by row."""

    counts: Int64s
    present: Mask
    items: Slices


@dataclass(frozen=True)
class OpColumns:
    """The fields of ``n`` ``StateOp`` payloads after ``state`` (``op``: the enum index)."""

    op: Int64s
    key: Slices
    map_key: Slices
    value: Slices
    values: Lists


def _union_branch(buffer: Bytes, limit: int, positions: Int64s
                  ) -> tuple[npt.NDArray[np.bool_], Int64s] | None:
    """Whether the ``["null", X]`` union at each position holds an X, and the positions
    after its branch index; None unless every index is 0 or 1."""
    read = read_longs(buffer, limit, positions)
    if read is None:
        return None
    branch, after = read
    if not bool(((branch == 0) | (branch == 1)).all()):
        return None
    return branch == 1, after


def _optional_bytes(buffer: Bytes, limit: int, positions: Int64s
                    ) -> tuple[Slices, Int64s] | None:
    """A ``["null", "bytes"]`` union at each position, and the positions after it."""
    branch = _union_branch(buffer, limit, positions)
    if branch is None:
        return None
    present, after = branch
    rows = np.flatnonzero(present)
    starts = np.zeros(positions.size, np.int64)
    lengths = np.zeros(positions.size, np.int64)
    if rows.size:
        content = read_lengths(buffer, limit, after[rows])
        if content is None:
            return None
        lengths[rows], starts[rows] = content
        after[rows] = starts[rows] + lengths[rows]
    return Slices(starts, lengths, present), after


def _optional_items(buffer: Bytes, limit: int, positions: Int64s
                    ) -> tuple[Lists, Int64s] | None:
    """A ``["null", {"type": "array", "items": "bytes"}]`` union at each position, and the
    positions after it; None for blocks with byte sizes or more than :data:`MAX_ITEMS`."""
    branch = _union_branch(buffer, limit, positions)
    if branch is None:
        return None
    present, after = branch
    counts = np.zeros(positions.size, np.int64)
    item_rows: list[Int64s] = []
    item_starts: list[Int64s] = []
    item_lengths: list[Int64s] = []
    # Rows still reading their array: each round reads one block count per row, then
    # the block's items, one item of every row per step.
    rows = np.flatnonzero(present)
    at = after[rows]
    while rows.size:
        read = read_longs(buffer, limit, at)
        if read is None:
            return None
        block, at = read
        if int(block.min()) < 0 or int(block.max()) > MAX_ITEMS:
            return None  # byte-sized blocks, long lists: the per-op decoder's
        ended = block == 0
        after[rows[ended]] = at[ended]
        rows, at, block = rows[~ended], at[~ended], block[~ended]
        counts[rows] += block
        if int(counts.max(initial=0)) > MAX_ITEMS:
            return None
        for step in range(int(block.max(initial=0))):
            going = np.flatnonzero(block > step)
            content = read_lengths(buffer, limit, at[going])
            if content is None:
                return None
            lengths, starts = content
            item_rows.append(rows[going])
            item_starts.append(starts)
            item_lengths.append(lengths)
            at[going] = starts + lengths
    if item_rows:
        owner = np.concatenate(item_rows)
        # Stable: a row's items were read in order, one step after another.
        order = np.argsort(owner, kind="stable")
        items = Slices(np.concatenate(item_starts)[order], np.concatenate(item_lengths)[order])
    else:
        items = Slices(np.zeros(0, np.int64), np.zeros(0, np.int64))
    return Lists(counts, present, items), after


def decode_ops(buffer: Bytes, limit: int, positions: Int64s, ends: Int64s) -> OpColumns | None:
    """The fields after ``state`` of the payloads whose ``op`` field is at ``positions``
    and which end at ``ends`` (exclusive); None when one of them is malformed or uses an
    encoding left to the per-op decoder (see the module)."""
    read = read_longs(buffer, limit, positions)
    if read is None:
        return None
    op, at = read
    if op.size and (int(op.min()) < 0 or int(op.max()) >= OP_COUNT):
        return None
    content = read_lengths(buffer, limit, at)
    if content is None:
        return None
    key_lengths, key_starts = content
    at = key_starts + key_lengths
    map_key = _optional_bytes(buffer, limit, at)
    if map_key is None:
        return None
    map_keys, at = map_key
    value = _optional_bytes(buffer, limit, at)
    if value is None:
        return None
    values_, at = value
    items = _optional_items(buffer, limit, at)
    if items is None:
        return None
    lists, at = items
    if not np.array_equal(at, ends):
        return None  # trailing bytes, or a field running into the next payload
    return OpColumns(op, Slices(key_starts, key_lengths), map_keys, values_, lists)


__all__ = ["MAX_ITEMS", "OP_COUNT", "Lists", "OpColumns", "Slices", "decode_ops"]
