"""A state write's input rows, read from Arrow batches: their columns checked, their values
encoded.

The columns are those of mode ``state`` (``docs/reading.md``), so that what a read gives
can be written back: ``state`` and ``key`` are required; ``map_key``, ``list_index``,
``value``, ``value_decoded`` and ``expires_at`` are optional; ``operator``, ``key_group``,
``kind`` and ``key_decoded`` may be present and are not read (the key group is the key's,
the kind the state's). Any other column is refused, naming it.

A row's value is ``value`` (the stored bytes, without expiry) or, when that is null,
``value_decoded`` encoded with the state's serializer as mode ``state`` renders it
(``utf8`` text, ``int64`` and ``float64`` numbers as text, ``json`` text); a row with
neither deletes its entry (:mod:`kafka_changelog.state.history.entry_changes`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_changelog.keygroups import key_groups_for_keys
from kafka_changelog.state.history.entry_changes import EntryChange, StateWriteError, meta_of
from kafka_changelog.state.schema.avro_names import is_avro_name
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.schema.ttl import split_serializer_name

#: Columns read, and their Arrow types (Spark's types as they reach the writer).
COLUMNS: dict[str, tuple[pa.DataType, ...]] = {
    "state": (pa.string(), pa.large_string()),
    "key": (pa.binary(), pa.large_binary()),
    "map_key": (pa.binary(), pa.large_binary()),
    "list_index": (pa.int32(), pa.int64(), pa.int16(), pa.int8()),
    "value": (pa.binary(), pa.large_binary()),
    "value_decoded": (pa.string(), pa.large_string()),
}
#: Columns of mode ``state`` a write accepts and does not read.
IGNORED_COLUMNS = ("operator", "key_group", "kind", "key_decoded")
REQUIRED_COLUMNS = ("state", "key")
_INT64 = struct.Struct(">q")
_FLOAT64 = struct.Struct(">d")


def check_columns(schema: pa.Schema) -> None:
    """Refuse a missing required column, an unknown one or one of another type."""
    names = set(schema.names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise StateWriteError(
            f"a state write needs the column(s) {missing} (the rows of mode 'state': state, "
            f"key, then value or value_decoded, map_key, list_index, expires_at); got "
            f"{schema.names}")
    unknown = sorted(names - set(COLUMNS) - set(IGNORED_COLUMNS) - {"expires_at"})
    if unknown:
        raise StateWriteError(
            f"a state write does not know the column(s) {unknown}; its columns are those of "
            f"mode 'state': {[*COLUMNS, 'expires_at', *IGNORED_COLUMNS]}")
    for field in schema:
        expected = COLUMNS.get(field.name)
        if expected is not None and field.type not in expected:
            raise StateWriteError(
                f"column {field.name!r} must be of type {expected[0]}, got {field.type}")
        if field.name == "expires_at" and not pa.types.is_timestamp(field.type):
            raise StateWriteError(f"column 'expires_at' must be a timestamp, got {field.type}")


def entry_changes(batches: Iterable[pa.RecordBatch], metas: Mapping[str, StateMeta],
                  max_parallelism: int) -> Iterator[EntryChange]:
    """The rows of ``batches`` as entry changes (columns checked per batch), each with its
    key's key group (computed for a batch at once)."""
    for batch in batches:
        check_columns(batch.schema)
        yield from _batch_changes(batch, metas, max_parallelism)


def _column(batch: pa.RecordBatch, name: str) -> list[Any]:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [None] * batch.num_rows
    column = batch.column(index)
    if name == "expires_at":
        micros = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        return [None if m is None else m // 1000 for m in micros.to_pylist()]
    values: list[Any] = column.to_pylist()
    return values


def _key_groups(batch: pa.RecordBatch, max_parallelism: int) -> list[int | None]:
    """The key group of every row's key, computed for the whole batch at once (a null key
    gets a placeholder: its row is refused)."""
    keys = pc.cast(batch.column(batch.schema.get_field_index("key")), pa.large_binary())
    keys = pc.fill_null(keys, b"")
    offsets = np.frombuffer(keys.buffers()[1], np.int64, len(keys) + 1, keys.offset * 8)
    data = keys.buffers()[2]
    values = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    groups: list[int | None] = key_groups_for_keys(offsets, values, max_parallelism).tolist()
    return groups


def _batch_changes(batch: pa.RecordBatch, metas: Mapping[str, StateMeta],
                   max_parallelism: int) -> Iterator[EntryChange]:
    columns = [_column(batch, name) for name in
               ("state", "key", "value", "value_decoded", "map_key", "list_index", "expires_at")]
    columns.append(_key_groups(batch, max_parallelism))
    for state, key, value, decoded, map_key, index, expires, group in zip(*columns,
                                                                           strict=True):
        if state is None or key is None:
            raise StateWriteError(
                f"a state write's row has a null {'state' if state is None else 'key'} "
                f"(state {state!r}, key {key!r}): every row names a state and a key")
        if value is None and decoded is not None:
            value = encode_decoded(state, key, decoded, metas)
        yield EntryChange(state, key, value, map_key, index, expires, group)


def encode_decoded(state: str, key: bytes, text: str, metas: Mapping[str, StateMeta]
                   ) -> bytes:
    """``text`` (a ``value_decoded``) as the stored bytes of ``state``'s serializer."""
    meta = meta_of(EntryChange(state, key, None), metas)
    serializer, _ = split_serializer_name(meta.value_serializer)
    try:
        if serializer == "utf8":
            return text.encode()
        if serializer == "int64":
            return _INT64.pack(int(text))
        if serializer == "float64":
            return _FLOAT64.pack(float(text))
        if serializer == "json":
            return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, struct.error) as exc:
        raise StateWriteError(
            f"state {state!r} key {key!r}: value_decoded {text[:100]!r} is not a "
            f"{serializer} value ({exc})") from None
    what = "Avro" if is_avro_name(serializer) else serializer
    raise StateWriteError(
        f"state {state!r} key {key!r}: value_decoded cannot be encoded for a state whose "
        f"values are {what}: give the stored bytes in column value")


__all__ = ["COLUMNS", "IGNORED_COLUMNS", "REQUIRED_COLUMNS", "check_columns", "encode_decoded",
           "entry_changes"]
