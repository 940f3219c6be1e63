"""A state key from the command line: typed values encoded as ``kafka_changelog.keys`` does.

``--key-type`` names the Spark type of each key column (comma-separated for a
composite key: ``string,bigint``; ``decimal(10,2)`` keeps its comma); ``--key``
gives the values (comma-separated for a composite key, or ``--key`` repeated).
``--key-hex`` gives the key's bytes as they are stored.
"""

from __future__ import annotations

import binascii
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ..keys import (
    KEY_TYPES_PROPERTY,
    KeyTypeError,
    check_key_type,
    encode_key,
    key_json,
    recorded_key_types,
    same_key_encoding,
)
from .options import CliError

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def split_types(text: str) -> list[str]:
    """``"string,decimal(10,2)"`` -> ``["string", "decimal(10,2)"]`` (commas in parentheses
    or angle brackets belong to the type, as in ``map<string,int>``)."""
    types: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "," and depth == 0:
            types.append("".join(current).strip())
            current = []
            continue
        depth += {"(": 1, ")": -1, "<": 1, ">": -1}.get(char, 0)
        current.append(char)
    types.append("".join(current).strip())
    if any(not t for t in types):
        raise CliError(f"--key-type {text!r} has an empty type")
    return types


def parse_value(text: str, type_name: str, column: str) -> Any:
    """The Python value of one key column given as text (see :func:`encode_cli_key`)."""
    name = check_key_type(type_name, column)
    try:
        if name == "string":
            return text
        if name == "binary":
            return binascii.unhexlify(text.removeprefix("0x"))
        if name == "boolean":
            lowered = text.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError("expected true or false")
            return lowered in _TRUE
        if name in ("date",):
            return dt.date.fromisoformat(text)
        if name in ("timestamp", "timestamp_ntz"):
            return _timestamp(text, name)
        if name.startswith("decimal"):
            return Decimal(text)
        if name in ("float", "double"):
            return float(text)  # also nan, inf, -inf
        return int(text)
    except (ValueError, InvalidOperation, binascii.Error) as exc:
        raise CliError(f"key {column} {text!r} is not a {name}: {exc}") from exc


def _timestamp(text: str, name: str) -> Any:
    try:
        return int(text)  # microseconds since the epoch, as stored
    except ValueError:
        pass
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if name == "timestamp" and moment.tzinfo is None:
        raise ValueError("a timestamp key needs a time zone, e.g. 2025-06-01T12:00:00Z")
    return moment


def encode_cli_key(values: list[str] | None, key_type: str, key_hex: str | None) -> bytes:
    """The stored bytes of the key the options describe.

    Text per type: ``string`` as is; ``binary`` hex; ``boolean`` true/false;
    integral types decimal digits; ``float`` and ``double`` a number (``nan``, ``inf``
    too); ``decimal(p,s)`` a decimal number; ``date``
    ``YYYY-MM-DD``; ``timestamp`` ISO 8601 with a zone (or epoch microseconds);
    ``timestamp_ntz`` ISO 8601 without one.
    """
    if key_hex is not None:
        if values:
            raise CliError("give either --key or --key-hex, not both")
        try:
            return binascii.unhexlify(key_hex.removeprefix("0x"))
        except binascii.Error as exc:
            raise CliError(f"--key-hex {key_hex!r} is not hex: {exc}") from exc
    if not values:
        raise CliError("give the key: --key VALUE (or --key-hex HEX)")
    types = split_types(key_type)
    parts = values[0].split(",") if len(values) == 1 and len(types) > 1 else list(values)
    if len(parts) != len(types):
        raise CliError(
            f"--key-type {key_type} has {len(types)} column(s) but {len(parts)} key value(s) "
            f"were given: {parts}")
    columns = [f"column {i}" if len(types) > 1 else "value" for i in range(len(types))]
    parsed = [parse_value(p, t, c) for p, t, c in zip(parts, types, columns, strict=True)]
    try:
        return encode_key(parsed, types, columns)
    except KeyTypeError as exc:
        raise CliError(str(exc)) from exc


def key_types_to_use(given: str | None, properties: Mapping[str, str], where: str
                     ) -> list[str] | None:
    """The key column types to encode ``--key`` with: ``given`` (``--key-type``), else the
    ones the checkpoint recorded (property ``spark.key_types``), else ``string``.

    A ``given`` type whose keys have other bytes than the recorded one would never find
    the state: refused, naming both (``where`` names the checkpoint). None: neither
    given nor recorded (the key is shown as hex only when given as ``--key-hex``).
    """
    try:
        recorded = recorded_key_types(properties)
    except ValueError as exc:
        raise CliError(f"{where}: {exc}") from exc
    if given is None:
        return recorded
    types = split_types(given)
    try:
        for i, type_name in enumerate(types):
            check_key_type(type_name, f"column {i}" if len(types) > 1 else "value")
    except KeyTypeError as exc:
        raise CliError(str(exc)) from exc
    if recorded is not None and not same_key_encoding(types, recorded):
        raise CliError(
            f"--key-type {given}: {where} records its key column type(s) as {recorded} "
            f"(property {KEY_TYPES_PROPERTY}); keys of type(s) {types} have other bytes and "
            "would not find their state. Omit --key-type to use the recorded type(s)")
    return types


def describe_key(key: bytes, types: Sequence[str] | None) -> str:
    """``"user-7" (string; 0x757365722d37)``; the hex alone if the types are unknown or
    do not decode the bytes."""
    values = key_json(key, types)
    if values is None or types is None:
        return f"0x{key.hex()}"
    shown = json.dumps(values[0] if len(values) == 1 else values)
    return f"{shown} ({', '.join(types)}; 0x{key.hex()})"
