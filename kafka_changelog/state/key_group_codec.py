"""The snapshot of one key group (``schemas/key_group_state.avsc``), hand-written.

Materialization serializes every changed key group and a restore decodes every chunk,
so both are on the paths whose cost grows with the state. This codec writes the same
bytes as fastavro with the schema file (tested) and reads any valid encoding, without
building a dict per entry: :func:`iter_key_group` yields each entry's fields as they
are read, so a RocksDB table writes them straight into a write batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..avro_binary import (
    SMALL_LIMIT,
    SMALL_VARINTS,
    AvroDecodeError,
    encode_string,
    read_bytes,
    read_long,
    read_string,
    zigzag_varint,
)
from .descriptors import StateKind
from .ops import StateMeta
from .table_protocol import Entry

#: The schema's ``StateKind`` symbols in order (tested against the schema file).
KINDS = (StateKind.VALUE, StateKind.LIST, StateKind.MAP, StateKind.REDUCING,
         StateKind.AGGREGATING)
_KIND_INDEX = {kind: index for index, kind in enumerate(KINDS)}

#: One decoded entry: (meta, key, value, values, map items). A state's first item has
#: key None (its registration, even when it has no entries); an entry has exactly one of
#: value, values and map items, or none (an entry without data, which loaders skip).
DecodedEntry = tuple[StateMeta, bytes | None, bytes | None, list[bytes] | None,
                     list[tuple[bytes, bytes]] | None]


def _long(value: int) -> bytes:
    return SMALL_VARINTS[value + 1] if -1 <= value < SMALL_LIMIT else zigzag_varint(value)


def _meta(meta: StateMeta) -> bytes:
    serializer = meta.map_key_serializer
    return b"".join((encode_string(meta.state), _long(_KIND_INDEX[meta.kind]),
                     encode_string(meta.value_serializer),
                     b"\x00" if serializer is None else b"\x02" + encode_string(serializer)))


def encode_key_group(states: Iterable[tuple[StateMeta, Iterable[tuple[bytes, Entry]]]]
                     ) -> bytes:
    """The key group's snapshot: ``states`` in the order given (by name), each with its
    entries in the order given (by key; a map's items by map key). States without
    entries are left out, as fastavro would write them from the table's records."""
    parts: list[bytes] = []
    tables = 0
    for meta, entries in states:
        body: list[bytes] = []
        count = 0
        for key, entry in entries:
            count += 1
            body += (_long(len(key)), key)
            if isinstance(entry, bytes):
                body += (b"\x02", _long(len(entry)), entry, b"\x00\x00")
            elif isinstance(entry, list):
                body.append(b"\x00\x02")
                if entry:
                    body.append(_long(len(entry)))
                    for item in entry:
                        body += (_long(len(item)), item)
                body.append(b"\x00\x00")  # the array's end, then no map
            else:
                body.append(b"\x00\x00\x02")
                if entry:
                    body.append(_long(len(entry)))
                    for map_key, value in entry.items():
                        body += (_long(len(map_key)), map_key, _long(len(value)), value)
                body.append(b"\x00")
        if count:
            tables += 1
            parts += (_meta(meta), _long(count), *body, b"\x00")
    if not tables:
        return b"\x00"
    return b"".join((_long(tables), *parts, b"\x00"))


def iter_key_group(data: bytes) -> Iterator[DecodedEntry]:
    """The snapshot's registrations and entries in order (see :data:`DecodedEntry`).

    Raises :class:`~kafka_changelog.avro_binary.AvroDecodeError` (a ``ValueError``) for
    truncated or trailing bytes, unknown kinds or union branches."""
    try:
        yield from _decode(data)
    except IndexError:
        raise AvroDecodeError(
            f"truncated key group snapshot ({len(data)} bytes)") from None


def _block(p: bytes, pos: int, what: str) -> tuple[int, int]:
    """An array block's item count (0: the array ends), skipping a block byte size."""
    count, pos = read_long(p, pos, what)
    if count < 0:
        count = -count
        _, pos = read_long(p, pos, what)
    return count, pos


def _union(p: bytes, pos: int, what: str) -> tuple[bool, int]:
    """A ``["null", X]`` union's branch: whether X follows."""
    branch = p[pos]
    if branch == 2:
        return True, pos + 1
    if branch == 0:
        return False, pos + 1
    raise AvroDecodeError(f"malformed {what}: union index byte {branch:#x} at byte {pos}")


def _bytes(p: bytes, pos: int, what: str) -> tuple[bytes, int]:
    # Lengths below 64 are one byte ``b`` with ``b & 0x81 == 0`` (the varint of b >> 1):
    # read inline, as the StateOp codec does; anything else through ``read_bytes``.
    b = p[pos]
    if b & 0x81:
        return read_bytes(p, pos, what)
    start = pos + 1
    end = start + (b >> 1)
    return p[start:end], end


def _decode(p: bytes) -> Iterator[DecodedEntry]:
    tables, pos = _block(p, 0, "KeyGroupState.states")
    while tables:
        for _ in range(tables):
            state, pos = read_string(p, pos, "StateMeta.state")
            kind, pos = read_long(p, pos, "StateMeta.kind")
            if not 0 <= kind < len(KINDS):
                raise AvroDecodeError(f"malformed StateMeta.kind: enum index {kind}")
            value_serializer, pos = read_string(p, pos, "StateMeta.value_serializer")
            present, pos = _union(p, pos, "StateMeta.map_key_serializer")
            map_key_serializer = None
            if present:
                map_key_serializer, pos = read_string(p, pos, "StateMeta.map_key_serializer")
            meta = StateMeta(state, KINDS[kind], value_serializer, map_key_serializer)
            yield meta, None, None, None, None
            entries, pos = _block(p, pos, "StateTable.entries")
            while entries:
                for _ in range(entries):
                    key, pos = _bytes(p, pos, "StateEntry.key")
                    value: bytes | None = None
                    values: list[bytes] | None = None
                    items: list[tuple[bytes, bytes]] | None = None
                    present, pos = _union(p, pos, "StateEntry.value")
                    if present:
                        value, pos = _bytes(p, pos, "StateEntry.value")
                    present, pos = _union(p, pos, "StateEntry.values")
                    if present:
                        values = []
                        count, pos = _block(p, pos, "StateEntry.values")
                        while count:
                            for _ in range(count):
                                item, pos = _bytes(p, pos, "StateEntry.values")
                                values.append(item)
                            count, pos = _block(p, pos, "StateEntry.values")
                    present, pos = _union(p, pos, "StateEntry.map")
                    if present:
                        items = []
                        count, pos = _block(p, pos, "StateEntry.map")
                        while count:
                            for _ in range(count):
                                map_key, pos = _bytes(p, pos, "MapEntry.key")
                                item, pos = _bytes(p, pos, "MapEntry.value")
                                items.append((map_key, item))
                            count, pos = _block(p, pos, "StateEntry.map")
                    yield meta, key, value, values, items
                entries, pos = _block(p, pos, "StateTable.entries")
        tables, pos = _block(p, pos, "KeyGroupState.states")
    if pos > len(p):
        raise AvroDecodeError(
            f"truncated key group snapshot: {pos - len(p)} bytes missing at its end")
    if pos < len(p):
        raise AvroDecodeError(
            f"{len(p) - pos} trailing bytes after the key group snapshot (it ends at byte "
            f"{pos} of {len(p)})")


__all__ = ["KINDS", "DecodedEntry", "encode_key_group", "iter_key_group"]
