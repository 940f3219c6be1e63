"""Arrow record batches of ``format("kafka-changelog")``, row by row: change rows and state rows.

Change rows here are the reference path, one change decoded at a time
(:func:`change_batches`); reads use the column-wise one
(:mod:`.change_columns`), which falls back to this for what it leaves
aside. The Arrow schemas (``STATE_SCHEMA`` here, ``CHANGES_SCHEMA`` in
:mod:`.change_schema`) are exactly what Spark derives from the
reader's Spark schema (``spark_integration.reader.datasource``; a test compares the two),
because Spark refuses batches whose schema differs. No pyspark import.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from kafka_changelog.change import META_KEY_GROUP
from kafka_changelog.errors import RecordDecodeError
from kafka_changelog.keys import key_text
from kafka_changelog.state.schema.avro_names import is_avro_name
from kafka_changelog.state.schema.evolution import read_avro_value
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.schema.ttl import live_entry, split_serializer_name
from kafka_changelog.state.tables.protocol import Entry, KeyedStateTable
from kafka_changelog.state.time.timers import TIMERS_STATE

from .change_schema import BATCH_ROWS, BINARY_LIST, CHANGES_SCHEMA, META_OP
from .scan import OffsetSlice, ScannedChange, decode_state_op

#: Mode ``state``: one row per (state, key[, map key | list index]) at the checkpoint (the
#: reserved timers state left out: mode ``timers`` shows it, decoded).
STATE_SCHEMA = pa.schema([
    pa.field("operator", pa.string()),
    pa.field("key_group", pa.int32()),
    pa.field("state", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("key", pa.binary()),
    pa.field("map_key", pa.binary()),
    pa.field("list_index", pa.int32()),
    pa.field("value", pa.binary()),
    pa.field("value_decoded", pa.string()),
    pa.field("key_decoded", pa.string()),
    # TTL'd states: when the entry expires (null for states without a TTL).
    pa.field("expires_at", pa.timestamp("us", tz="UTC")),
])


class ChangeRows:
    """Collects the change rows of one slice and turns them into record batches.

    Registrations become ``op = 'META'`` rows with ``state`` set, ``key_group``
    null and ``value`` holding the registration payload (``schemas/state_meta.avsc``);
    every other change is decoded as a ``StateOp``.
    """

    def __init__(self, operator: str, subtask: int, piece: OffsetSlice,
                 key_types: Sequence[str] | None = None) -> None:
        self._operator = operator
        self._subtask = subtask
        self._slice = piece
        self._key_types = key_types
        self._clear()

    def _clear(self) -> None:
        self._key_group: list[int | None] = []
        self._offset: list[int] = []
        self._sqn: list[int] = []
        self._position: list[int] = []
        self._op: list[str] = []
        self._state: list[str] = []
        self._key: list[bytes | None] = []
        self._map_key: list[bytes | None] = []
        self._value: list[bytes | None] = []
        self._values: list[list[bytes] | None] = []

    def __len__(self) -> int:
        return len(self._offset)

    def fill(self, changes: Iterator[ScannedChange], limit: int) -> int:
        """Decode up to ``limit`` changes from ``changes`` into rows; how many were taken.

        Raises ``RecordDecodeError`` naming the offset of a change that does not decode.
        """
        # The hot loop of a scan: bound methods and functions are looked up once.
        key_groups, offsets = self._key_group.append, self._offset.append
        sqns, positions = self._sqn.append, self._position.append
        ops, states, keys = self._op.append, self._state.append, self._key.append
        map_keys, values_, lists = self._map_key.append, self._value.append, self._values.append
        decode = decode_state_op
        taken = 0
        for offset, sqn, position, key_group, payload in itertools.islice(changes, limit):
            taken += 1
            if key_group == META_KEY_GROUP:
                try:
                    meta = StateMeta.from_bytes(payload)
                except Exception as exc:  # fastavro raises several types for garbage
                    raise self._undecodable(offset, sqn, position, "registration", exc) from exc
                key_groups(None)
                ops(META_OP)
                states(meta.state)
                keys(None)
                map_keys(None)
                values_(payload)
                lists(None)
            else:
                try:
                    state, op, key, map_key, value, values = decode(payload)
                except ValueError as exc:
                    raise self._undecodable(offset, sqn, position, "state op", exc) from exc
                key_groups(key_group)
                ops(op)
                states(state)
                keys(key)
                map_keys(map_key)
                values_(value)
                lists(values)
            offsets(offset)
            sqns(sqn)
            positions(position)
        return taken

    def _undecodable(self, offset: int, sqn: int, position: int, what: str,
                     exc: Exception) -> RecordDecodeError:
        piece = self._slice
        return RecordDecodeError(
            piece.topic, piece.partition, offset,
            f"change {position} of change set {sqn} (log {piece.log_id}) is not a {what}: "
            f"{exc}")

    def flush(self) -> pa.RecordBatch:
        """The collected rows as one batch (and start collecting anew)."""
        n = len(self)
        piece = self._slice
        batch = pa.RecordBatch.from_arrays([
            pa.array([self._operator] * n, pa.string()),
            pa.array([self._subtask] * n, pa.int32()),
            pa.array([piece.log_id] * n, pa.string()),
            pa.array(self._key_group, pa.int32()),
            pa.array([piece.topic] * n, pa.string()),
            pa.array([piece.partition] * n, pa.int32()),
            pa.array(self._offset, pa.int64()),
            pa.array(self._sqn, pa.int64()),
            pa.array(self._position, pa.int32()),
            pa.array(self._op, pa.string()),
            pa.array(self._state, pa.string()),
            pa.array(self._key, pa.binary()),
            pa.array(self._map_key, pa.binary()),
            pa.array(self._value, pa.binary()),
            pa.array(self._values, BINARY_LIST),
            pa.array(decoded_keys(self._key, self._key_types), pa.string()),
        ], schema=CHANGES_SCHEMA)
        self._clear()
        return batch


def change_batches(changes: Iterable[ScannedChange], operator: str, subtask: int,
                   piece: OffsetSlice, batch_rows: int = BATCH_ROWS,
                   key_types: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of at most ``batch_rows`` rows of the slice's ``changes``."""
    rows = ChangeRows(operator, subtask, piece, key_types)
    source = iter(changes)
    while True:
        taken = rows.fill(source, batch_rows)
        if taken:
            yield rows.flush()
        if taken < batch_rows:
            return


