"""State mutations and registrations as changelog payloads (``schemas/state_op.avsc``,
``schemas/state_meta.avsc``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import Enum

from ...avro_binary import (
    SMALL_LIMIT,
    SMALL_VARINTS,
    AvroDecodeError,
    encode_string,
    read_bytes,
    read_long,
    read_string,
    varint,
    zigzag_varint,
)
from ...serialization import decode, encode
from .kinds import StateKind


class OpKind(str, Enum):
    """Mutation kinds (names as in ``schemas/state_op.avsc``)."""

    SET = "SET"
    DELETE = "DELETE"
    LIST_ADD = "LIST_ADD"
    LIST_REPLACE = "LIST_REPLACE"
    MAP_PUT = "MAP_PUT"
    MAP_REMOVE = "MAP_REMOVE"


# The kinds as module constants: cheaper on hot paths than ``OpKind.SET`` (an attribute
# lookup through the enum class on each call).
SET, DELETE = OpKind.SET, OpKind.DELETE
LIST_ADD, LIST_REPLACE = OpKind.LIST_ADD, OpKind.LIST_REPLACE
MAP_PUT, MAP_REMOVE = OpKind.MAP_PUT, OpKind.MAP_REMOVE


@dataclass(frozen=True, slots=True, init=False)
class StateOp:
    """One mutation of one state for one key.

    ``to_bytes``/``from_bytes`` are the Avro binary of ``schemas/state_op.avsc``,
    hand-written (byte-identical to fastavro's, tested): they run for every state
    mutation and every change replayed on restore.
    """

    state: str
    op: OpKind
    key: bytes
    map_key: bytes | None = None
    value: bytes | None = None
    values: tuple[bytes, ...] | None = None

    def __init__(
        self,
        state: str,
        op: OpKind,
        key: bytes,
        map_key: bytes | None = None,
        value: bytes | None = None,
        values: tuple[bytes, ...] | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass calls object.__setattr__ per field,
        # which looks the slot up on the type each time; the slots' own setters take half
        # the time. Same signature and defaults as the generated one (tested).
        _set_state(self, state)
        _set_op(self, op)
        _set_key(self, key)
        _set_map_key(self, map_key)
        _set_value(self, value)
        _set_values(self, values)

    def to_bytes(self) -> bytes:
        """The Avro binary of this op (``schemas/state_op.avsc``)."""
        small = SMALL_VARINTS
        state = _STATE_PREFIXES.get(self.state)
        if state is None:
            state = _state_prefix(self.state)
        key = self.key
        n = len(key)
        parts = [state, _OP_INDEX_BYTES[self.op],
                 small[n + 1] if n < SMALL_LIMIT else zigzag_varint(n), key]
        data = self.map_key
        if data is None:
            parts.append(b"\x00")
        else:
            n = len(data)
            parts += (_PRESENT[n + 1] if n < _PRESENT_LIMIT else b"\x02" + zigzag_varint(n),
                      data)
        data = self.value
        if data is None:
            parts.append(b"\x00")
        else:
            n = len(data)
            parts += (_PRESENT[n + 1] if n < _PRESENT_LIMIT else b"\x02" + zigzag_varint(n),
                      data)
        values = self.values
        if values is None:
            parts.append(b"\x00")
        elif values:
            # One block (count, items), then the empty block that ends the array.
            n = len(values)
            parts.append(_PRESENT[n + 1] if n < _PRESENT_LIMIT else b"\x02" + zigzag_varint(n))
            for data in values:
                n = len(data)
                parts += (small[n + 1] if n < SMALL_LIMIT else zigzag_varint(n), data)
            parts.append(b"\x00")
        else:
            parts.append(b"\x02\x00")  # present, no blocks
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> StateOp:
        """Inverse of :meth:`to_bytes`; reads any valid Avro encoding of the schema
        (multi-block arrays, blocks with byte sizes, non-minimal varints).

        Raises :class:`~kafka_changelog.avro_binary.AvroDecodeError` (a ``ValueError``)
        naming the field for truncated or trailing bytes, an unknown op or union index,
        a negative length or a state name that is not UTF-8.
        """
        if type(data) is not bytes:
            data = bytes(data)  # slices of bytes are bytes, as the fields must be
        op = _decode_common(cls, data)
        return op if op is not None else _decode_any(cls, data)


# -- the StateOp codec ---------------------------------------------------------------------

_set_state, _set_op, _set_key, _set_map_key, _set_value, _set_values = (
    StateOp.__dict__[f.name].__set__ for f in fields(StateOp))

#: The op kinds in the order of the schema's enum symbols (tested), and their encodings.
_OPS = tuple(OpKind)
_OP_INDEX_BYTES = {kind: varint(index) for index, kind in enumerate(_OPS)}
#: A one-byte varint ``b`` is an op index if ``b & 0x81 == 0`` and ``b < _OP_BYTE_LIMIT``.
_OP_BYTE_LIMIT = 2 * len(_OPS)

#: Union branch 1 (the non-null one) followed by a length or count: ``_PRESENT[n + 1]``.
_PRESENT = [b"\x02" + v for v in SMALL_VARINTS[:1025]]
_PRESENT_LIMIT = len(_PRESENT) - 1

#: Encoded state names (length and UTF-8): a job has a handful, used for every op.
_STATE_PREFIXES: dict[str, bytes] = {}
_STATE_PREFIXES_MAX = 4096


def _state_prefix(state: str) -> bytes:
    encoded = encode_string(state)
    if len(_STATE_PREFIXES) < _STATE_PREFIXES_MAX:  # bounded, whatever the callers do
        _STATE_PREFIXES[state] = encoded
    return encoded


def encode_ops(
    state: str,
    op: OpKind,
    keys: Sequence[bytes],
    map_keys: Sequence[bytes | None] | None = None,
    values: Sequence[bytes | None] | None = None,
    items: Sequence[tuple[bytes, ...] | None] | None = None,
) -> list[bytes]:
    """The payloads of many ops of one state and kind, column by column: payload ``i``
    is ``StateOp(state, op, keys[i], map_keys[i], values[i], items[i]).to_bytes()``
    (byte-identical, tested), without building the ops (bulk state). A column that is
    None is None for every op; given columns must be as long as ``keys``."""
    small, limit = SMALL_VARINTS, SMALL_LIMIT
    present, present_limit = _PRESENT, _PRESENT_LIMIT
    state_prefix = _STATE_PREFIXES.get(state)
    if state_prefix is None:
        state_prefix = _state_prefix(state)
    head = state_prefix + _OP_INDEX_BYTES[op]
    n = len(keys)
    for name, column in (("map_keys", map_keys), ("values", values), ("items", items)):
        if column is not None and len(column) != n:
            raise ValueError(f"encode_ops: {n} keys but {len(column)} {name}")
    # Each field's encoding, then one join per op.
    key_part = [small[len(k) + 1] + k if len(k) < limit else zigzag_varint(len(k)) + k
                for k in keys]
    parts: list[list[bytes]] = [[head] * n, key_part]
    for column in (map_keys, values):
        if column is None:
            parts.append([b"\x00"] * n)
            continue
        parts.append([
            b"\x00" if data is None else
            present[len(data) + 1] + data if len(data) < present_limit else
            b"\x02" + zigzag_varint(len(data)) + data
            for data in column])
    if items is None:
        parts.append([b"\x00"] * n)
    else:
        parts.append([_encode_items(entry, small, limit, present, present_limit)
                      for entry in items])
    join = b"".join
    return [join(fields) for fields in zip(*parts, strict=True)]


def ops_of_columns(
    state: str,
    op: OpKind,
    keys: Sequence[bytes],
    map_keys: Sequence[bytes | None] | None = None,
    values: Sequence[bytes | None] | None = None,
    items: Sequence[tuple[bytes, ...] | None] | None = None,
) -> list[StateOp]:
    """The ops :func:`encode_ops` encodes, as :class:`StateOp` objects."""
    n = len(keys)
    nothing: list[None] = [None] * n
    return [StateOp(state, op, key, map_key, value, entry)
            for key, map_key, value, entry in zip(
                keys, nothing if map_keys is None else map_keys,
                nothing if values is None else values, nothing if items is None else items,
                strict=True)]


def _encode_items(entry: tuple[bytes, ...] | None, small: list[bytes], limit: int,
                  present: list[bytes], present_limit: int) -> bytes:
    """The ``values`` field of a StateOp (as :meth:`StateOp.to_bytes` writes it)."""
    if entry is None:
        return b"\x00"
    if not entry:
        return b"\x02\x00"  # present, no blocks
    n = len(entry)
    parts = [present[n + 1] if n < present_limit else b"\x02" + zigzag_varint(n)]
    for data in entry:
        size = len(data)
        parts += (small[size + 1] if size < limit else zigzag_varint(size), data)
    parts.append(b"\x00")
    return b"".join(parts)


def _decode_common(cls: type[StateOp], p: bytes) -> StateOp | None:
    """Decode the usual encoding fast: op and union indexes in one byte, at most one block
    of fewer than 64 values. None for anything else, valid or not; :func:`_decode_any`
    then decodes it or says what is wrong.

    Lengths below 64 are read inline: a byte ``b`` with ``b & 0x81 == 0`` is the one-byte
    varint of ``b >> 1``; longer ones go through ``read_bytes``. Slicing past the end
    never raises: the next index raises IndexError or the final length check fails.
    """
    try:
        b = p[0]
        if b & 0x81:
            state, pos = read_string(p, 0, "StateOp.state")
        else:
            pos = 1 + (b >> 1)
            state = p[1:pos].decode()
        b = p[pos]
        if b & 0x81 or b >= _OP_BYTE_LIMIT:
            return None
        op = _OPS[b >> 1]
        pos += 1
        b = p[pos]
        if b & 0x81:
            key, pos = read_bytes(p, pos, "StateOp.key")
        else:
            start = pos + 1
            pos = start + (b >> 1)
            key = p[start:pos]
        # map_key and value are read by the same code written out twice: a loop or a
        # helper over the two costs ~15% of a decode (measured), on the replay hot path.
        b = p[pos]
        map_key: bytes | None = None
        if b == 2:
            pos += 1
            b = p[pos]
            if b & 0x81:
                map_key, pos = read_bytes(p, pos, "StateOp.map_key")
            else:
                start = pos + 1
                pos = start + (b >> 1)
                map_key = p[start:pos]
        elif b:
            return None
        else:
            pos += 1
        b = p[pos]
        value: bytes | None = None
        if b == 2:
            pos += 1
            b = p[pos]
            if b & 0x81:
                value, pos = read_bytes(p, pos, "StateOp.value")
            else:
                start = pos + 1
                pos = start + (b >> 1)
                value = p[start:pos]
        elif b:
            return None
        else:
            pos += 1
        b = p[pos]
        values: tuple[bytes, ...] | None = None
        if b == 2:
            b = p[pos + 1]
            if b & 0x81:  # 64 values or more, or a block with its byte size
                return None
            pos += 2
            if b:
                items = []
                for _ in range(b >> 1):
                    b = p[pos]
                    if b & 0x81:
                        item, pos = read_bytes(p, pos, "StateOp.values")
                        items.append(item)
                    else:
                        start = pos + 1
                        pos = start + (b >> 1)
                        items.append(p[start:pos])
                if p[pos]:  # another block follows
                    return None
                pos += 1
                values = tuple(items)
            else:
                values = ()
        elif b:
            return None
        else:
            pos += 1
        if pos != len(p):
            return None
        return cls(state, op, key, map_key, value, values)
    except (IndexError, UnicodeDecodeError):
        return None


def _decode_any(cls: type[StateOp], p: bytes) -> StateOp:
    """Any valid encoding of a StateOp; :class:`AvroDecodeError` naming what is wrong."""
    state, pos = read_string(p, 0, "StateOp.state")
    index, pos = read_long(p, pos, "StateOp.op")
    if not 0 <= index < len(_OPS):
        raise AvroDecodeError(
            f"malformed StateOp.op: enum index {index} is not one of the {len(_OPS)} symbols "
            f"({', '.join(kind.value for kind in _OPS)})")
    key, pos = read_bytes(p, pos, "StateOp.key")
    map_key, pos = _read_optional_bytes(p, pos, "StateOp.map_key")
    value, pos = _read_optional_bytes(p, pos, "StateOp.value")
    branch, pos = read_long(p, pos, "StateOp.values")
    values: tuple[bytes, ...] | None = None
    if branch == 1:
        values, pos = _read_byte_array(p, pos, "StateOp.values")
    elif branch != 0:
        raise AvroDecodeError(
            f"malformed StateOp.values: union index {branch} is neither 0 (null) nor 1 (array)")
    if pos != len(p):
        raise AvroDecodeError(
            f"{len(p) - pos} trailing bytes after the StateOp (it ends at byte {pos} of "
            f"{len(p)})")
    return cls(state, _OPS[index], key, map_key, value, values)


def _read_optional_bytes(p: bytes, pos: int, what: str) -> tuple[bytes | None, int]:
    """A ``["null", "bytes"]`` union at ``pos``."""
    branch, pos = read_long(p, pos, what)
    if branch == 0:
        return None, pos
    if branch != 1:
        raise AvroDecodeError(
            f"malformed {what}: union index {branch} is neither 0 (null) nor 1 (bytes)")
    return read_bytes(p, pos, what)


def _read_byte_array(p: bytes, pos: int, what: str) -> tuple[tuple[bytes, ...], int]:
    """An Avro array of bytes at ``pos``: blocks until an empty one.

    A block is a count and that many items; a negative count ``-n`` means ``n`` items
    preceded by the block's size in bytes (which must match).
    """
    items: list[bytes] = []
    count_of, size_of = f"block count of {what}", f"block size of {what}"
    while True:
        block_at = pos
        count, pos = read_long(p, pos, count_of)
        if count == 0:
            return tuple(items), pos
        size = -1
        if count < 0:
            count = -count
            size, pos = read_long(p, pos, size_of)
            if size < 0:
                raise AvroDecodeError(
                    f"malformed {what}: negative block size {size} at byte {block_at}")
        start = pos
        for _ in range(count):
            item, pos = read_bytes(p, pos, what)
            items.append(item)
        if size >= 0 and pos - start != size:
            raise AvroDecodeError(
                f"malformed {what}: the block at byte {block_at} says it has {size} bytes "
                f"but its {count} items take {pos - start}")


@dataclass(frozen=True, slots=True)
class StateMeta:
    """Registration of a state: kind and serializer names."""

    state: str
    kind: StateKind
    value_serializer: str
    map_key_serializer: str | None = None

    def to_record(self) -> dict[str, object]:
        return {"state": self.state, "kind": self.kind.value,
                "value_serializer": self.value_serializer,
                "map_key_serializer": self.map_key_serializer}

    @classmethod
    def from_record(cls, r: dict[str, object]) -> StateMeta:
        map_key = r["map_key_serializer"]
        return cls(str(r["state"]), StateKind(str(r["kind"])), str(r["value_serializer"]),
                   str(map_key) if map_key is not None else None)

    def to_bytes(self) -> bytes:
        return encode("state_meta", self.to_record())

    @classmethod
    def from_bytes(cls, data: bytes) -> StateMeta:
        return cls.from_record(decode("state_meta", data))
