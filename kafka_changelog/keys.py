"""The byte encoding of state keys (version 1), the same in Spark SQL and in Python.

State is keyed by bytes. A streaming query keyed on typed columns stores each key
as the bytes below, computed by Spark SQL on the driver's plan
(``spark_integration.keys``) and reproduced here for in-process use (restoring or
looking up one key's state, tests). The key group of a key is always
``pmod(hash(key bytes), max_parallelism)`` (:func:`~kafka_changelog.key_group_for_key`),
whatever the key's type, so the Spark reader, the CLI and Python agree on it.

One key column of type:

============================  ===================================================
``string``                    its UTF-8 bytes
``binary``                    the bytes themselves
``boolean``                   one byte, ``0x00`` or ``0x01``
``tinyint`` ... ``bigint``    8 bytes, big-endian two's complement of the value
``date``                      8 bytes, big-endian: days since 1970-01-01
``timestamp``                 8 bytes, big-endian: microseconds since 1970-01-01 UTC
``timestamp_ntz``             8 bytes, big-endian: microseconds since 1970-01-01
                              of the wall-clock time (no time zone)
``decimal(p,s)``              UTF-8 of the plain decimal text with exactly ``s``
                              digits after the point (``"12.50"``, ``"-3"``)
``float``, ``double``         8 bytes, big-endian: the IEEE 754 bits of the value as
                              a double, ``-0.0`` written as ``0.0`` and every NaN as
                              ``7ff8000000000000`` (Java's ``doubleToLongBits``)
============================  ===================================================

Floating-point keys group as Spark's ``groupBy`` does: ``-0.0`` and ``0.0`` are one key,
every NaN is one key. A ``float`` column's values are widened to double exactly, so a
float key and the double of the same value are the same key.

Several key columns (like ``groupBy(a, b)``): for each column in order, its
encoding as above prefixed by its length as 4 bytes big-endian.

A null in a key column has no encoding: it is refused with :class:`NullKeyError`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from .errors import ChangelogError

#: Version of the encoding above (recorded nowhere yet: there is only one).
KEY_ENCODING_VERSION = 1

#: Checkpoint property naming the Spark types of the key columns (a JSON list, e.g.
#: ``["string", "bigint"]``), recorded by the streaming layer with every checkpoint.
KEY_TYPES_PROPERTY = "spark.key_types"

_INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint", "byte", "short", "integer",
                       "long"})
_FLOATING = frozenset({"float", "double", "real"})
_EIGHT = struct.Struct(">q")
_DOUBLE = struct.Struct(">d")
_SINGLE = struct.Struct(">f")
#: The bits every NaN key is written as (Java's ``Double.doubleToLongBits`` of any NaN).
_NAN_BITS = bytes.fromhex("7ff8000000000000")
_LENGTH = struct.Struct(">I")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


class KeyTypeError(ChangelogError, TypeError):
    """A key column of a type that cannot be a state key, or a value of the wrong type."""


class NullKeyError(ChangelogError, ValueError):
    """A row whose key column is null: it has no state key (never dropped silently)."""


def check_key_type(type_name: str, column: str = "key") -> str:
    """The normalised Spark type name of a key column, or :class:`KeyTypeError`."""
    name = type_name.strip().lower()
    if name in ("string", "binary", "boolean", "date", "timestamp", "timestamp_ntz") or (
        name in _INTEGRAL or _DECIMAL.match(name)
    ):
        return name
    if name.startswith("varchar") or name.startswith("char"):
        return "string"
    if name in _FLOATING:
        return "float" if name == "real" else name
    raise KeyTypeError(
        f"key column {column!r} has type {type_name}, which cannot be a state key; "
        "key columns may be string, binary, boolean, tinyint, smallint, int, bigint, "
        "float, double, decimal, date, timestamp or timestamp_ntz"
    )


def key_encoding(type_name: str) -> str:
    """Which bytes a key column of this Spark type gives its values: columns whose types
    share an encoding give equal values equal keys (a string its UTF-8 bytes, as a binary
    column of those bytes; every integral type eight bytes; float and double the double's
    bits; a decimal its text, which shows its scale)."""
    name = check_key_type(type_name)
    if name in ("string", "binary"):
        return "bytes"
    if name in _INTEGRAL:
        return "integral"
    if name in _FLOATING:
        return "floating point"
    decimal = _DECIMAL.match(name)
    if decimal is not None:
        return f"decimal of scale {decimal.group(2)}"
    return name


def same_key_encoding(types: Sequence[str], others: Sequence[str]) -> bool:
    """True if key columns of ``types`` and of ``others`` give equal values equal keys
    (column by column, see :func:`key_encoding`)."""
    return [key_encoding(t) for t in types] == [key_encoding(t) for t in others]


def recorded_key_types(properties: Mapping[str, str]) -> list[str] | None:
    """The key column types a checkpoint's ``properties`` record (None: not recorded,
    e.g. by a checkpoint written before they were, or outside Spark)."""
    recorded = properties.get(KEY_TYPES_PROPERTY)
    if recorded is None:
        return None
    types = json.loads(recorded)
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ValueError(f"checkpoint property {KEY_TYPES_PROPERTY} is not a list of type "
                         f"names: {recorded!r}")
    return types


def key_json(key: bytes, type_names: Sequence[str] | None) -> list[Any] | None:
    """The key's column values as JSON data, or None when ``type_names`` is None or does
    not decode ``key``: ``binary`` as ``0x`` hex, ``decimal`` as its text, ``date`` and
    ``timestamp`` as ISO 8601, non-finite doubles as ``NaN``, ``Infinity``, ``-Infinity``."""
    if type_names is None:
        return None
    try:
        return [_json_value(v) for v in decode_key(key, type_names)]
    except (KeyTypeError, ValueError, ArithmeticError, OverflowError):
        return None


def key_text(key: bytes, type_names: Sequence[str] | None) -> str | None:
    """The key as text: one column's value as is (``user-7``, ``42``, ``2025-06-01``),
    several as a JSON array (``["eu",7]``); None as for :func:`key_json`."""
    values = key_json(key, type_names)
    if values is None:
        return None
    if len(values) == 1:
        value = values[0]
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(values, separators=(",", ":"))


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def encode_key_part(value: Any, type_name: str, column: str = "key") -> bytes:
    """The encoding of one key column's value (see the module docstring)."""
    name = check_key_type(type_name, column)
    if value is None:
        raise NullKeyError(f"key column {column!r} is null: a null key has no state")
    try:
        if name == "string":
            return str(value).encode()
        if name == "binary":
            return bytes(value)
        if name == "boolean":
            return b"\x01" if bool(value) else b"\x00"
        if name in _INTEGRAL:
            return _EIGHT.pack(int(value))
        if name in _FLOATING:
            return double_key_bytes(value, single=name == "float")
        if name == "date":
            return _EIGHT.pack((_as_date(value) - _EPOCH_DATE).days)
        if name == "timestamp":
            return _EIGHT.pack(_instant_micros(value))
        if name == "timestamp_ntz":
            return _EIGHT.pack(_wall_clock_micros(value))
        match = _DECIMAL.match(name)
        assert match is not None
        scale = int(match.group(2))
        quantized = Decimal(value).quantize(Decimal(1).scaleb(-scale))
        if quantized.is_zero():
            quantized = abs(quantized)  # Spark never writes "-0.00"
        return f"{quantized:f}".encode()
    except (TypeError, ValueError, ArithmeticError, struct.error) as exc:
        raise KeyTypeError(
            f"value {value!r} of key column {column!r} is not a {name}: {exc}") from exc


