"""Spark SQL's ``hash()`` of a binary or string value, in pure Python.

Spark hashes bytes with a Murmur3 x86 32-bit variant (seed 42) that mixes each
trailing byte as a whole sign-extended int instead of the standard tail
handling; reproducing that variant exactly is what lets Spark SQL compute the
same key group as Python.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

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



_Words = npt.NDArray[np.uint32]
_FOUR = np.arange(4)


def spark_hash_many(offsets: np.ndarray, data: np.ndarray, seed: int = SPARK_HASH_SEED
                    ) -> np.ndarray:
    """:func:`spark_hash_bytes` of many values at once: value ``i`` is
    ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: ``n + 1`` ascending integers, ``data``:
    ``uint8``, as an Arrow binary array lays them out). Signed 32-bit hashes (``int32``).

    NumPy does the same steps for every value together, a 4-byte word (then a tail byte)
    at a time, values shorter than the step left as they are; ``uint32`` arithmetic wraps
    as the scalar version's masks do."""
    starts = np.asarray(offsets[:-1], np.int64)
    lengths = np.asarray(offsets[1:], np.int64) - starts
    data = np.asarray(data, np.uint8)
    h1 = np.full(lengths.size, seed & _MASK, np.uint32)
    words = lengths // 4
    for j in range(int(words.max(initial=0))):
        rows = np.flatnonzero(words > j)
        at = starts[rows] + 4 * j
        # Each value's j-th word, little-endian as Spark reads it.
        word: _Words = np.ascontiguousarray(data[at[:, None] + _FOUR]).view(
            np.dtype("<u4")).ravel().astype(np.uint32, copy=False)
        h1[rows] = _mix_h1_many(h1[rows], _mix_k1_many(word))
    tails = lengths - 4 * words
    for j in range(3):
        rows = np.flatnonzero(tails > j)
        if not rows.size:
            break
        # Sign-extended, as Spark reads the tail.
        byte = data[starts[rows] + 4 * words[rows] + j].view(np.int8).astype(np.int32)
        h1[rows] = _mix_h1_many(h1[rows], _mix_k1_many(byte.view(np.uint32)))
    h1 ^= lengths.astype(np.uint32)
    h1 ^= h1 >> 16
    h1 *= np.uint32(0x85EBCA6B)
    h1 ^= h1 >> 13
    h1 *= np.uint32(0xC2B2AE35)
    h1 ^= h1 >> 16
    return h1.view(np.int32)


def _rotl_many(value: _Words, shift: int) -> _Words:
    rotated: _Words = (value << np.uint32(shift)) | (value >> np.uint32(32 - shift))
    return rotated


def _mix_k1_many(k1: _Words) -> _Words:
    mixed: _Words = _rotl_many(k1 * np.uint32(_C1), 15) * np.uint32(_C2)
    return mixed


def _mix_h1_many(h1: _Words, k1: _Words) -> _Words:
    mixed: _Words = _rotl_many(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)
    return mixed


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Signed 32-bit hash equal to Spark SQL ``hash(value)`` for an ``int`` column value."""
    h1 = _mix_h1(seed & _MASK, _mix_k1(value & _MASK))
    result = _fmix(h1, 4)
    return result - (1 << 32) if result >= (1 << 31) else result
