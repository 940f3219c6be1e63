"""State values decoded by the serializer names recorded with each state's registration.

``utf8``, ``int64``, ``float64``, ``json`` and Avro decode (as the serializers of
:mod:`kafka_changelog.state.schema.serializers` write them; Avro values resolved to the
state's latest recorded schema); ``bytes``, Avro states of 0.2.0 (their schema is
not recorded) and bytes that do not decode stay raw and are shown as base64 in JSON
and hex in tables.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ..state.schema.avro_names import is_avro_name
from ..state.schema.evolution import read_avro_value
from ..state.schema.ops import StateMeta
from ..state.schema.serializers import FLOAT64, INT64, JSON, UTF8, Serializer
from ..state.schema.ttl import split_serializer_name
from ..state.tables.protocol import Entry

_KNOWN: dict[str, Serializer[Any]] = {s.name: s for s in (UTF8, INT64, FLOAT64, JSON)}


class Raw:
    """Bytes that could not be decoded (unknown serializer, or not what it wrote)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Raw) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"Raw({self.data!r})"


def decode_value(serializer: str | None, data: bytes) -> Any:
    """The value ``serializer`` wrote as ``data``, or :class:`Raw` when it cannot tell
    (an Avro value resolved to the state's latest schema)."""
    if serializer is not None and is_avro_name(serializer):
        try:
            return read_avro_value(serializer, data)
        except ValueError:  # 0.2.0's unrecorded schema, or not its bytes
            return Raw(data)
    known = _KNOWN.get(serializer or "")
    if known is None:
        return Raw(data)
    try:
        return known.deserialize(data)
    except Exception:  # struct.error, UnicodeDecodeError, JSONDecodeError: not its bytes
        return Raw(data)


def decode_entry(meta: StateMeta, entry: Entry) -> Any:
    """A state's entry for one key: a value, a list of values, or a dict of map entries
    (keys decoded with the map key serializer). A TTL'd state's entry is given without
    its expiries (see :func:`~kafka_changelog.state.schema.ttl.live_entry`)."""
    serializer, _ = split_serializer_name(meta.value_serializer)
    if isinstance(entry, bytes):
        return decode_value(serializer, entry)
    if isinstance(entry, list):
        return [decode_value(serializer, item) for item in entry]
    return {decode_value(meta.map_key_serializer, k): decode_value(serializer, v)
            for k, v in sorted(entry.items())}


def to_json(value: Any) -> Any:
    """A decoded entry as JSON data: raw bytes become ``{"base64": ...}``, map keys text."""
    if isinstance(value, Raw):
        return {"base64": base64.b64encode(value.data).decode()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {_key_text(k): to_json(v) for k, v in value.items()}
    return value


def raw_json(entry: Entry) -> Any:
    """An entry's stored bytes as base64 (lists stay lists; maps become [key, value] pairs)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()
    if isinstance(entry, bytes):
        return b64(entry)
    if isinstance(entry, list):
        return [b64(item) for item in entry]
    return [[b64(k), b64(v)] for k, v in sorted(entry.items())]


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, Raw):
        return "0x" + key.data.hex()
    return json.dumps(key)


def to_text(value: Any) -> str:
    """A decoded entry on one line: JSON, with raw bytes as ``0x...`` hex."""
    if isinstance(value, Raw):
        return "0x" + value.data.hex()
    if isinstance(value, list):
        return "[" + ", ".join(to_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(_key_text(k))}: {to_text(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value)
