"""How the RocksDB state table lays its entries out: keys, list values, reserved keys.

Every key starts with its key group, so a key group is one contiguous range that
materialization, rescaling and readers iterate per key group:

- value, reducing and aggregating states: ``kg(2) sid(2) key`` -> the value;
- list states: ``kg(2) sid(2) key`` -> the items, each as a 4-byte big-endian length
  and its bytes (:func:`encode_items`; ``LIST_ADD`` appends bytes to the stored value,
  never decoding it);
- map states: ``kg(2) sid(2) esc(key) 00 01 map_key`` -> the value, one RocksDB entry
  per map entry (:func:`map_start`); ``esc`` doubles as ``00 ff`` every ``00`` of the key,
  which keeps keys in byte order and makes ``00 01`` end the key;
- reserved keys start with ``ff ff`` (key groups are below 2^15, so ``ff ff`` is never
  one): registrations ``ff ff 00 name`` -> ``sid(2)`` and the ``StateMeta`` bytes, the
  entry count ``ff ff 01``, and the change tracking's keys ``ff ff 02..04`` (see
  :mod:`kafka_changelog.state.rocksdb.changes`).

``kg`` is the key group and ``sid`` the state's number (in registration order), both
big-endian. Iterating a state's prefix gives its entries ordered by key and map key,
which is the order of the key group snapshot format.

This layout is what a store on disk holds: changing it makes existing local stores
unreadable (streaming reattaches them across runs).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

RESERVED = b"\xff\xff"
#: ``META + name`` -> ``sid(2)`` and the ``StateMeta`` bytes.
META = RESERVED + b"\x00"
#: The entry count as of the last flush or close (:data:`INT64`).
COUNT = RESERVED + b"\x01"
#: ``CHANGED + epoch(8) + kg(2) sid(2) key`` -> nothing: a key touched in that epoch.
CHANGED = RESERVED + b"\x02"
#: The current change epoch (:data:`INT64`).
EPOCH = RESERVED + b"\x03"
#: Present while every mutation since the store was empty was tracked.
TRACKED = RESERVED + b"\x04"
#: Ends the escaped key of a map entry; the map key follows.
KEY_END = b"\x00\x01"
NUL, ESCAPED_NUL = b"\x00", b"\x00\xff"
#: The entry count and change epochs: signed 64-bit big-endian.
INT64 = struct.Struct(">q")
_LENGTH = struct.Struct(">I")
#: The 4-byte lengths of short items, made once (a list is encoded item by item).
_SMALL_LENGTHS = [_LENGTH.pack(size) for size in range(256)]


def key_group_prefix(key_group: int) -> bytes:
    """Where the entries of ``key_group`` start (``kg(2)``)."""
    return key_group.to_bytes(2, "big")


def state_prefix(key_group: int, sid: bytes) -> bytes:
    """Where a state's entries in ``key_group`` start (``kg(2) sid(2)``)."""
    return key_group.to_bytes(2, "big") + sid


def map_start(prefix: bytes, key: bytes) -> bytes:
    """Where the entries of ``key``'s map start under a state's ``prefix``: the key
    escaped (``00`` as ``00 ff``), then ``00 01``; the map key follows."""
    return prefix + key.replace(NUL, ESCAPED_NUL) + KEY_END


def split_map_key(stored: bytes, cut: int) -> tuple[bytes, bytes]:
    """The escaped key and the map key of a stored map entry whose state prefix is
    ``cut`` bytes long."""
    end = stored.find(KEY_END, cut)
    return stored[cut:end], stored[end + 2:]


def unescape(escaped: bytes) -> bytes:
    """The key of an escaped one (the inverse of the escaping in :func:`map_start`)."""
    return escaped.replace(ESCAPED_NUL, NUL)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key after every key starting with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def encode_items(values: Sequence[bytes]) -> bytes:
    """A list state's stored value: each item as its 4-byte length and its bytes, so
    appending items is appending bytes."""
    parts: list[bytes] = []
    small = _SMALL_LENGTHS
    for value in values:
        size = len(value)
        parts += (small[size] if size < 256 else _LENGTH.pack(size), value)
    return b"".join(parts)


def decode_items(data: bytes) -> list[bytes]:
    """The items of a list state's stored value (the inverse of :func:`encode_items`)."""
    items = []
    unpack = _LENGTH.unpack_from
    position, end = 0, len(data)
    while position < end:
        (size,) = unpack(data, position)
        position += 4
        items.append(data[position:position + size])
        position += size
    return items


__all__ = ["CHANGED", "COUNT", "EPOCH", "ESCAPED_NUL", "INT64", "KEY_END", "META", "NUL",
           "RESERVED", "TRACKED", "decode_items", "encode_items", "key_group_prefix",
           "map_start", "prefix_end", "split_map_key", "state_prefix", "unescape"]
