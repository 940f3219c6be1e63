"""Avro binary encoding primitives, for the hand-written codecs of the hot paths.

Only what the Avro specification ("Binary Encoding") says about ``long`` (zig-zag,
then a base-128 little-endian varint), ``bytes`` and ``string`` (a ``long`` length,
then the bytes; UTF-8 for a string). Records, enums, unions and arrays are built
from these by the codecs themselves (``record_format``, ``state.ops``), which are
tested byte for byte against fastavro with the schema files.

Decoding reads from ``bytes``, ``bytearray`` or ``memoryview`` at a position and
returns ``(value, next position)``; anything truncated or malformed raises
:class:`AvroDecodeError` naming what was being read and where.
"""

from __future__ import annotations

from typing import TypeAlias

from .errors import ChangelogError

#: What the decoders read from.
BytesLike: TypeAlias = bytes | bytearray | memoryview


def zigzag_varint(value: int) -> bytes:
    """Avro's encoding of an int/long: zig-zag, then base-128 little-endian varint."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: Varints of -1..16383 (``SMALL_VARINTS[v + 1]``): lengths, counts and indexes almost
#: always are, and a list index is much cheaper than encoding.
SMALL_VARINTS = [zigzag_varint(i) for i in range(-1, 16384)]

#: ``SMALL_VARINTS[v + 1]`` holds the varint of ``v`` for ``-1 <= v < SMALL_LIMIT``.
SMALL_LIMIT = len(SMALL_VARINTS) - 1


def varint(value: int) -> bytes:
    """The Avro ``long`` encoding of ``value`` (cached for small values)."""
    return SMALL_VARINTS[value + 1] if -1 <= value < 16383 else zigzag_varint(value)


def encode_bytes(data: bytes) -> bytes:
    """The Avro ``bytes`` encoding: length, then the bytes."""
    size = len(data)
    return (SMALL_VARINTS[size + 1] if size < SMALL_LIMIT else zigzag_varint(size)) + data


def encode_string(text: str) -> bytes:
    """The Avro ``string`` encoding: UTF-8 length, then the UTF-8 bytes."""
    return encode_bytes(text.encode())


class AvroDecodeError(ChangelogError, ValueError):
    """Avro binary data is truncated or malformed (the message says what and where)."""


#: A 64-bit long takes at most 10 varint bytes, so its last byte is read at shift 63.
_MAX_SHIFT = 63


def read_long(data: BytesLike, pos: int, what: str = "long") -> tuple[int, int]:
    """The Avro ``long`` at ``pos`` (>= 0) and the position after it.

    ``what`` names the value in errors: truncated input, a varint longer than 10 bytes
    or one beyond 64 bits raise :class:`AvroDecodeError`.
    """
    return _read_long(data, pos, what, "")


def _read_long(data: BytesLike, pos: int, what: str, part: str) -> tuple[int, int]:
    # ``part`` ("length of ") goes into messages only: nothing is formatted unless raising.
    start = pos
    try:
        byte = data[pos]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), pos + 1
        n = byte & 0x7F
        shift = 7
        while True:
            pos += 1
            byte = data[pos]
            n |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > _MAX_SHIFT:
                raise AvroDecodeError(
                    f"malformed {part}{what}: the varint at byte {start} is longer than "
                    f"10 bytes")
    except IndexError:
        raise AvroDecodeError(
            f"truncated {part}{what}: the varint at byte {start} runs past the end of the "
            f"{len(data)}-byte input") from None
    if n >> 64:
        raise AvroDecodeError(
            f"malformed {part}{what}: the varint at byte {start} exceeds 64 bits")
    return (n >> 1) ^ -(n & 1), pos + 1


def read_bytes(data: BytesLike, pos: int, what: str = "bytes") -> tuple[bytes, int]:
    """The Avro ``bytes`` at ``pos`` (always a ``bytes`` copy) and the position after it."""
    size, start = _read_long(data, pos, what, "length of ")
    if size < 0:
        raise AvroDecodeError(f"malformed {what}: negative length {size} at byte {pos}")
    end = start + size
    if end > len(data):
        raise AvroDecodeError(
            f"truncated {what}: {size} bytes from byte {start}, but only "
            f"{len(data) - start} left")
    chunk = data[start:end]
    return (chunk if type(chunk) is bytes else bytes(chunk)), end


def read_string(data: BytesLike, pos: int, what: str = "string") -> tuple[str, int]:
    """The Avro ``string`` at ``pos`` and the position after it (strict UTF-8)."""
    raw, end = read_bytes(data, pos, what)
    try:
        return raw.decode(), end
    except UnicodeDecodeError as exc:
        raise AvroDecodeError(f"malformed {what} at byte {pos}: not UTF-8 ({exc})") from None


__all__ = [
    "SMALL_LIMIT",
    "SMALL_VARINTS",
    "AvroDecodeError",
    "BytesLike",
    "encode_bytes",
    "encode_string",
    "read_bytes",
    "read_long",
    "read_string",
    "varint",
    "zigzag_varint",
]
