"""Serializers between Python values and the bytes the changelog stores. No pickle.

A serializer has a ``name`` that is recorded with the state's registration (meta
change and snapshot) and checked on restore, so state written as JSON is never
read back as, say, an integer.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import fastavro

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
    """Avro binary with a given schema; the name carries the schema's fingerprint."""

    def __init__(self, schema: dict[str, Any] | str) -> None:
        parsed_json = json.loads(schema) if isinstance(schema, str) else schema
        self._schema = fastavro.parse_schema(parsed_json)
        canonical = json.dumps(parsed_json, sort_keys=True, separators=(",", ":"))
        self._name = "avro:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        return self._name

    def serialize(self, value: Any) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self._schema, value)
        return buffer.getvalue()

    def deserialize(self, data: bytes) -> Any:
        return fastavro.schemaless_reader(io.BytesIO(data), self._schema, None)


BYTES = BytesSerializer()
UTF8 = StringSerializer()
INT64 = IntSerializer()
FLOAT64 = FloatSerializer()
JSON = JsonSerializer()