def decoded_keys(keys: Sequence[bytes | None], key_types: Sequence[str] | None
                 ) -> list[str | None]:
    """``key_decoded`` of rows with these keys: :func:`~kafka_changelog.keys.key_text`
    with the recorded key column types (None without them, for registrations and for
    keys they do not decode)."""
    if key_types is None:
        return [None] * len(keys)
    texts: dict[bytes, str | None] = {}  # the rows of one key are many (entries, changes)
    decoded: list[str | None] = []
    for key in keys:
        if key is None:
            decoded.append(None)
            continue
        if key not in texts:
            texts[key] = key_text(key, key_types)
        decoded.append(texts[key])
    return decoded


# -- state rows ------------------------------------------------------------------------------


_INT64 = struct.Struct(">q")
_FLOAT64 = struct.Struct(">d")


def render_value(serializer: str, data: bytes) -> str | None:
    """A readable rendering of ``data`` written by serializer ``serializer``, else None.

    ``utf8``: the text; ``int64``/``float64``: the number as text; ``json``: the JSON
    text; Avro: the value resolved to the state's latest recorded schema, as JSON text.
    Other serializers (``bytes``, Avro states of 0.2.0, whose schema is not recorded)
    and bytes that do not decode give None.
    """
    if is_avro_name(serializer):
        try:
            return json.dumps(read_avro_value(serializer, data), sort_keys=True)
        except ValueError:
            return None
    try:
        if serializer == "utf8" or serializer == "json":
            return data.decode()
        if serializer == "int64":
            return str(_INT64.unpack(data)[0])
        if serializer == "float64":
            return repr(_FLOAT64.unpack(data)[0])
    except (UnicodeDecodeError, struct.error):
        return None
    return None


