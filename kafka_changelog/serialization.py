"""Avro encoding with the schema files in ``schemas/`` (the files are the contract)."""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro

HEADER_SCHEMA = "kc.schema"
"""The record header naming the Avro schema of a record's value, ``<schema>/<version>``
(e.g. ``change_batch/1``): every record the library writes with a value carries it."""


def schemas_dir() -> Path:
    """Where the ``*.avsc`` files are: inside an installed wheel, else the source tree."""
    packaged = Path(str(resources.files("kafka_changelog"))) / "schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "schemas"


@cache
def load_schema(name: str) -> Any:
    """The parsed schema ``schemas/<name>.avsc``."""
    path = schemas_dir() / f"{name}.avsc"
    if not path.is_file():
        raise FileNotFoundError(f"Avro schema {name!r} not found at {path}")
    return fastavro.parse_schema(json.loads(path.read_text()))


def encode(schema_name: str, record: dict[str, Any]) -> bytes:
    """Schemaless Avro binary of ``record`` (the reader must know the schema)."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, load_schema(schema_name), record)
    return buffer.getvalue()


def decode(schema_name: str, data: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode`; raises on truncated or trailing bytes."""
    buffer = io.BytesIO(data)
    record = fastavro.schemaless_reader(buffer, load_schema(schema_name), None)
    if buffer.tell() != len(data):
        raise ValueError(
            f"{len(data) - buffer.tell()} trailing bytes after a {schema_name} record"
        )
    if not isinstance(record, dict):
        raise ValueError(f"{schema_name} did not decode to a record")
    return record
