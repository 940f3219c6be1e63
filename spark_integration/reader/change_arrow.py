"""Arrow arrays built from byte slices of one buffer
(:class:`~kafka_changelog.state.schema.op_columns.Slices`).

Each column is built with one copy of its bytes and no Python object per row: the
offsets, the validity bitmap and the data buffer are made with NumPy and wrapped.
String columns with few distinct values (state names) and decoded keys go through a
dictionary: each distinct value is decoded once in Python, exactly as the per-row
code decodes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from kafka_changelog.avro_columns import Bytes, gather
from kafka_changelog.state.schema.op_columns import Lists, Slices

#: Bytes an Arrow ``binary`` column may hold (32-bit offsets).
MAX_BINARY_BYTES = (1 << 31) - 1


def _validity(present: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    if present is None:
        return None, 0
    nulls = int(present.size - np.count_nonzero(present))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(present, bitorder="little")), nulls


def binary_array(buffer: Bytes, slices: Slices) -> pa.Array:
    """The ``binary`` array of the slices (null where not present).

    Raises ``OverflowError`` past :data:`MAX_BINARY_BYTES` (callers bound their batches
    well below it)."""
    lengths = slices.lengths
    data, offsets = gather(buffer, slices.starts, lengths)
    if int(offsets[-1]) > MAX_BINARY_BYTES:
        raise OverflowError(f"{int(offsets[-1])} bytes do not fit one Arrow binary array")
    validity, nulls = _validity(slices.present)
    return pa.BinaryArray.from_buffers(
        pa.binary(), lengths.size,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)], nulls)


def list_array(buffer: Bytes, lists: Lists, list_type: pa.ListType) -> pa.Array:
    """The ``list<binary>`` array of ``lists`` (null where not present)."""
    offsets = np.zeros(lists.counts.size + 1, np.int32)
    np.cumsum(lists.counts, out=offsets[1:])
    child = binary_array(buffer, lists.items)
    validity, nulls = _validity(lists.present)
    return pa.ListArray.from_buffers(list_type, lists.counts.size,
                                     [validity, pa.py_buffer(offsets)], nulls, children=[child])


def decoded_strings(values: pa.Array, decode: Callable[[bytes], str | None]) -> pa.Array:
    """The ``string`` array of ``decode(v)`` for each ``binary`` value (null stays null),
    calling ``decode`` once per distinct value; ``decode`` may raise."""
    encoded = values.dictionary_encode()
    distinct: Sequence[bytes] = encoded.dictionary.to_pylist()
    texts = pa.array([decode(v) for v in distinct], pa.string())
    return texts.take(encoded.indices)


def utf8(data: bytes) -> str:
    """``data`` decoded as strict UTF-8 (what the per-row decoders do)."""
    return data.decode()


__all__ = ["MAX_BINARY_BYTES", "binary_array", "decoded_strings", "list_array", "utf8"]
