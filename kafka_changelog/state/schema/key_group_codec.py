"""The snapshot of one key group (``schemas/key_group_state.avsc``), hand-written.

Materialization serializes every changed key group and a restore decodes every chunk,
so both are on the paths whose cost grows with the state. This codec writes the same
bytes as fastavro with the schema file (tested) and reads any valid encoding, without
building a dict per entry: :func:`iter_key_group` yields each entry's fields as they
are read, and :func:`load_key_group` (what the tables' ``load_group`` use) hands them
straight to a table's writes, in one loop per state with the usual entry shape of its
kind read inline (no generator, no call per field).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...avro_binary import (
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
from .kinds import Entry
from .ops import StateMeta

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
    return assemble_key_group((meta, *encode_entries(entries)) for meta, entries in states)


def encode_entries(entries: Iterable[tuple[bytes, Entry | None]]) -> tuple[list[bytes], int]:
    """The encoded entries of one state (parts to join) and how many there are; an entry
    None is a key without data (a deleted key, in a delta layer)."""
    body: list[bytes] = []
    done: list[bytes] = []  # joined every JOIN_ENTRIES entries: few objects alive
    count = 0
    for key, entry in entries:
        count += 1
        if not count % JOIN_ENTRIES:
            done.append(b"".join(body))
            body = []
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
        elif entry is None:
            body.append(b"\x00\x00\x00")  # no value, no values, no map
        else:
            body.append(b"\x00\x00\x02")
            if entry:
                body.append(_long(len(entry)))
                for map_key, value in entry.items():
                    body += (_long(len(map_key)), map_key, _long(len(value)), value)
            body.append(b"\x00")
    return [*done, *body], count


#: Entries whose encoded parts are joined into one bytes object as the encoding goes, so
#: that a large key group keeps few objects (and not every key and value) alive.
JOIN_ENTRIES = 4096


def encode_value_entries(items: Iterable[tuple[bytes, bytes]], cut: int
                         ) -> tuple[list[bytes], int]:
    """Like :func:`encode_entries` for entries that are values, given as stored (key,
    value) pairs whose state key is ``stored_key[cut:]`` (one loop, nothing per entry but
    the parts)."""
    body: list[bytes] = []
    done: list[bytes] = []
    small, limit = SMALL_VARINTS, SMALL_LIMIT
    count = 0
    for stored, value in items:
        if count and not count % JOIN_ENTRIES:
            done.append(b"".join(body))
            body = []
        size = len(stored) - cut
        length = len(value)
        body += (small[size + 1] if size < limit else zigzag_varint(size), stored[cut:],
                 b"\x02", small[length + 1] if length < limit else zigzag_varint(length),
                 value, b"\x00\x00")
        count += 1
    return [*done, *body], count


def assemble_key_group(tables: Iterable[tuple[StateMeta, list[bytes], int]]) -> bytes:
    """The key group's snapshot from each state's encoded entries (see
    :func:`encode_entries`), in the order given; states without entries are left out."""
    parts: list[bytes] = []
    written = 0
    for meta, body, count in tables:
        if count:
            written += 1
            parts += (_meta(meta), _long(count), *body, b"\x00")
    if not written:
        return b"\x00"
    return b"".join((_long(written), *parts, b"\x00"))


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
            meta, pos = _read_meta(p, pos)
            yield meta, None, None, None, None
            entries, pos = _block(p, pos, "StateTable.entries")
            while entries:
                for _ in range(entries):
                    key, pos = _bytes(p, pos, "StateEntry.key")
                    value, values, items, pos = _rest(p, pos)
                    yield meta, key, value, values, items
                entries, pos = _block(p, pos, "StateTable.entries")
        tables, pos = _block(p, pos, "KeyGroupState.states")
    _check_end(p, pos)


#: The entry shapes :class:`StateLoad` fast-paths.
SHAPE_VALUE, SHAPE_LIST, SHAPE_MAP = 0, 1, 2

#: ``other(key, value, values, items)``: an entry of another shape than its state's
#: (or without data); returns how many entries it stored (a map's entries each), or
#: raises.
OtherEntry = Callable[[bytes, "bytes | None", "list[bytes] | None",
                       "list[tuple[bytes, bytes]] | None"], int]


class StateLoad:
    """How a table takes one state's entries from :func:`load_key_group`.

    ``shape`` is the entry shape of the state's kind (:data:`SHAPE_VALUE` for value,
    reducing and aggregating states). An entry of that shape is stored with one call:

    - value: ``put(prefix + key, value)``;
    - list: ``put(prefix + key, list_value(items))``;
    - map: with ``map_start``, ``put(map_start(key) + map_key, value)`` per item (an
      empty map stores nothing); without, ``put(prefix + key, dict(items))``.

    Anything else goes to ``other``. ``put`` is best a builtin (a write batch's ``put``,
    a dict's ``__setitem__``): it runs once per entry.
    """

    __slots__ = ("list_value", "map_start", "other", "prefix", "put", "shape")

    def __init__(self, shape: int, prefix: bytes, put: Callable[[bytes, Any], Any],
                 other: OtherEntry,
                 list_value: Callable[[list[bytes]], Any] | None = None,
                 map_start: Callable[[bytes], bytes] | None = None) -> None:
        self.shape = shape
        self.prefix = prefix
        self.put = put
        self.other = other
        self.list_value = list_value
        self.map_start = map_start


def shape_of(kind: StateKind) -> int:
    """The entry shape of a state kind."""
    return (SHAPE_MAP if kind is StateKind.MAP else SHAPE_LIST if kind is StateKind.LIST
            else SHAPE_VALUE)


#: Entries between two calls of ``load_key_group``'s ``tick``.
TICK_ENTRIES = 8192


def load_key_group(data: bytes, state: Callable[[StateMeta], StateLoad],
                   tick: Callable[[], None] | None = None) -> int:
    """Decode a key group's snapshot into a table: ``state(meta)`` is called at each
    state's registration (before its entries) and says how its entries are stored (see
    :class:`StateLoad`); ``tick()``, when given, about every :data:`TICK_ENTRIES`
    entries (e.g. to write a batch). Returns the entries stored, as the tables count
    them (a map's entries each).

    Raises :class:`~kafka_changelog.avro_binary.AvroDecodeError` (a ``ValueError``) as
    :func:`iter_key_group` does; entries before the error may have been stored."""
    try:
        return _load(data, state, tick)
    except IndexError:
        raise AvroDecodeError(
            f"truncated key group snapshot ({len(data)} bytes)") from None


def _load(p: bytes, state: Callable[[StateMeta], StateLoad],
          tick: Callable[[], None] | None) -> int:
    stored = 0
    since_tick = 0
    tables, pos = _block(p, 0, "KeyGroupState.states")
    while tables:
        for _ in range(tables):
            meta, pos = _read_meta(p, pos)
            load = state(meta)
            entries, pos = _block(p, pos, "StateTable.entries")
            load_entries = _load_values if load.shape == SHAPE_VALUE else _load_other_shapes
            while entries:
                while entries:  # a block in pieces, so that ``tick`` runs within it
                    piece = min(entries, TICK_ENTRIES - since_tick)
                    pos, count = load_entries(p, pos, piece, load)
                    stored += count
                    entries -= piece
                    since_tick += piece
                    if since_tick >= TICK_ENTRIES:
                        if tick is not None:
                            tick()
                        since_tick = 0
                entries, pos = _block(p, pos, "StateTable.entries")
        tables, pos = _block(p, pos, "KeyGroupState.states")
    _check_end(p, pos)
    return stored


def _read_meta(p: bytes, pos: int) -> tuple[StateMeta, int]:
    state, pos = read_string(p, pos, "StateMeta.state")
    kind, pos = read_long(p, pos, "StateMeta.kind")
    if not 0 <= kind < len(KINDS):
        raise AvroDecodeError(f"malformed StateMeta.kind: enum index {kind}")
    value_serializer, pos = read_string(p, pos, "StateMeta.value_serializer")
    present, pos = _union(p, pos, "StateMeta.map_key_serializer")
    map_key_serializer = None
    if present:
        map_key_serializer, pos = read_string(p, pos, "StateMeta.map_key_serializer")
    return StateMeta(state, KINDS[kind], value_serializer, map_key_serializer), pos


def _load_values(p: bytes, pos: int, count: int, load: StateLoad) -> tuple[int, int]:
    """``count`` entries of a value-shaped state: ``key, 02 value, 00, 00`` read inline
    (lengths below 8192: one or two varint bytes), anything else through ``_rest``."""
    put, prefix = load.put, load.prefix
    stored = 0
    for _ in range(count):
        b = p[pos]
        if b & 0x81:
            key, pos = read_bytes(p, pos, "StateEntry.key")
        else:
            start = pos + 1
            pos = start + (b >> 1)
            key = p[start:pos]
        if p[pos] == 2:
            b = p[pos + 1]
            if not b & 0x81:
                start = pos + 2
                end = start + (b >> 1)
            elif b & 0x80 and not b & 1 and p[pos + 2] < 0x80:
                start = pos + 3
                end = start + (((b & 0x7F) | (p[pos + 2] << 7)) >> 1)
            else:
                start = -1
                value, end = read_bytes(p, pos + 1, "StateEntry.value")
            if p[end] == 0 and p[end + 1] == 0:  # no values, no map: the usual shape
                put(prefix + key, p[start:end] if start >= 0 else value)
                pos = end + 2
                stored += 1
                continue
        found, values, items, pos = _rest(p, pos)
        stored += load.other(key, found, values, items)
    return pos, stored


def _load_other_shapes(p: bytes, pos: int, count: int, load: StateLoad) -> tuple[int, int]:
    """``count`` entries of a list- or map-shaped state: the usual entry of the shape
    (one block of items, every length below 64: one varint byte) read inline, anything
    else through ``_rest``."""
    put, prefix, shape = load.put, load.prefix, load.shape
    list_value, map_start = load.list_value, load.map_start
    stored = 0
    for _ in range(count):
        b = p[pos]
        if b & 0x81:
            key, pos = read_bytes(p, pos, "StateEntry.key")
        else:
            start = pos + 1
            pos = start + (b >> 1)
            key = p[start:pos]
        if shape == SHAPE_LIST:
            found = _inline_list(p, pos)
            if found is not None:
                values, pos = found
                assert list_value is not None
                put(prefix + key, list_value(values))
                stored += 1
                continue
        else:
            found_map = _inline_map(p, pos)
            if found_map is not None:
                items, pos = found_map
                if map_start is None:
                    put(prefix + key, dict(items))
                else:
                    entry = map_start(key)
                    for map_key, item in items:
                        put(entry + map_key, item)
                stored += len(items)
                continue
        value, values_read, items_read, pos = _rest(p, pos)
        if (value is None and shape == SHAPE_LIST and values_read is not None
                and items_read is None):
            assert list_value is not None
            put(prefix + key, list_value(values_read))
            stored += 1
        elif (value is None and shape == SHAPE_MAP and items_read is not None
              and values_read is None):
            if map_start is None:
                put(prefix + key, dict(items_read))
            elif items_read:
                entry = map_start(key)
                for map_key, item in items_read:
                    put(entry + map_key, item)
            stored += len(items_read)
        else:
            stored += load.other(key, value, values_read, items_read)
    return pos, stored


def _inline_list(p: bytes, pos: int) -> tuple[list[bytes], int] | None:
    """A list entry's items from after its key when it is ``00 02 n items 00 00`` (no
    value, one block of 1 to 63 items of fewer than 64 bytes, no map); else None (the
    caller reads it the general way from ``pos``: nothing was consumed)."""
    if p[pos] != 0 or p[pos + 1] != 2:
        return None
    b = p[pos + 2]
    if not b or b & 0x81:
        return None
    q = pos + 3
    values = []
    for _ in range(b >> 1):
        c = p[q]
        if c & 0x81:
            return None
        start = q + 1
        q = start + (c >> 1)
        values.append(p[start:q])
    if p[q] != 0 or p[q + 1] != 0:
        return None
    return values, q + 2


def _inline_map(p: bytes, pos: int) -> tuple[list[tuple[bytes, bytes]], int] | None:
    """A map entry's items from after its key when it is ``00 00 02 n items 00`` (no
    value, no values, one block of 1 to 63 items, keys and values of fewer than 64 bytes);
    else None (nothing consumed)."""
    if p[pos] != 0 or p[pos + 1] != 0 or p[pos + 2] != 2:
        return None
    b = p[pos + 3]
    if not b or b & 0x81:
        return None
    q = pos + 4
    items = []
    for _ in range(b >> 1):
        c = p[q]
        if c & 0x81:
            return None
        start = q + 1
        q = start + (c >> 1)
        map_key = p[start:q]
        c = p[q]
        if c & 0x81:
            return None
        start = q + 1
        q = start + (c >> 1)
        items.append((map_key, p[start:q]))
    if p[q] != 0:
        return None
    return items, q + 1


def _rest(p: bytes, pos: int) -> tuple[bytes | None, list[bytes] | None,
                                       list[tuple[bytes, bytes]] | None, int]:
    """An entry's value, values and map (each None when absent), from after its key."""
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
    return value, values, items, pos


def _check_end(p: bytes, pos: int) -> None:
    if pos > len(p):
        raise AvroDecodeError(
            f"truncated key group snapshot: {pos - len(p)} bytes missing at its end")
    if pos < len(p):
        raise AvroDecodeError(
            f"{len(p) - pos} trailing bytes after the key group snapshot (it ends at byte "
            f"{pos} of {len(p)})")


__all__ = ["KINDS", "SHAPE_LIST", "SHAPE_MAP", "SHAPE_VALUE", "TICK_ENTRIES", "DecodedEntry",
           "StateLoad", "assemble_key_group", "encode_entries", "encode_key_group",
           "encode_value_entries", "iter_key_group", "load_key_group", "shape_of"]
