"""Which declarations of a state may follow which: the rules of state schema evolution.

A state's registration (:class:`~kafka_changelog.state.schema.ops.StateMeta`) records its kind
and serializer names. Two ways registrations meet:

- a user declares a state the store already knows (:func:`evolve_meta`): the kind, the
  TTL's presence and the map key serializer must stay; the value serializer must be the
  same, or both Avro with a new schema that resolves every writer schema recorded so far
  (Avro's rules, :mod:`~kafka_changelog.state.schema.avro_resolution`). The registration then
  records the writer schemas so far and the new one last;
- a restore meets registrations of the same state from several writers (other subtasks,
  older snapshots) (:func:`merge_metas`): they must agree but for their Avro writer
  schemas, which are united. Every Avro value names its writer schema in its header, so
  key groups written before and after a schema change may be mixed freely.

Anything else raises :class:`~kafka_changelog.state.errors.StateSchemaError` naming the
state and why, before any value is read or written.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from typing import Any

from ..errors import StateSchemaError
from .avro_names import (
    avro_label,
    avro_name,
    avro_schemas,
    is_avro_name,
    is_legacy_avro_name,
    legacy_avro_name,
)
from .avro_resolution import resolution_problems
from .descriptors import StateDescriptor
from .ops import StateMeta
from .serializers import AvroSerializer, Serializer
from .ttl import split_serializer_name, ttl_serializer_name


def requested_meta(descriptor: StateDescriptor) -> StateMeta:
    """The registration ``descriptor`` asks for."""
    map_keys = descriptor.map_key_serializer
    return StateMeta(descriptor.name, descriptor.kind, descriptor.value_serializer_name(),
                     map_keys.name if map_keys is not None else None)


def evolve_meta(known: StateMeta | None, requested: StateMeta) -> StateMeta:
    """The registration a user's declaration ``requested`` makes of a state registered as
    ``known`` (None: new): ``requested`` itself, ``known`` (the same declaration, or a
    0.2.0 Avro state declared with its schema), or ``known``'s writer schemas with
    ``requested``'s new one last. Raises :class:`StateSchemaError` when ``requested``
    cannot read what ``known`` wrote."""
    if known is None or known == requested:
        return requested
    if known.kind != requested.kind:
        raise StateSchemaError(
            f"{_refusal(known, requested)}: a state's kind cannot change (give the new "
            "state another name, and drop this one)")
    if known.map_key_serializer != requested.map_key_serializer and not _same_legacy(
            known.map_key_serializer, requested.map_key_serializer):
        raise StateSchemaError(
            f"{_refusal(known, requested)}: map keys are compared as bytes, so their "
            "serializer and schema cannot change")
    was, was_ttl = split_serializer_name(known.value_serializer)
    now, _ = split_serializer_name(requested.value_serializer)
    values = _evolve_values(known, requested, was, now)
    return dataclasses.replace(
        known, value_serializer=ttl_serializer_name(values) if was_ttl else values)


def _evolve_values(known: StateMeta, requested: StateMeta, was: str, now: str) -> str:
    state = known.state
    if was == now or _same_legacy(was, now):
        return was
    if not (is_avro_name(was) and is_avro_name(now)):
        raise StateSchemaError(
            f"{_refusal(known, requested)}: a serializer of another type cannot read its "
            "values (keep the serializer, or give the new state another name)")
    (reader,) = avro_schemas(now)[-1:]
    if is_legacy_avro_name(was):
        raise StateSchemaError(
            f"state {state!r}: its values were written by kafka-changelog 0.2.0 with the "
            f"Avro schema of fingerprint {was[len('avro:'):]}, which 0.2.0 did not record, "
            f"and the declared schema {_label(now)} is another one: declare the state with "
            "its old schema, or give the new state another name")
    writers = avro_schemas(was)
    problems = [f"from schema {index + 1} of {len(writers)}: {problem}"
                for index, writer in enumerate(writers)
                for problem in resolution_problems(writer, reader)]
    if problems:
        raise StateSchemaError(
            f"state {state!r}: the declared Avro schema cannot read values its earlier "
            f"schemas wrote ({'; '.join(problems)})")
    return avro_name((*(w for w in writers if w != reader), reader))


def merge_metas(known: StateMeta, other: StateMeta) -> StateMeta:
    """One registration of a state that a restore found as ``known`` and ``other``
    (several writers): the same but for Avro writer schemas, which are united
    (``other``'s order when it has all of ``known``'s, else ``known``'s first).
    Raises :class:`StateSchemaError` otherwise."""
    if known == other:
        return known
    was, was_ttl = split_serializer_name(known.value_serializer)
    now, now_ttl = split_serializer_name(other.value_serializer)
    united = _united(was, now)
    if (known.kind != other.kind or known.map_key_serializer != other.map_key_serializer
            or was_ttl != now_ttl or united is None):
        raise StateSchemaError(_refusal(known, other))
    return dataclasses.replace(
        known, value_serializer=ttl_serializer_name(united) if was_ttl else united)


def _united(was: str, now: str) -> str | None:
    if was == now:
        return was
    ours, theirs = avro_schemas(was), avro_schemas(now)
    if not ours or not theirs:
        return None
    if set(ours) <= set(theirs):
        return now  # a later registration: its order (its reader schema last) holds
    return avro_name((*ours, *(s for s in theirs if s not in ours)))


def _refusal(known: StateMeta, requested: StateMeta) -> str:
    return (f"state {known.state!r} is registered as {describe_meta(known)} but "
            f"{describe_meta(requested)} was requested")


def _same_legacy(known: str | None, requested: str | None) -> bool:
    """Whether ``known`` is 0.2.0's name of the one schema ``requested`` records."""
    if known is None or requested is None or not is_legacy_avro_name(known):
        return False
    schemas = avro_schemas(requested)
    return len(schemas) == 1 and legacy_avro_name(schemas[0]) == known


def _label(name: str | None) -> str:
    if name is None:
        return "no serializer"
    return repr(avro_label(name)) if is_avro_name(name) else repr(name)


def describe_meta(meta: StateMeta) -> str:
    """How messages name a state's kind and serializers (Avro schemas shortened)."""
    values, with_ttl = split_serializer_name(meta.value_serializer)
    shown = avro_label(values) if is_avro_name(values) else values
    if with_ttl:
        shown = ttl_serializer_name(shown)
    text = f"{meta.kind.value} with value serializer {shown!r}"
    if meta.map_key_serializer:
        text += f" and map key serializer {_label(meta.map_key_serializer)}"
    return text


def resolved_descriptor(descriptor: StateDescriptor, meta: StateMeta) -> StateDescriptor:
    """``descriptor`` with serializers that read every value ``meta``'s writers wrote: an
    Avro serializer given the recorded writer schemas (or 0.2.0's form)."""
    values, _ = split_serializer_name(meta.value_serializer)
    value_serializer = _reading(descriptor.value_serializer, values)
    map_key_serializer = descriptor.map_key_serializer
    if map_key_serializer is not None and meta.map_key_serializer is not None:
        map_key_serializer = _reading(map_key_serializer, meta.map_key_serializer)
    if (value_serializer is descriptor.value_serializer
            and map_key_serializer is descriptor.map_key_serializer):
        return descriptor
    return dataclasses.replace(descriptor, value_serializer=value_serializer,
                               map_key_serializer=map_key_serializer)


def _reading(serializer: Serializer[Any], recorded: str) -> Serializer[Any]:
    if not isinstance(serializer, AvroSerializer) or serializer.name == recorded:
        return serializer
    if is_legacy_avro_name(recorded):
        return serializer.with_writers((), legacy=True)
    return serializer.with_writers(avro_schemas(recorded))


def reading_serializer(recorded: str) -> AvroSerializer | None:
    """A serializer reading every value of an Avro state recorded as ``recorded``,
    resolved to its latest schema (None: not Avro, or 0.2.0's unrecorded schema)."""
    schemas = avro_schemas(recorded)
    if not schemas:
        return None
    return AvroSerializer(json.loads(schemas[-1]), schemas)


@functools.lru_cache(maxsize=256)
def _cached_reader(recorded: str) -> AvroSerializer | None:
    return reading_serializer(recorded)


def read_avro_value(recorded: str, data: bytes) -> Any:
    """The value an Avro state recorded as ``recorded`` holds in ``data``, resolved to
    its latest schema, as JSON data (bytes and fixed as ``{"base64": ...}``). Raises
    ``ValueError`` when ``recorded`` records no schema or ``data`` is not such a value."""
    serializer = _cached_reader(recorded)
    if serializer is None:
        raise ValueError(f"serializer {recorded!r} records no Avro schema")
    try:
        return _json_data(serializer.deserialize(data))
    except Exception as e:  # fastavro fails in many ways on bytes it did not write
        raise ValueError(f"not a value of {avro_label(recorded)}: {e}") from e


def _json_data(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _json_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_data(v) for v in value]
    return value


__all__ = [
    "describe_meta",
    "evolve_meta",
    "merge_metas",
    "read_avro_value",
    "reading_serializer",
    "requested_meta",
    "resolved_descriptor",
]
