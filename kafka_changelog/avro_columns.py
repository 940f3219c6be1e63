"""Avro ``long`` encoding of whole columns at once (NumPy), for the writer's hot path.

:func:`varint_rows` turns a few int64 columns into, for each row, the concatenation of
the Avro encodings (zig-zag, then base-128 little-endian varint) of its values, column
by column: exactly what :func:`~kafka_changelog.avro_binary.zigzag_varint` of each value
joined gives (tested), at a few nanoseconds per value instead of a Python call each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Int64s = npt.NDArray[np.int64]

def _zigzag(values: Int64s) -> npt.NDArray[np.uint64]:
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def varint_rows(columns: Sequence[Int64s]) -> tuple[bytes, npt.NDArray[np.int64]]:
    """The varints of ``columns`` (equal lengths), row by row: ``(data, offsets)``.

    Row ``i``'s bytes are ``data[offsets[i]:offsets[i + 1]]`` (``offsets`` has one more
    entry than there are rows, starting at 0).
    """
    rows = len(columns[0])
    offsets = np.zeros(rows + 1, np.int64)
    if rows == 0:
        return b"", offsets
    zigzags = [_zigzag(np.asarray(column, np.int64)) for column in columns]
    highs = [int(z.max()) for z in zigzags]
    widths = [max(1, (high.bit_length() + 6) // 7) for high in highs]
    # Byte planes: plane p holds, for every row, one byte position of one column's varint
    # (contiguous per plane, so each step is one pass over the rows); ``used`` says which
    # rows' varints reach that byte.
    planes = np.empty((sum(widths), rows), np.uint8)
    used = np.ones((sum(widths), rows), bool)
    lengths = np.zeros(rows, np.int64)
    plane = 0
    for zigzag, high, width in zip(zigzags, highs, widths, strict=True):
        if width == 1:
            planes[plane] = zigzag
        elif int(zigzag.min()) == high:  # one value (a change set's sequence number)
            for j in range(width):
                planes[plane + j] = ((high >> (7 * j)) & 0x7F) | (0x80 if j < width - 1 else 0)
            lengths += width - 1
        else:
            rest: npt.NDArray[Any] = (
                zigzag.astype(np.uint32) if high < 2**32 else zigzag)
            for j in range(width):
                rest_next = rest >> 7
                more = rest_next != 0  # another byte follows: set the continuation bit
                planes[plane + j] = (rest & 0x7F) | (more.view(np.uint8) << 7)
                if j + 1 < width:
                    used[plane + j + 1] = more
                    lengths += more
                rest = rest_next
        plane += width
    lengths += len(columns)
    np.cumsum(lengths, out=offsets[1:])
    # Row-major order: each row's bytes, column after column.
    data = np.ascontiguousarray(planes.T)[np.ascontiguousarray(used.T)]
    return data.tobytes(), offsets