#: (operator, key group, state, kind, key, map key, list index, value, value decoded,
#: expires at in microseconds since the epoch)
StateRow = tuple[str, int, str, str, bytes, bytes | None, int | None, bytes, str | None,
                 int | None]


def state_rows(table: KeyedStateTable, operator: str, at_ms: int | None = None
               ) -> Iterator[StateRow]:
    """Every entry of ``table`` as rows, ordered by key group, state, key, map key/index,
    but the timers' (the reserved state ``__kc_timers``: see :mod:`.timer_rows`).

    A TTL'd state's values are shown without their expiry, with it in ``expires_at``;
    those expired at ``at_ms`` (the checkpoint's processing time) are left out, as the
    stateful function would not see them."""
    metas = table.metas
    for key_group in table.key_groups():
        for name, key, stored in table.entries(key_group):
            if name == TIMERS_STATE:
                continue
            meta = metas[name]
            kind = meta.kind.value
            serializer, with_ttl = split_serializer_name(meta.value_serializer)
            entry: Entry | None = stored
            expiries: Any = None
            if with_ttl:
                entry, expiries = live_entry(stored, at_ms)
                if entry is None:
                    continue
            if isinstance(entry, bytes):
                yield (operator, key_group, name, kind, key, None, None, entry,
                       render_value(serializer, entry), _micros(expiries))
            elif isinstance(entry, list):
                for index, item in enumerate(entry):
                    yield (operator, key_group, name, kind, key, None, index, item,
                           render_value(serializer, item),
                           _micros(expiries[index] if expiries is not None else None))
            elif entry is not None:
                for map_key in sorted(entry):
                    item = entry[map_key]
                    yield (operator, key_group, name, kind, key, map_key, None, item,
                           render_value(serializer, item),
                           _micros(expiries[map_key] if expiries is not None else None))


def _micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


def rows_to_batch(rows: list[StateRow], key_types: Sequence[str] | None = None
                  ) -> pa.RecordBatch:
    """State rows as one record batch of :data:`STATE_SCHEMA` (``key_decoded`` from the
    key column and ``key_types``)."""
    columns: list[list[Any]] = [list(column) for column in zip(*rows, strict=True)] if rows else [
        [] for _ in STATE_SCHEMA[:-1]]
    # The rows end with expires_at; key_decoded comes before it.
    columns.insert(len(columns) - 1, decoded_keys(columns[4], key_types))
    return pa.RecordBatch.from_arrays(
        [pa.array(column, f.type) for column, f in zip(columns, STATE_SCHEMA, strict=True)],
        schema=STATE_SCHEMA)


def state_batches(table: KeyedStateTable, operator: str, batch_rows: int = BATCH_ROWS,
                  key_types: Sequence[str] | None = None, at_ms: int | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """Record batches of at most ``batch_rows`` rows of :func:`state_rows`."""
    rows: list[StateRow] = []
    for row in state_rows(table, operator, at_ms):
        rows.append(row)
        if len(rows) >= batch_rows:
            yield rows_to_batch(rows, key_types)
            rows = []
    if rows:
        yield rows_to_batch(rows, key_types)


__all__ = [
    "BATCH_ROWS",
    "CHANGES_SCHEMA",
    "META_OP",
    "STATE_SCHEMA",
    "ChangeRows",
    "change_batches",
    "decoded_keys",
    "render_value",
    "rows_to_batch",
    "state_batches",
    "state_rows",
]
