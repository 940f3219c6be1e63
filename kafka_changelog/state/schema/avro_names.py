"""How an Avro state's serializer name records its schemas, and the single-object header.

A name is ``avro:`` and a JSON array of schemas (each compact, keys sorted: equal schemas
give equal text); kafka-changelog 0.2.0 wrote ``avro:`` and 16 hexadecimal digits of the
SHA-256 of the schema instead, without recording the schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import fastavro.schema

AVRO_PREFIX = "avro:"
#: Avro's single-object encoding: this marker, then the 8-byte CRC-64-AVRO fingerprint of
#: the writer schema's parsing canonical form (little endian), then the binary value.
SINGLE_OBJECT_MARKER = b"\xc3\x01"
HEADER_SIZE = 10
_LEGACY_DIGITS = 16


def schema_data(schema: Any) -> Any:
    """An Avro schema as JSON data: given as data, as JSON text, or as a type's name
    (``"long"``)."""
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except json.JSONDecodeError:
        return schema  # a name, such as "long" or a named type's


def schema_json(schema: Any) -> str:
    """``schema`` as compact JSON with sorted keys (parsed to check it is valid Avro)."""
    data = schema_data(schema)
    fastavro.schema.parse_schema(data)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def schema_fingerprint(text: str) -> bytes:
    """The 8 bytes of the single-object header naming schema ``text``."""
    canonical = fastavro.schema.to_parsing_canonical_form(json.loads(text))
    return bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


def avro_name(schemas: Sequence[str]) -> str:
    """The serializer name recording ``schemas`` (compact JSON texts), the reader last."""
    return AVRO_PREFIX + "[" + ",".join(schemas) + "]"


def legacy_avro_name(text: str) -> str:
    """The name kafka-changelog 0.2.0 gave a serializer of schema ``text``."""
    return AVRO_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:_LEGACY_DIGITS]


def is_avro_name(name: str) -> bool:
    """Whether serializer ``name`` is an Avro serializer's (either form)."""
    return name.startswith(AVRO_PREFIX)


def is_legacy_avro_name(name: str) -> bool:
    """Whether ``name`` is 0.2.0's (a fingerprint, no schema recorded)."""
    return is_avro_name(name) and not name.startswith(AVRO_PREFIX + "[")


def avro_schemas(name: str) -> tuple[str, ...]:
    """The schemas an Avro serializer name records (none for a 0.2.0 name), reader last."""
    if not name.startswith(AVRO_PREFIX + "["):
        return ()
    return tuple(json.dumps(s, sort_keys=True, separators=(",", ":"))
                 for s in json.loads(name[len(AVRO_PREFIX):]))


def avro_label(name: str) -> str:
    """A short form of an Avro serializer name for messages: the reader schema's full
    name and how many schemas are recorded."""
    schemas = avro_schemas(name)
    if not schemas:
        return name
    reader = json.loads(schemas[-1])
    title = reader.get("name", reader.get("type")) if isinstance(reader, dict) else reader
    namespace = reader.get("namespace") if isinstance(reader, dict) else None
    full = f"{namespace}.{title}" if namespace and "." not in str(title) else str(title)
    return f"avro:{full} ({len(schemas)} schema{'s' if len(schemas) != 1 else ''})"
