"""Serializers between Python values and the bytes the changelog stores. No pickle.

A serializer has a ``name`` that is recorded with the state's registration (meta
change and snapshot) and checked on restore, so state written as JSON is never
read back as, say, an integer.
"""

from __future__ import annotations

import io
import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import fastavro

from .avro_names import (
    HEADER_SIZE,
    SINGLE_OBJECT_MARKER,
    avro_name,
    legacy_avro_name,
    schema_fingerprint,
    schema_json,
)

T = TypeVar("T")


class Serializer(ABC, Generic[T]):
    """Turns values of one type into bytes and back."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Stable identifier recorded with the state and compared on restore."""

    @abstractmethod
    def serialize(self, value: T) -> bytes:
        """The bytes of ``value``."""

    @abstractmethod
    def deserialize(self, data: bytes) -> T:
        """Inverse of :meth:`serialize`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class BytesSerializer(Serializer[bytes]):
    """Bytes as they are."""

    name = "bytes"

    def serialize(self, value: bytes) -> bytes:
        if not isinstance(value, bytes):
            raise TypeError(f"bytes serializer got {type(value).__name__}")
        return value

    def deserialize(self, data: bytes) -> bytes:
        return data


class StringSerializer(Serializer[str]):
    """UTF-8 text."""

    name = "utf8"

    def serialize(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"utf8 serializer got {type(value).__name__}")
        return value.encode()

    def deserialize(self, data: bytes) -> str:
        return data.decode()


class IntSerializer(Serializer[int]):
    """Signed 64-bit integers, big endian."""

    name = "int64"
    _FORMAT = struct.Struct(">q")

    def serialize(self, value: int) -> bytes:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"int64 serializer got {type(value).__name__}")
        return self._FORMAT.pack(value)

    def deserialize(self, data: bytes) -> int:
        (value,) = self._FORMAT.unpack(data)
        return int(value)


class FloatSerializer(Serializer[float]):
    """IEEE 754 doubles, big endian."""

    name = "float64"
    _FORMAT = struct.Struct(">d")

    def serialize(self, value: float) -> bytes:
        return self._FORMAT.pack(float(value))

    def deserialize(self, data: bytes) -> float:
        (value,) = self._FORMAT.unpack(data)
        return float(value)


class JsonSerializer(Serializer[Any]):
    """JSON of plain types (dict, list, str, int, float, bool, None), canonical form."""

    name = "json"

    def serialize(self, value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    def deserialize(self, data: bytes) -> Any:
        return json.loads(data)


class AvroSerializer(Serializer[Any]):
    """Avro binary of one schema, in Avro's single-object encoding: each value starts
    with the marker ``C3 01`` and the 8-byte CRC-64-AVRO fingerprint of its writer
    schema, so values written with older schemas of the state stay readable.

    The name is ``avro:`` followed by a JSON array of schemas: the writer schemas the
    state has had (each once, in the order they were registered), the reader schema
    last; :meth:`with_writers` gives this serializer reading every one of them,
    resolved to its own schema (Avro's schema resolution). The registration of a state
    records the name, so the writer schemas are stored once per state, never per value.

    A state written by kafka-changelog 0.2.0 (name ``avro:`` and a 16-digit hexadecimal
    fingerprint, values without the single-object header) is read and written in that
    form with the same schema: its schema was not recorded, so it cannot evolve.
    """

    def __init__(self, schema: dict[str, Any] | str,
                 writers: Sequence[dict[str, Any] | str] = (), legacy: bool = False) -> None:
        self._schema_json = schema_json(schema)
        self._schema = fastavro.parse_schema(json.loads(self._schema_json))
        self._header = SINGLE_OBJECT_MARKER + schema_fingerprint(self._schema_json)
        self._legacy = legacy
        texts = [t for t in dict.fromkeys(schema_json(w) for w in writers)
                 if t != self._schema_json]
        self._writer_jsons = (*texts, self._schema_json)
        self._writers = {schema_fingerprint(t): fastavro.parse_schema(json.loads(t))
                         for t in texts}
        self._name = (legacy_avro_name(self._schema_json) if legacy
                      else avro_name(self._writer_jsons))

    @property
    def name(self) -> str:
        return self._name

    @property
    def schema(self) -> str:
        """The reader (and writer) schema as compact JSON."""
        return self._schema_json

    @property
    def writer_schemas(self) -> tuple[str, ...]:
        """Every schema values may have been written with, this serializer's last."""
        return self._writer_jsons

    def with_writers(self, writers: Sequence[str], legacy: bool = False) -> AvroSerializer:
        """This serializer, also reading values written with ``writers`` (legacy: in the
        headerless form of 0.2.0)."""
        return AvroSerializer(self._schema_json, writers, legacy)

    def serialize(self, value: Any) -> bytes:
        buffer = io.BytesIO()
        if not self._legacy:
            buffer.write(self._header)
        fastavro.schemaless_writer(buffer, self._schema, value)
        return buffer.getvalue()

    def deserialize(self, data: bytes) -> Any:
        if self._legacy:
            return fastavro.schemaless_reader(io.BytesIO(data), self._schema, None)
        header = data[:HEADER_SIZE]
        buffer = io.BytesIO(data)
        buffer.seek(HEADER_SIZE)
        if header == self._header:
            return fastavro.schemaless_reader(buffer, self._schema, None)
        writer = self._writers.get(header[2:]) if header[:2] == SINGLE_OBJECT_MARKER else None
        if writer is None:
            raise ValueError(
                f"Avro value of {len(data)} bytes starts with {header.hex()}: not the "
                "single-object header of any of the state's writer schemas")
        return fastavro.schemaless_reader(buffer, writer, self._schema)


BYTES = BytesSerializer()
UTF8 = StringSerializer()
INT64 = IntSerializer()
FLOAT64 = FloatSerializer()
JSON = JsonSerializer()
