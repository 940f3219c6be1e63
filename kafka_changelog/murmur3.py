"""Spark SQL's ``hash()`` of a binary or string value, in pure Python.

Spark hashes bytes with a Murmur3 x86 32-bit variant (seed 42) that mixes each
trailing byte as a whole sign-extended int instead of the standard tail
handling; reproducing that variant exactly is what lets Spark SQL compute the
same key group as Python.
"""

from __future__ import annotations

import struct

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF

#: Spark reads the 4-byte words little-endian (the platform order of its JVMs).
_WORDS = struct.Struct("<I")

#: The seed Spark SQL's ``hash()`` uses.
SPARK_HASH_SEED = 42


def _rotl(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _MASK
    k1 = _rotl(k1, 15)
    return (k1 * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1


def spark_hash_bytes(data: bytes, seed: int = SPARK_HASH_SEED) -> int:
    """Signed 32-bit hash equal to Spark SQL ``hash(data)`` for a binary/string value."""
    h1 = seed & _MASK
    aligned = len(data) - len(data) % 4
    for (word,) in _WORDS.iter_unpack(data[:aligned]) if aligned else ():
        h1 = _mix_h1(h1, _mix_k1(word))
    for byte in data[aligned:]:
        # Spark reads the tail as signed bytes, sign-extended to 32 bits.
        signed = byte - 256 if byte >= 128 else byte
        h1 = _mix_h1(h1, _mix_k1(signed & _MASK))
    result = _fmix(h1, len(data))
    return result - (1 << 32) if result >= (1 << 31) else result



def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Signed 32-bit hash equal to Spark SQL ``hash(value)`` for an ``int`` column value."""
    h1 = _mix_h1(seed & _MASK, _mix_k1(value & _MASK))
    result = _fmix(h1, 4)
    return result - (1 << 32) if result >= (1 << 31) else result