def encode_key(values: Sequence[Any], type_names: Sequence[str],
               columns: Sequence[str] | None = None) -> bytes:
    """The state key of a row with key column ``values`` of Spark types ``type_names``."""
    if len(values) != len(type_names):
        raise ValueError(f"{len(values)} key values for {len(type_names)} key columns")
    names = list(columns) if columns is not None else [f"key[{i}]" for i in range(len(values))]
    parts = [encode_key_part(v, t, c) for v, t, c in zip(values, type_names, names, strict=True)]
    if len(parts) == 1:
        return parts[0]
    return b"".join(_LENGTH.pack(len(p)) + p for p in parts)


def decode_key(data: bytes, type_names: Sequence[str]) -> tuple[Any, ...]:
    """The key column values of a state key (inverse of :func:`encode_key`)."""
    names = [check_key_type(t) for t in type_names]
    if len(names) == 1:
        return (_decode_part(data, names[0]),)
    values, position = [], 0
    for name in names:
        if position + 4 > len(data):
            raise KeyTypeError(f"key {data!r} ends before its column of type {name}")
        (length,) = _LENGTH.unpack_from(data, position)
        position += 4
        values.append(_decode_part(data[position:position + length], name))
        position += length
    if position != len(data):
        raise KeyTypeError(f"key {data!r} has {len(data) - position} bytes after its columns")
    return tuple(values)


def _decode_part(data: bytes, name: str) -> Any:
    if name == "string":
        return data.decode()
    if name == "binary":
        return bytes(data)
    if name == "boolean":
        return data == b"\x01"
    if name.startswith("decimal"):
        return Decimal(data.decode())
    if len(data) != 8:
        raise KeyTypeError(f"a {name} key part has 8 bytes, found {len(data)}")
    if name in _FLOATING:
        return _DOUBLE.unpack(data)[0]
    (number,) = _EIGHT.unpack(data)
    if name == "date":
        return _EPOCH_DATE + dt.timedelta(days=number)
    if name == "timestamp":
        return _EPOCH + dt.timedelta(microseconds=number)
    if name == "timestamp_ntz":
        return _EPOCH_NAIVE + dt.timedelta(microseconds=number)
    return number


def double_key_bytes(value: Any, single: bool = False) -> bytes:
    """The key encoding of a floating-point value (see the module docstring); ``single``:
    of a ``float`` column, so the value is first rounded to single precision (the
    Python float ``1.1`` stands for the float column value ``1.1``, whose double is
    ``1.100000023841858``)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    number = float(value)
    if number != number:
        return _NAN_BITS
    if single:
        (number,) = _SINGLE.unpack(_SINGLE.pack(number))
    return _DOUBLE.pack(number + 0.0)  # -0.0 + 0.0 is 0.0


def _as_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    raise TypeError(f"expected a date, got {type(value).__name__}")


def _instant_micros(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("a timestamp key needs a time zone (naive datetimes are "
                             "timestamp_ntz keys)")
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise TypeError(f"expected a datetime, got {type(value).__name__}")


def _wall_clock_micros(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        delta = value.replace(tzinfo=None) - _EPOCH_NAIVE
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise TypeError(f"expected a datetime, got {type(value).__name__}")
